"""The warm start measured through the real rollout: greedy and sampled EM, format-valid rate, and where the answers
came from, on the world's test split with the world's own retriever."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from searchr1_lld.world.generate import contains_phrase



def is_format_valid(traj) -> bool:
    """A trajectory follows the protocol: it ends with a closed answer and had no invalid action."""
    return traj.finish_reason == "answer" and traj.invalid_actions == 0


def first_query_names_subject(traj) -> bool:
    """The first search names the question's subject: every word of ``metadata.subject`` is in the first query."""
    from searchr1_lld.rewards import normalize_answer

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


def measure_warm_start(world_dir: str | Path, *, retriever: Any = None, limit: int = 0, sample_n: int = 1,
                       seed: int = 0, progress: bool = False, rollout_cfg: Any = None) -> dict[str, Any]:
    """Roll the world's warm-started policy out on its test split with the world's real retriever.

    Returns ``{"greedy": summary, "sampled": summary, "by_hops": {1: em, 2: em}, ...}``: greedy decoding (how the
    evaluator scores) and temperature-1 sampling (what GRPO sees). Summary fields: see ``summarize_trajectories``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from retriever.inprocess import InProcessRetriever
    from searchr1_lld.jsonl import read_jsonl
    from searchr1_lld.config import RolloutConfig
    from searchr1_lld.rollout.agent_loop import run_agent_loop
    from searchr1_lld.rollout.backends.hf import HFBackend

    world_dir = Path(world_dir)
    rows = read_jsonl(world_dir / "qa" / "test.jsonl")
    if limit:
        rows = rows[:limit]
    tokenizer = AutoTokenizer.from_pretrained(str(world_dir / "tokenizer"))
    model = AutoModelForCausalLM.from_pretrained(str(world_dir / "model"))
    model.eval()
    retriever = retriever or InProcessRetriever(world_dir / "index")
    cfg = rollout_cfg or RolloutConfig(temperature=1.0, top_p=1.0, max_turns=4, topk=3, max_tokens_per_turn=64)
    backend = HFBackend(model, tokenizer, batch_size=cfg.generation_batch_size, seed=seed)
    greedy = run_agent_loop(rows, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=cfg, n=1,
                            greedy=True, progress=progress)
    sampled = run_agent_loop(rows, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=cfg, n=sample_n,
                             greedy=False, progress=progress)
    contents_of = {p["id"]: p["contents"] for p in read_jsonl(world_dir / "corpus.jsonl")}
    by_hops: dict[str, float] = {}
    sampled_by_hops: dict[str, float] = {}
    for hops in (1, 2):
        sel = [t for t in greedy if t.row["metadata"]["hops"] == hops]
        if sel:
            by_hops[str(hops)] = sum(t.reward for t in sel) / len(sel)
        sel = [t for t in sampled if t.row["metadata"]["hops"] == hops]
        if sel:
            sampled_by_hops[str(hops)] = sum(t.reward for t in sel) / len(sel)
    return {"greedy": summarize_trajectories(greedy, contents_of), "sampled": summarize_trajectories(sampled, contents_of),
            "greedy_em_by_hops": by_hops, "sampled_em_by_hops": sampled_by_hops,
            "max_tokens_per_turn": cfg.max_tokens_per_turn, "max_turns": cfg.max_turns, "sample_n": sample_n,
            "test_questions": len(rows)}
