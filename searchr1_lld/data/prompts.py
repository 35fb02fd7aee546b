"""The text protocol of a Search-R1 episode: the prompt, the observation block and the invalid-action message.

Prompt templates (``data.prompt_template``):
- ``search-r1``: Search-R1's own instruction, kept verbatim as data in ``configs/prompts/search-r1.txt`` (the text
  of ``make_prefix(template_type="base")`` in Search-R1's ``scripts/data_process/nq_search.py``, with the question
  placeholder ``{question}``; source and commit in ``configs/prompts/SOURCES.md``). The authors' released
  checkpoints were trained on exactly this text; every paper and ablation config uses it.
- ``tiny``: the project's shorter instruction for the synthetic world. The tiny policy is warm-started on it and
  its tokenizer is trained on it (docs/configs.md says why it is kept).

Chat template (``data.chat_template``), applied around the rendered text as one user turn with the generation
prompt appended:
- ``auto``: when the tokenizer has a chat template, else the plain text (Search-R1's dataset code does this, so
  Qwen2.5 *base* models see the chat template too);
- ``always``: the chat template, an error if the tokenizer has none;
- ``never``: the plain text.
The question is normalised as Search-R1 prepares it (stripped, ``?`` appended when missing).

Observation (Search-R1's ``_passages2string`` and ``execute_predictions``)::

    block = "".join(f"Doc {i}(Title: {title}) {text}\\n" for i, doc)   # title = first line of contents, as is
    obs   = f"\\n\\n<information>{block.strip()}</information>\\n\\n"

Invalid action (neither a closed search nor a closed answer): :data:`INVALID_ACTION_MESSAGE`, verbatim from
Search-R1's ``execute_predictions``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAG_TOKENS = [THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, INFO_OPEN, INFO_CLOSE, ANSWER_OPEN, ANSWER_CLOSE]
STOP_STRINGS = [SEARCH_CLOSE, ANSWER_CLOSE]

PROMPT_DIR = Path(__file__).resolve().parents[2] / "configs" / "prompts"
TEMPLATES = ("search-r1", "tiny")
CHAT_MODES = ("auto", "always", "never")
QUESTION_SLOT = "{question}"

# The project's instruction for the synthetic world (template "tiny").
INSTRUCTION = (
    "Answer the question below. Think step by step inside <think> and </think> whenever you receive new "
    "information. If you are missing knowledge, query the search engine with <search> your query </search>; "
    "the best matching documents come back between <information> and </information>. You may search several "
    "times. When no more knowledge is needed, give only the final answer inside <answer> and </answer>, with no "
    "explanation, for example <answer> Paris </answer>."
)

# Search-R1's corrective message after an invalid action, verbatim (search_r1/llm_agent/generation.py).
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)

_template_cache: dict[str, str] = {}


def normalize_question(question: str) -> str:
    """Strip whitespace and make sure the question ends with a question mark (as Search-R1 prepares data)."""
    q = question.strip()
    if not q:
        raise ValueError("empty question")
    if not q.endswith("?"):
        q += "?"
    return q


def template_text(template: str) -> str:
    """The raw template with its ``{question}`` slot (read once from ``configs/prompts/<template>.txt``)."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; expected one of {list(TEMPLATES)}")
    if template == "tiny":
        return f"{INSTRUCTION} Question: {QUESTION_SLOT}\n"
    text = _template_cache.get(template)
    if text is None:
        path = PROMPT_DIR / f"{template}.txt"
        if not path.is_file():
            raise FileNotFoundError(f"prompt template file {path} is missing (template {template!r})")
        text = path.read_text(encoding="utf-8")
        if text.count(QUESTION_SLOT) != 1:
            raise ValueError(f"{path} must contain the slot {QUESTION_SLOT} exactly once")
        _template_cache[template] = text
    return text


def render_text(question: str, template: str = "tiny") -> str:
    """The plain prompt text: the template with the normalised question in its slot."""
    return template_text(template).replace(QUESTION_SLOT, normalize_question(question))


def uses_chat_template(tokenizer: Any, chat_template: str) -> bool:
    """Whether ``chat_template`` mode renders through the tokenizer's chat template (rules in the module docstring)."""
    if chat_template not in CHAT_MODES:
        raise ValueError(f"unknown chat_template mode {chat_template!r}; expected one of {list(CHAT_MODES)}")
    has = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "always" and not has:
        raise ValueError("data.chat_template=always but the tokenizer has no chat template")
    return has and chat_template != "never"


def render_prompt(question: str, template: str = "tiny", tokenizer: Any = None, chat_template: str = "never") -> str:
    """The full prompt text for ``question``: :func:`render_text`, wrapped in the chat template when
    :func:`uses_chat_template` says so (one user turn, generation prompt appended)."""
    text = render_text(question, template)
    if uses_chat_template(tokenizer, chat_template):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def doc_title_text(contents: str) -> tuple[str, str]:
    """Split a corpus row's contents as Search-R1 does: (first line, the remaining lines joined by newlines)."""
    title, _, text = contents.partition("\n")
    return title, text


def format_observation(docs: list[dict]) -> str:
    """The observation block appended after a search (Search-R1's format, module docstring).

    ``docs``: hits ``{"contents": "\\"Title\\"\\ntext", ...}`` best first ->
    ``\\n\\n<information>Doc 1(Title: "Title") text\\nDoc 2(Title: ...) ...</information>\\n\\n``.
    """
    block = ""
    for i, doc in enumerate(docs, start=1):
        title, text = doc_title_text(doc["contents"])
        block += f"Doc {i}(Title: {title}) {text}\n"
    return f"\n\n{INFO_OPEN}{block.strip()}{INFO_CLOSE}\n\n"
