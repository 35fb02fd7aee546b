"""What one trajectory of the world's policy did, judged against the world (pure: trajectories and passages in,
flags and rates out): its format, its first query, and where its answer came from. The warm start's measurement
(:mod:`.measure`) and the lab's provenance tables (:mod:`searchr1_lab.evaluating`) read them."""

from __future__ import annotations

from searchr1_lld.rewards import normalize_answer
from searchr1_lld.world.questions import contains_phrase


def is_format_valid(traj) -> bool:
    """A trajectory follows the protocol: it ends with a closed answer and had no invalid action."""
    return traj.finish_reason == "answer" and traj.invalid_actions == 0


def first_query_names_subject(traj) -> bool:
    """The first search names the question's subject: every word of ``metadata.subject`` is in the first query."""
    if not traj.queries:
        return False
    words = set(normalize_answer(traj.queries[0]).split())
    return set(normalize_answer(traj.row["metadata"]["subject"]).split()) <= words


def answer_provenance(retrieved_ids: list[list[str]], golden_answers: list[str], prediction: str, correct: bool,
                      contents_of: dict[str, str]) -> dict[str, bool]:
    """Where one answer came from, judged from the passages retrieved in any turn (``contents_of``: doc id -> text):

    - ``gold_retrieved``: a retrieved passage contains a gold answer;
    - ``copied``: that, and the answer is right and is in such a passage (copied out of ``<information>``);
    - ``in_passages``: the answer (non-empty) is in some retrieved passage, right or wrong;
    - ``right_without_gold``: the answer is right although no retrieved passage contained a gold answer (recalled
      from training, or guessed).
    """
    passages = [contents_of[d] for d in sorted({d for turn in retrieved_ids for d in turn})]
    gold = [p for p in passages if any(contains_phrase(p, g) for g in golden_answers)]
    said = bool(prediction)
    return {"gold_retrieved": bool(gold),
            "copied": bool(gold) and correct and said and any(contains_phrase(p, prediction) for p in gold),
            "in_passages": said and any(contains_phrase(p, prediction) for p in passages),
            "right_without_gold": correct and not gold}


def provenance_rates(flags: list[dict[str, bool]]) -> dict[str, float]:
    """Rates over :func:`answer_provenance` flags of several answers: ``gold_retrieved_rate``,
    ``answer_copied_rate`` (among those that retrieved a gold passage; NaN when none did),
    ``answer_in_passages_rate`` and ``right_without_gold_rate`` (both over all answers)."""
    n = max(len(flags), 1)
    with_gold = [f for f in flags if f["gold_retrieved"]]
    return {"gold_retrieved_rate": len(with_gold) / n,
            "answer_copied_rate": sum(f["copied"] for f in with_gold) / len(with_gold) if with_gold else float("nan"),
            "answer_in_passages_rate": sum(f["in_passages"] for f in flags) / n,
            "right_without_gold_rate": sum(f["right_without_gold"] for f in flags) / n}


def summarize_trajectories(trajs: list, contents_of: dict[str, str] | None = None) -> dict[str, float]:
    """EM, format-valid rate, answer rate, mean valid searches of a list of trajectories, the share whose first query
    names the question's subject (``first_query_subject_rate``), and, with the corpus (``contents_of``: doc id ->
    contents), where the answers came from (:func:`provenance_rates`: ``gold_retrieved_rate``,
    ``answer_copied_rate``, ``answer_in_passages_rate``, ``right_without_gold_rate``).
    """
    n = max(len(trajs), 1)
    out = {
        "em": sum(t.reward for t in trajs) / n,
        "format_valid_rate": sum(is_format_valid(t) for t in trajs) / n,
        "answer_rate": sum(t.finish_reason == "answer" for t in trajs) / n,
        "mean_valid_searches": sum(t.valid_searches for t in trajs) / n,
        "first_query_subject_rate": sum(first_query_names_subject(t) for t in trajs) / n,
        "num": len(trajs),
    }
    if contents_of is not None:
        out.update(provenance_rates([answer_provenance(t.retrieved_ids, t.row["golden_answers"], t.prediction,
                                                       t.reward > 0.5, contents_of) for t in trajs]))
    return out


def pass_at_k(trajs: list) -> float:
    """Share of the rows (``traj.row["id"]``) with at least one trajectory of reward 1 among their samples: pass@k
    of k samples per row (NaN without trajectories)."""
    solved: dict[str, bool] = {}
    for t in trajs:
        solved[t.row["id"]] = solved.get(t.row["id"], False) or t.reward > 0.5
    return sum(solved.values()) / len(solved) if solved else float("nan")


def majority_answer_em(train_rows: list[dict], rows: list[dict]) -> float:
    """EM of the majority-answer baseline on ``rows``: each row answered with the most frequent first gold answer of
    the training rows of its family (``metadata["family"]``; ties: the alphabetically first), no answer for a family
    training lacks. How much a policy that guesses an answer type's usual value would score (NaN for no rows)."""
    counts: dict[str, dict[str, int]] = {}
    for r in train_rows:
        by_answer = counts.setdefault(r["metadata"]["family"], {})
        by_answer[r["golden_answers"][0]] = by_answer.get(r["golden_answers"][0], 0) + 1
    majority = {family: min(c, key=lambda a: (-c[a], a)) for family, c in counts.items()}
    if not rows:
        return float("nan")
    hits = 0
    for r in rows:
        guess = majority.get(r["metadata"]["family"])
        golds = {normalize_answer(g) for g in r["golden_answers"]}
        hits += guess is not None and normalize_answer(guess) in golds
    return hits / len(rows)
