"""Search-R1 prompt templates.

Two variants:
- ``base``: plain text instruction + question, for base models (the model continues right after it);
- ``chat``: the same instruction as a user turn rendered with the tokenizer's chat template (generation prompt
  appended), for Instruct models; falls back to ``base`` when the tokenizer has no chat template.

The instruction states the protocol the rollout enforces: reason in ``<think>..</think>``, search with
``<search> query </search>`` (results come back in ``<information>..</information>``), answer with
``<answer> .. </answer>``. It shows an example answer; that example never counts as the model's answer because
rewards read only generated tokens (see ``searchr1_lld.rewards``).
"""

from __future__ import annotations

from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAG_TOKENS = [THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, INFO_OPEN, INFO_CLOSE, ANSWER_OPEN, ANSWER_CLOSE]
STOP_STRINGS = [SEARCH_CLOSE, ANSWER_CLOSE]

INSTRUCTION = (
    "Answer the question below. Think step by step inside <think> and </think> whenever you receive new "
    "information. If you are missing knowledge, query the search engine with <search> your query </search>; "
    "the best matching documents come back between <information> and </information>. You may search several "
    "times. When no more knowledge is needed, give only the final answer inside <answer> and </answer>, with no "
    "explanation, for example <answer> Paris </answer>."
)

# Corrective message appended after an invalid action (neither a closed search nor a closed answer).
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. To search, I should put the query between <search> and </search>. "
    "To answer, I should put the final answer between <answer> and </answer>. Let me try again.\n"
)


def normalize_question(question: str) -> str:
    """Strip whitespace and make sure the question ends with a question mark (as Search-R1 prepares data)."""
    q = question.strip()
    if not q:
        raise ValueError("empty question")
    if not q.endswith("?"):
        q += "?"
    return q


def render_base(question: str) -> str:
    """Base-model prompt: instruction, then the question; the model continues on the next line."""
    return f"{INSTRUCTION} Question: {normalize_question(question)}\n"


def render_prompt(question: str, template: str = "base", tokenizer: Any = None) -> str:
    """Render the prompt text for ``question``.

    template="chat" uses ``tokenizer.apply_chat_template`` (user turn, generation prompt) when the tokenizer has a
    chat template; otherwise (or for template="base") the plain base template.
    """
    if template not in ("base", "chat"):
        raise ValueError(f"unknown prompt template {template!r}; expected 'base' or 'chat'")
    if template == "chat" and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        content = f"{INSTRUCTION} Question: {normalize_question(question)}\n"
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    return render_base(question)


def format_observation(docs: list[dict]) -> str:
    """The observation block appended after a search (DESIGN.md format).

    ``docs``: hits ``{"contents": "\\"Title\\"\\ntext", ...}`` best first ->
    ``\\n\\n<information>Doc 1(Title: T) text\\nDoc 2(Title: ...) ...\\n</information>\\n\\n``.
    """
    lines = []
    for i, doc in enumerate(docs, start=1):
        contents = doc["contents"]
        title, _, text = contents.partition("\n")
        title = title.strip().strip('"')
        lines.append(f"Doc {i}(Title: {title}) {text.strip()}")
    return f"\n\n{INFO_OPEN}" + "\n".join(lines) + f"\n{INFO_CLOSE}\n\n"
