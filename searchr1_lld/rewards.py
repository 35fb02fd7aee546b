"""Answer extraction and QA metrics (SQuAD normalisation).

normalize(s) = squeeze_spaces(remove_articles(remove_punctuation(lower(s))))
EM(pred, golds)     = 1 if normalize(pred) == normalize(g) for some gold g
sub-EM(pred, golds) = 1 if normalize(g) is a substring of normalize(pred) for some gold g
F1(pred, golds)     = max over golds of the token-level F1 between normalised token bags

Only generated text is ever scored: callers pass the *response* (generated tokens, never the prompt), and the
answer is the content of the last ``<answer> .. </answer>`` in it.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_char_span(response: str) -> tuple[int, int] | None:
    """Half-open character span ``(start, end)`` of the last closed ``<answer>..</answer>`` (tags included), or None.

    Pairing is the regex's: left to right, each ``<answer>`` closes at the first ``</answer>`` after it.
    """
    last = None
    for last in _ANSWER.finditer(response):
        pass
    return None if last is None else (last.start(), last.end())


def extract_answer(response: str) -> str | None:
    """Content of the last closed ``<answer>..</answer>`` in the generated response, or None."""
    span = answer_char_span(response)
    if span is None:
        return None
    return _ANSWER.fullmatch(response, *span).group(1).strip()


def _as_list(golds: str | list[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(prediction: str | None, golds: str | list[str]) -> float:
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in _as_list(golds)))


def sub_exact_match(prediction: str | None, golds: str | list[str]) -> float:
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(normalize_answer(g) in p for g in _as_list(golds) if normalize_answer(g)))


def token_f1(prediction: str | None, golds: str | list[str]) -> float:
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for g in _as_list(golds):
        gold_tokens = normalize_answer(g).split()
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision = overlap / len(pred_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def em_reward(response: str, golds: str | list[str]) -> float:
    """The training reward: EM of the last answer in the generated response (0 when there is none)."""
    return exact_match(extract_answer(response), golds)

