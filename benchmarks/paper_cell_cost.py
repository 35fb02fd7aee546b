"""What a paper cell costs on 8 GPUs, estimated from the GPU check's measurements: the arithmetic and every
assumption, rendered into docs/gpu.md's gpu-check block and the README's cost block by
``python benchmarks/gpu_check.py --report ... --doc docs/gpu.md --readme README.md``.

Measured (the GPU check, one H200): the learner's optimiser step on Qwen2.5-3B (forward + backward + AdamW over a
micro-batch of ``tokens_per_micro_batch`` tokens, LLDS on), a forward-only log-prob pass over the check's whole batch
(the monitor's, ``rows x tokens_per_row`` tokens), and the HF backend's generation rate (1.5B, the largest batch).
From the paper configs (``configs/paper/base.yaml``): trajectories per step (prompts x responses), steps,
``rollout.max_total_length`` and ``eval_every``; the seven benchmarks' sizes from ``searchr1_lld.data.flashrag``.

Assumed, not measured:
- per GPU and rollout step the learner sees its share of the step's trajectories x L tokens (prompt, generated and
  retrieved), in one update at the measured rate and three forward-only passes at the measured forward rate (the old
  policy's log-probs, the reference's, the monitor's); L is not known before a run: the table brackets it between
  :data:`TRAJECTORY_TOKENS` (the largest is the cap, ``rollout.max_total_length``);
- an H100 updates as fast as the H200 (the same bf16 compute; the H200's faster memory serves decoding more than the
  update), ZeRO-2's gradient exchange over 8 GPUs is not counted, and a 7B cell costs the 3B figures x the ratio of
  parameters (:data:`PARAMS`);
- rollout: no vLLM engine has run on a GPU, so its rate is unknown; the HF backend's measured rate gives the time per
  100 generated tokens a trajectory, an upper bound that vLLM should undercut;
- evaluation is counted in trajectories against a training step's (one greedy response a question, up to
  ``eval.max_turns`` turns against training's ``rollout.max_turns``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

PARAMS = {"3B": 3.09e9, "7B": 7.62e9}  # Qwen2.5's parameter counts (docs/memory.md)
TRAJECTORY_TOKENS = (1024, 2048, 4096)  # L: tokens of one trajectory, the last the paper configs' cap
FORWARD_PASSES = 3  # forward-only log-prob passes per trajectory and step: old policy, reference, monitor
GPUS = 8
LEARNER_MODEL, ROLLOUT_MODEL = "qwen2.5-3b", "qwen2.5-1.5b"
SAMPLE = 1000  # the evaluation sample the table prices (a fixed sample of held-out questions per evaluation)


def rates(res: Mapping[str, Any], shapes: Mapping[str, Any]) -> dict[str, float | None]:
    """Tokens per second per GPU: ``update`` (forward + backward + optimiser), ``forward`` (log-probs, no gradient)
    and ``generate`` (the HF backend); None where the check has no figure."""
    step = res.get(f"learner_{LEARNER_MODEL}_optimizer_step_s_llds_on")
    tokens = res.get(f"learner_{LEARNER_MODEL}_tokens_per_micro_batch")
    forward = res.get(f"learner_{LEARNER_MODEL}_monitor_forward_s")
    batch = max(shapes.get("rollout_batches") or [0])
    return {"update": tokens / step if step and tokens else None,
            "forward": shapes["rows"] * shapes["tokens_per_row"] / forward if forward else None,
            "generate": res.get(f"rollout_tokens_per_s_{ROLLOUT_MODEL}_b{batch}")}


def learner_step_s(tokens_per_gpu: float, update: float, forward: float) -> float:
    """One rollout step's learner time on one GPU: an update and :data:`FORWARD_PASSES` forward passes."""
    return tokens_per_gpu / update + FORWARD_PASSES * tokens_per_gpu / forward


def estimate(res: Mapping[str, Any], shapes: Mapping[str, Any], paper: Mapping[str, Any],
             eval_questions: int) -> dict[str, Any] | None:
    """The estimate's figures (None when the check has no learner figures). ``paper``: the paper configs'
    ``trajectories`` per step, ``steps``, ``eval_every``, ``max_total_length``; ``eval_questions``: the seven
    benchmarks' questions."""
    r = rates(res, shapes)
    if not (r["update"] and r["forward"]):
        return None
    per_gpu = paper["trajectories"] / GPUS
    scale = PARAMS["7B"] / PARAMS["3B"]
    cells = []
    for length in sorted({min(t, paper["max_total_length"]) for t in TRAJECTORY_TOKENS}):
        step = learner_step_s(per_gpu * length, r["update"], r["forward"])
        hours = step * paper["steps"] / 3600
        cells.append({"tokens": length, "step_s": step, "hours_3b": hours, "hours_7b": hours * scale})
    evaluations = math.ceil(paper["steps"] / paper["eval_every"]) if paper["eval_every"] else 0
    return {"rates": r, "per_gpu": per_gpu, "cells": cells, "steps": paper["steps"],
            "generate_s_per_100": per_gpu * 100 / r["generate"] if r["generate"] else None,
            "final_eval_steps": eval_questions / paper["trajectories"],
            "evaluations": evaluations, "full_eval_steps": evaluations * eval_questions / paper["trajectories"],
            "sample_eval_steps": evaluations * SAMPLE / paper["trajectories"]}


