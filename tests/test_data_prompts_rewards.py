"""Prompt templates (tiny; chat-template modes) and the EM / F1 rewards of searchr1_lld on hand-written cases."""

from __future__ import annotations

import pytest

from searchr1_lld.data import prompts as P
from searchr1_lld.rewards import (
    em_reward,
    exact_match,
    extract_answer,
    normalize_answer,
    sub_exact_match,
    token_f1,
)

# ---------------------------------------------------------------------------------------------------------------
# prompts
# ---------------------------------------------------------------------------------------------------------------


def test_tiny_template() -> None:
    text = P.render_prompt("  who founded Velmora Works ", "tiny")
    assert text == P.INSTRUCTION + " Question: who founded Velmora Works?\n"
    for tag in P.TAG_TOKENS:
        if tag not in (P.INFO_OPEN, P.INFO_CLOSE):
            assert tag in P.INSTRUCTION
    with pytest.raises(ValueError):
        P.render_prompt("   ", "tiny")
    with pytest.raises(ValueError, match="unknown prompt template"):
        P.render_prompt("q", "base")
    with pytest.raises(ValueError, match="unknown chat_template mode"):
        P.render_prompt("q", "tiny", None, "chat")


class _ChatTokenizer:
    """Minimal stand-in with a chat template (as an Instruct model's tokenizer has one)."""

    chat_template = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        assert [m["role"] for m in messages] == ["user"]
        return self.chat_template.format(content=messages[0]["content"])


def test_chat_template_modes() -> None:
    wrapped = ("<|im_start|>user\n" + P.INSTRUCTION + " Question: who is it?\n<|im_end|>\n<|im_start|>assistant\n")
    assert P.render_prompt("who is it", "tiny", _ChatTokenizer(), "auto") == wrapped
    assert P.render_prompt("who is it", "tiny", _ChatTokenizer(), "always") == wrapped
    assert P.render_prompt("who is it", "tiny", _ChatTokenizer(), "never") == P.render_text("who is it", "tiny")
    # no tokenizer / no chat template: auto falls back to the plain text, always is an error
    assert P.render_prompt("who is it", "tiny", None, "auto") == P.render_text("who is it", "tiny")
    with pytest.raises(ValueError, match="no chat template"):
        P.render_prompt("who is it", "tiny", None, "always")


def test_chat_template_with_a_real_tokenizer(tiny_tokenizer) -> None:
    tiny_tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                                    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    text = P.render_prompt("who is it", "tiny", tiny_tokenizer, "auto")
    assert text == "<|user|>" + P.INSTRUCTION + " Question: who is it?\n<|assistant|>"


# ---------------------------------------------------------------------------------------------------------------
# rewards
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("The Eiffel Tower!", "eiffel tower"),
    ("  an   apple, a pear ", "apple pear"),
    ("Theatre", "theatre"),  # "the" only as a whole word
    ("U.S.A.", "usa"),
])
def test_normalize(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_cases() -> None:
    assert exact_match("the Sel River", ["Sel River"]) == 1.0  # articles
    assert exact_match("Sel River.", "sel river") == 1.0  # punctuation, case, a bare string gold
    assert exact_match("Sel", ["Sel River", "Sel"]) == 1.0  # any of several golds
    assert exact_match("Sel Rivers", ["Sel River"]) == 0.0
    assert exact_match(None, ["x"]) == 0.0  # no answer
    assert exact_match("", ["x"]) == 0.0


def test_sub_em_and_f1() -> None:
    assert sub_exact_match("it is the Sel River I think", ["Sel River"]) == 1.0
    assert sub_exact_match("Sel", ["Sel River"]) == 0.0
    assert token_f1("Sel River", ["Sel"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert token_f1("Kudan", ["Dunmere", "Kudan"]) == 1.0
    assert token_f1("a", ["the"]) == 0.0  # both normalise to nothing
    assert token_f1(None, ["x"]) == 0.0


def test_answer_extraction() -> None:
    assert extract_answer("<think>x</think><answer> 1873 </answer>") == "1873"
    # several answers in the response: the last closed one counts
    assert extract_answer("<answer> 1870 </answer> no wait <answer>1873</answer>") == "1873"
    assert extract_answer("<answer> unclosed") is None
    assert extract_answer("no tags at all") is None


def test_answer_inside_the_prompt_only_scores_zero() -> None:
    """The instruction's example '<answer> Paris </answer>' must never count: only the response is scored."""
    prompt = P.render_prompt("What is the capital of France?", "tiny")
    assert extract_answer(prompt) == "Paris"  # it IS in the prompt ...
    response = "<think> I do not know. </think>"
    assert em_reward(response, ["Paris"]) == 0.0  # ... but the reward reads the generated response only
    assert em_reward(response + "<answer> Paris </answer>", ["Paris"]) == 1.0


def test_em_reward_on_a_full_response() -> None:
    response = ("<think> search </think><search> Velmora </search>\n\n<information>Doc 1(Title: V) founded in 1901"
                "\n</information>\n\n<think> found </think><answer> 1901 </answer>")
    assert em_reward(response, ["1901"]) == 1.0
    assert em_reward(response, ["1902"]) == 0.0

