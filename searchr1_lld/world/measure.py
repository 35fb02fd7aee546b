"""The warm start measured through the real rollout: greedy and sampled EM, format-valid rate, and where the answers
came from, on the world's test split with the world's own retriever."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from retriever.inprocess import InProcessRetriever
from searchr1_lld.config import RolloutConfig
from searchr1_lld.jsonl import read_jsonl
from searchr1_lld.protocols import Retriever
from searchr1_lld.rollout.agent_loop import run_agent_loop
from searchr1_lld.rollout.backends.hf import HFBackend
from searchr1_lld.world.scoring import summarize_trajectories


def measure_warm_start(world_dir: str | Path, *, retriever: Retriever | None = None, limit: int = 0,
                       sample_n: int = 1, seed: int = 0, progress: bool = False,
                       rollout_cfg: RolloutConfig | None = None) -> dict[str, Any]:
    """Roll the world's warm-started policy out on its test split with the world's real retriever.

    Returns ``{"greedy": summary, "sampled": summary, "by_hops": {1: em, 2: em}, ...}``: greedy decoding (how the
    evaluator scores) and temperature-1 sampling (what GRPO sees). Summary fields: see
    :func:`.scoring.summarize_trajectories`.
    """
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