def _h(x: float) -> str:
    return f"{x:,.0f}"


def table_lines(e: Mapping[str, Any]) -> list[str]:
    """The estimate as docs/gpu.md prints it."""
    r, cells = e["rates"], e["cells"]
    head = ["a paper cell, 8 GPUs", *(f"L = {c['tokens']:,} tokens" for c in cells)]
    rows = [["learner s / rollout step", *(f"{c['step_s']:.0f}" for c in cells)],
            [f"3B: learner hours / cell ({e['steps']:,} steps)", *(f"{c['hours_3b']:.0f}" for c in cells)],
            ["3B: learner GPU-hours / cell", *(_h(GPUS * c["hours_3b"]) for c in cells)],
            ["7B (x parameters): learner hours / cell", *(f"{c['hours_7b']:.0f}" for c in cells)],
            ["7B: learner GPU-hours / cell", *(_h(GPUS * c["hours_7b"]) for c in cells)]]
    lines = ["| " + " | ".join(row) + " |" for row in (head, ["---"] * len(head), *rows)]
    gen = e["generate_s_per_100"]
    return [*lines, "",
            f"Rates: update {r['update']:,.0f} and forward {r['forward']:,.0f} tokens/s on one GPU (3B); "
            f"{e['per_gpu']:.0f} trajectories a GPU and step. Rollout: "
            + (f"{gen:.0f} s a step per 100 generated tokens a trajectory at the HF backend's measured "
               f"{r['generate']:,.0f} tokens/s (1.5B), an upper bound: vLLM's rate on a GPU is not measured."
               if gen else "no rollout figure.")
            + f" Evaluation, in training steps' worth of rollouts: the seven benchmarks once "
            f"{e['final_eval_steps']:.1f}; all seven at each of {e['evaluations']} evaluations during training "
            f"{e['full_eval_steps']:.0f}; a fixed sample of {SAMPLE:,} questions at each "
            f"{e['sample_eval_steps']:.1f}."]


def readme_lines(e: Mapping[str, Any]) -> list[str]:
    """The README's cost paragraph."""
    lo, mid, hi = e["cells"][0], e["cells"][len(e["cells"]) // 2], e["cells"][-1]
    gen = e["generate_s_per_100"]
    rollout = f" (the HF backend: {gen:.0f} s a step per 100 generated tokens a trajectory)" if gen else ""
    return [f"**Cost, estimated** from the GPU check's update and forward rates on one H200 (basis and assumptions: "
            f"[docs/gpu.md](docs/gpu.md#the-gpu-check)): the learner of a 3B cell takes {lo['step_s']:.0f}-"
            f"{hi['step_s']:.0f} s a step for {lo['tokens']:,}-{hi['tokens']:,} tokens a trajectory, "
            f"{lo['hours_3b']:.0f}-{hi['hours_3b']:.0f} h for the {e['steps']:,} steps on 8 GPUs "
            f"({_h(GPUS * mid['hours_3b'])} GPU-hours at {mid['tokens']:,} tokens; a 7B cell "
            f"{PARAMS['7B'] / PARAMS['3B']:.1f}x that). The rollout comes on top and has no vLLM figure yet{rollout}. "
            f"The final evaluation of the seven benchmarks costs {e['final_eval_steps']:.0f} training steps' worth of "
            f"rollouts; all seven at each of the {e['evaluations']} evaluations during training would cost "
            f"{e['full_eval_steps']:.0f}, a fixed sample of {SAMPLE:,} held-out questions "
            f"{e['sample_eval_steps']:.0f}."]


README_BEGIN = "<!-- paper-cost:begin"
README_END = "<!-- paper-cost:end -->"


def paper_facts(repo: Path) -> tuple[dict[str, Any], int]:
    """The paper configs' shapes (``configs/paper/base.yaml``) and the seven benchmarks' questions, as
    :func:`estimate` takes them."""
    from searchr1_lld.config import load_config  # deferred: the report path only (neither imports torch)
    from searchr1_lld.data.flashrag import EXPECTED_EVAL_COUNTS

    cfg = load_config(repo / "configs" / "paper" / "base.yaml")
    return ({"trajectories": cfg.trainer.train_batch_size * cfg.rollout.n, "steps": cfg.trainer.total_steps,
             "eval_every": cfg.trainer.eval_every, "max_total_length": cfg.rollout.max_total_length},
            sum(EXPECTED_EVAL_COUNTS.values()))


def replace_readme_block(text: str, lines: list[str], command: str) -> str:
    """``text`` with its paper-cost block replaced by ``lines`` under a marker naming ``command`` (ValueError when
    the markers are missing)."""
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"no '{README_BEGIN} ... -->' ... '{README_END}' markers in the README")
    block = "\n".join([f"{README_BEGIN} ({command}) -->", *lines, README_END])
    return text[:start] + block + text[end + len(README_END):]
