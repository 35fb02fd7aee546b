"""The warm start measured through the real rollout on the world's **validation** split (never test: the test split
is scored once per run, by the trainer, and no build choice may look at it), with the world's own retriever:
greedy and sampled EM, format-valid rate, where the answers came from, EM by hop count, pass@k on the two-hop
questions and the majority-training-answer baseline that the acceptance (``build.WARM_START_ACCEPTANCE``) checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from retriever.inprocess import InProcessRetriever
from searchr1_lld.config import RolloutConfig
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.protocols import Retriever
from searchr1_lld.rollout.agent_loop import run_agent_loop
from searchr1_lld.rollout.backends.hf import HFBackend
from searchr1_lld.world.scoring import majority_answer_em, pass_at_k, summarize_trajectories

MEASURED_SPLIT = "val"


def em_by(trajs: list, key: str) -> dict[str, float]:
    """Mean reward of ``trajs`` per value of ``metadata[key]`` (e.g. ``hops``: ``"1"``, ``"2"``; ``family``), keys
    as strings in sorted order; a value without rows is left out."""
    groups: dict[str, list[float]] = {}
    for t in trajs:
        groups.setdefault(str(t.row["metadata"][key]), []).append(t.reward)
    return {value: sum(rewards) / len(rewards) for value, rewards in sorted(groups.items())}


def measure_warm_start(world_dir: str | Path, *, retriever: Retriever | None = None, limit: int = 0,
                       sample_n: int = 1, pass_k: int = 8, seed: int = 0, progress: bool = False,
                       rollout_cfg: RolloutConfig | None = None) -> dict[str, Any]:
    """Roll the world's warm-started policy out on its validation split (``qa/val.jsonl``; ``limit`` > 0: its first
    ``limit`` rows) with the world's real retriever.

    Returns ``{"split": "val", "questions", "greedy": summary, "sampled": summary, "greedy_em_by_hops",
    "sampled_em_by_hops", "greedy_em_by_family", "two_hop_pass_at_k", "pass_k", "majority_train_answer_em_by_hops",
    ...}``: greedy decoding (how the evaluator scores; by family: which kinds of question it answers), temperature-1
    sampling (what GRPO sees; ``sample_n`` per row), ``pass_k`` samples per two-hop row (the share with at least one
    right answer: whether a GRPO group there holds a reward), and the EM of answering each question with its
    family's most frequent training answer
    (:func:`.scoring.majority_answer_em`). Summary fields: see :func:`.scoring.summarize_trajectories`.
    """
    world_dir = Path(world_dir)
    rows = read_jsonl(world_dir / "qa" / f"{MEASURED_SPLIT}.jsonl")
    if limit:
        rows = rows[:limit]
    train_rows = read_jsonl(world_dir / "qa" / "train.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(str(world_dir / "tokenizer"))
    model = AutoModelForCausalLM.from_pretrained(str(world_dir / "model"))
    model.eval()
    retriever = retriever or InProcessRetriever(world_dir / "index")
    cfg = rollout_cfg or RolloutConfig(temperature=1.0, top_p=1.0, max_turns=4, topk=3, max_tokens_per_turn=64)
    backend = HFBackend(model, tokenizer, batch_size=cfg.generation_batch_size, seed=seed)

    def roll(subset: list[dict], n: int, greedy: bool) -> list:
        return run_agent_loop(subset, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=cfg, n=n,
                              greedy=greedy, progress=progress)

    greedy = roll(rows, 1, True)
    sampled = roll(rows, sample_n, False)
    two_hop = [r for r in rows if r["metadata"]["hops"] == 2]
    passes = roll(two_hop, pass_k, False) if two_hop else []
    contents_of = {p["id"]: p["contents"] for p in read_jsonl(world_dir / "corpus.jsonl")}
    majority = {str(h): majority_answer_em(train_rows, [r for r in rows if r["metadata"]["hops"] == h])
                for h in (1, 2)}
    return {"split": MEASURED_SPLIT, "questions": len(rows),
            "greedy": summarize_trajectories(greedy, contents_of), "sampled": summarize_trajectories(sampled, contents_of),
            "greedy_em_by_hops": em_by(greedy, "hops"), "sampled_em_by_hops": em_by(sampled, "hops"),
            "greedy_em_by_family": em_by(greedy, "family"),
            "two_hop_pass_at_k": pass_at_k(passes), "pass_k": pass_k,
            "majority_train_answer_em_by_hops": majority,
            "max_tokens_per_turn": cfg.max_tokens_per_turn, "max_turns": cfg.max_turns, "sample_n": sample_n}
