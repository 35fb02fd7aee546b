"""The GPU check: rollout, learner, log-prob and agreement figures at Qwen2.5 shapes, in one command.

    python benchmarks/gpu_check.py [--out gpu_check.json]          # a GPU machine: <= 9 minutes on one H100
    python benchmarks/gpu_check.py --smoke [--out PATH]            # the same code on CPU at toy shapes
    python benchmarks/gpu_check.py --report A.json [B.json ...] --doc docs/gpu.md [--readme README.md]   # as markdown

Needs only torch, transformers, accelerate (triton comes with CUDA torch; DeepSpeed, when importable, adds the
ZeRO-2 section). No download: the models are random-initialised from benchmarks/model_configs/qwen2.5-*.json.
Each section runs in its own process under its own time budget (``budget_s``, cut to what is left of
``total_budget_s``), so one failure (an out-of-memory error, a hang) is recorded in the JSON and the others still
run; inside a section each part is guarded the same way, and a section stopped at its budget keeps the results of
the parts it finished. This process itself never imports torch, so it holds no CUDA context beside the sections'
(the device facts in the JSON come from the sections; the versions from the installed packages' metadata).

Sections (benchmarks/gpu_check_parts.py):
- rollout: HF-backend + agent-loop generated tokens/s at batch 64 and 256 (0.5B, 1.5B; bf16 engine), the share of
  the wall time outside the engine's generate (``rollout_loop_overhead_share_*``); random models never emit a closed
  search, so every turn is an invalid action and ``rollout_searches_*`` says how many searches ran; then
  ``logp_gap_{bf16,fp32}_{max,mean}``: |engine log-prob - learner log-prob| on the sampled tokens, bf16 engine vs
  the learner's fp32 master weights under bf16 autocast, and fp32 vs fp32;
- learner: ``step.update_policy`` at 0.5B / 1.5B / 3B, one model at a time (the previous one's model and optimiser
  released first; ``*_resident_before_gib``: what is still allocated when the next is built), fp32 master weights +
  bf16 autocast, gradient checkpointing, AdamW, the frozen fp32 reference (KL 0.001, as the paper's configs; not at
  3B, whose target is the learner alone: ``*_with_reference``), micro-batch 8 x 4,096 tokens, 2 optimiser steps per
  call (LLDS acts on the second): time per optimiser step with and without LLDS (paired runs, order alternating),
  ``llds_step_overhead_ratio`` (median of the pair ratios), peak GPU memory and what stays allocated between steps
  (weights, AdamW state, reference: ``*_persistent_gib``), and the monitor's forward after the update as a share of
  the update phase (logp_old + logp_ref + update + monitor);
- zero2: the 1.5B update under DeepSpeed ZeRO-2 on one rank, with the project's configs/deepspeed/zero2.json through
  accelerate as a launched run (fp32 gradient reduction and accumulation; ``zero2_engine_*``: the settings the
  engine ran with); skipped when DeepSpeed is not importable;
- logprobs: peak memory and time of forward + backward of log-prob + entropy, fused tiles vs naive, V = 151,936,
  T = 4,096 / 8,192 / 16,384, H = 1,536, and a sweep of the CUDA tile budget at T = 16,384;
- e2e (benchmarks/gpu_check_e2e.py): the test-sized synthetic world with a dense index encoded on the device by a
  random encoder, ``train.py`` for 3 steps on the device (HF backend, that index in process), ``eval.py`` on its
  checkpoint, and the dense retriever built on the last GPU and searched from a fresh thread (``e2e_thread_*``);
- launch (benchmarks/gpu_check_launch.py): two processes on one GPU placing an in-process FAISS index each on its own
  GPU (memory taken against the plan's count), the learner's allocator with and without the launch's
  expandable_segments, a vLLM engine woken after a level-2 sleep without a weight load (refused) and what it keeps
  asleep (when vLLM is importable), and the first update's LLDS: the displacement between the old-policy pass and
  the first update's forwards, the active-token fraction and penalty, the tau that would absorb it.
Prints ``RESULT <name> <value>`` per figure and writes one JSON: device, versions, shapes, per-section status and
wall time, and every result (null with the section's error when it failed). ``--report`` renders such files, a later
file's sections replacing an earlier one's, between the markers of ``--doc`` (benchmarks/gpu_check_report.py), with
the memory plan of each learner shape beside its measured memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")
FULL = {
    "rollout_batches": [64, 256], "agreement_batch": 64, "max_turns": 2, "max_tokens_per_turn": 128,
    "rows": 16, "rows_per_mini": 8, "micro_rows": 8, "tokens_per_row": 4096,
    "reference": {"qwen2.5-0.5b": True, "qwen2.5-1.5b": True, "qwen2.5-3b": False},
    "pairs": {"qwen2.5-0.5b": 3, "qwen2.5-1.5b": 3, "qwen2.5-3b": 1},
    "vocab": 151936, "logprob_hidden": 1536, "logprob_tokens": [4096, 8192, 16384], "tile_sweep_mib": [64, 1024],
    # a 1.5B DeepSpeed start (import, process group, ZeRO-2 partitions) takes up to a few minutes; the total keeps
    # the whole check within 9 minutes: the last section (zero2) gets what the others left of it, at most its own
    "budget_s": {"rollout": 300, "learner": 190, "zero2": 240, "logprobs": 80, "e2e": 150, "launch": 150,
                 "staleness": 150},
    "total_budget_s": 540,
    "e2e_entry_timeout_s": 60,
    "staleness_steps": 4,
    "staleness_overrides": [],  # configs/tiny.yaml's step: 16 prompts x 8 responses
}
SMOKE = {
    "rollout_batches": [4, 8], "agreement_batch": 8, "max_turns": 1, "max_tokens_per_turn": 4,
    "rows": 4, "rows_per_mini": 2, "micro_rows": 2, "tokens_per_row": 32,
    "reference": {"qwen2.5-0.5b": True, "qwen2.5-1.5b": True, "qwen2.5-3b": False},
    "pairs": {"qwen2.5-0.5b": 1, "qwen2.5-1.5b": 1, "qwen2.5-3b": 1},
    "vocab": 4096, "logprob_hidden": 32, "logprob_tokens": [64, 128], "tile_sweep_mib": [1],
    "budget_s": {"rollout": 120, "learner": 120, "zero2": 300, "logprobs": 120, "e2e": 400, "launch": 240,
                 "staleness": 400},
    "total_budget_s": 900,
    "e2e_entry_timeout_s": 180,
    "staleness_steps": 2,
    "staleness_overrides": ["trainer.train_batch_size=4", "trainer.ppo_mini_batch_size=4", "rollout.n=4"],
}
# the measured sections of the H200 run took logprobs 14 s, learner 103 s, zero2 31 s, rollout 139-300 s: the
# rollout, whose figures need the most time and matter least for a first GPU contact, runs last on what is left
SECTION_ORDER = ("logprobs", "learner", "zero2", "e2e", "launch", "staleness", "rollout")
MIN_SECTION_S = 20  # a section is not started with less of the total budget left
VERSIONED = ("torch", "transformers", "accelerate", "triton", "deepspeed", "tokenizers")


def expected_results(shapes: dict) -> dict[str, list[str]]:
    """The result names each section must report (the JSON holds every one; null when its section failed)."""
    rollout = [f"rollout_{k}_{m}_b{b}" for m in MODELS[:2] for b in shapes["rollout_batches"]
               for k in ("tokens_per_s", "loop_overhead_share", "searches")]
    rollout += [f"logp_gap_{d}_{k}" for d in ("bf16", "fp32") for k in ("max", "mean", "tokens")]
    learner = [f"learner_{m}_{k}" for m in MODELS for k in (
        "resident_before_gib", "optimizer_step_s_llds_on", "optimizer_step_s_llds_off", "llds_step_overhead_ratio",
        "monitor_forward_s", "monitor_forward_share", "peak_gib", "persistent_gib", "tokens_per_micro_batch",
        "with_reference")]
    learner += ["packing_resident_before_gib", "packing_padded_token_share", "packing_update_tokens_per_s_padded",
                "packing_update_tokens_per_s_packed", "packing_packed_over_padded", "packing_logprob_max_gap"]
    zero2 = [f"zero2_{MODELS[1]}_{k}" for k in ("optimizer_step_s_llds_on", "peak_gib")]
    logprobs = [f"logprob_{k}_T{t}_{mode}" for t in shapes["logprob_tokens"] for mode in ("bf16", "autocast")
                for k in ("fused_peak_gib", "naive_peak_gib", "fused_s", "naive_s", "peak_ratio", "time_ratio")]
    t_max = max(shapes["logprob_tokens"])
    logprobs += [f"logprob_tile_{mib}mib_{k}" for mib in shapes["tile_sweep_mib"]
                 for k in ("rows", f"s_T{t_max}", f"peak_gib_T{t_max}")]
    logprobs += ["logprob_tile_rows_chosen", "logprob_tile_vocab_chosen"]
    e2e = ["e2e_gpus", "e2e_encode_devices", "e2e_train_s", "e2e_train_steps", "e2e_train_checkpoint", "e2e_eval_s",
           "e2e_eval_questions", "e2e_eval_em", "e2e_thread_encoder_device", "e2e_thread_worker_start_device",
           "e2e_thread_hits_equal"]
    launch = ["launch_llds_max_abs_displacement", "launch_llds_mean_abs_displacement", "launch_llds_tau_to_close_gate",
              "launch_llds_active_token_frac", "launch_llds_mean_penalty", "launch_llds_dtype"]
    staleness = [f"staleness_{k}" for k in ("tokens_per_s_k0", "tokens_per_s_k1", "speedup_k1_over_k0",
                                            "learner_idle_share_k0", "learner_idle_share_k1",
                                            "engine_idle_share_k0", "engine_idle_share_k1")]
    return {"rollout": rollout, "learner": learner, "zero2": zero2, "logprobs": logprobs, "e2e": e2e,
            "launch": launch, "staleness": staleness}


def package_versions() -> dict[str, str | None]:
    """Python's version and each package's, from the installed metadata (None: not installed); nothing imported."""
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def run_child(section: str, smoke: bool, out_path: Path) -> None:
    """In the section's own process: the device facts first, then the section's results (after every part, and
    whole at the end) as JSON beside ``out_path``."""
    import torch
    import gpu_check_e2e
    import gpu_check_launch
    import gpu_check_parts as parts
    import gpu_check_staleness

    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    environment_path(out_path).write_text(json.dumps(parts.device_facts(device)))
    parts.PARTIAL_RESULTS_PATH = partial_path(out_path)
    shapes = SMOKE if smoke else FULL
    sections = {**parts.SECTIONS, "e2e": gpu_check_e2e.section_e2e, "launch": gpu_check_launch.section_launch,
                "staleness": gpu_check_staleness.section_staleness}
    results = sections[section](device, shapes, smoke)
    out_path.write_text(json.dumps(results, default=float))


def environment_path(out_path: Path) -> Path:
    return out_path.with_name("environment.json")


def partial_path(out_path: Path) -> Path:
    return out_path.with_name("partial.json")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written (the child died first)
        return {}


def run_section(section: str, smoke: bool, budget_s: float) -> dict:
    """One section in a child process under ``budget_s``: {"status", "wall_s", "results", "error", "environment"};
    a child that timed out or failed still gives the results of the parts it finished."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(tmp) / "results.json"
        cmd = [sys.executable, __file__, "--child", section, "--child-out", str(out_path)] + (["--smoke"] * smoke)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s)
            status, error = "ok", None
            if proc.returncode != 0 or not out_path.exists():
                status, error = "error", f"exit {proc.returncode}: {proc.stderr[-1500:]}"
        except subprocess.TimeoutExpired as err:
            tail = (err.stderr or b"")[-1500:]
            status, error = "timeout", (f"over its {budget_s:.0f} s budget; stderr tail: "
                                        f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}")
        wall = time.perf_counter() - t0
        results = read_json(out_path) if status == "ok" else read_json(partial_path(out_path))
        environment = read_json(environment_path(out_path))
    part_errors = {k: v for k, v in results.items() if k.endswith("_error")}
    if status == "ok" and part_errors:
        status = "partial"
    errors = ([error] if error else []) + [f"{k}: {v}" for k, v in part_errors.items()]
    return {"status": status, "wall_s": wall, "results": results, "error": "; ".join(errors) or None,
            "environment": environment}


def _sources(paths: list[str]) -> list[tuple[str, dict]]:
    return [(p, json.loads(Path(p).read_text())) for p in paths]


def report_block(paths: list[str], doc: str) -> str:
    """The markdown block of benchmarks/gpu_check_report.py from the JSON files ``paths``, in order."""
    import gpu_check_report
    import paper_cell_cost

    configs = {m: json.loads((HERE / "model_configs" / f"{m}.json").read_text()) for m in MODELS}
    return gpu_check_report.render_block(_sources(paths), configs, doc, paper_cell_cost.paper_facts(HERE.parent))


def readme_cost_lines(paths: list[str]) -> list[str]:
    """The README's cost paragraph from the JSON files ``paths`` (benchmarks/paper_cell_cost.py)."""
    import gpu_check_report
    import paper_cell_cost

    estimate = gpu_check_report.cost_estimate(_sources(paths), paper_cell_cost.paper_facts(HERE.parent))
    return paper_cell_cost.readme_lines(estimate) if estimate else ["**Cost**: no learner figures measured yet."]


def write_report(paths: list[str], doc: str, readme: str | None = None) -> None:
    """:func:`report_block` written between the gpu-check markers of ``doc``; with ``readme``, the cost paragraph
    between its paper-cost markers."""
    import gpu_check_report
    import paper_cell_cost

    block = report_block(paths, doc)
    Path(doc).write_text(gpu_check_report.replace_block(Path(doc).read_text(), block))
    print(f"wrote the gpu-check block of {doc} from {', '.join(paths)}")
    if readme:
        command = f"python benchmarks/gpu_check.py --report {' '.join(paths)} --doc {doc} --readme {readme}"
        Path(readme).write_text(paper_cell_cost.replace_readme_block(Path(readme).read_text(),
                                                                     readme_cost_lines(paths), command))
        print(f"wrote the cost paragraph of {readme}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, toy shapes (what tests/test_gpu_check.py runs)")
    ap.add_argument("--out", default="gpu_check.json", help="the JSON written at the end")
    ap.add_argument("--sections", default=",".join(SECTION_ORDER), help=f"comma list of {SECTION_ORDER}")
    ap.add_argument("--report", nargs="+", default=[], metavar="JSON",
                    help="render these JSON files (later sections override earlier ones) into --doc; runs nothing")
    ap.add_argument("--doc", default="docs/gpu.md", help="with --report: the markdown file whose block is replaced")
    ap.add_argument("--readme", help="with --report: also replace this README's paper-cost paragraph")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(args.child, args.smoke, Path(args.child_out))
        return
    if args.report:
        write_report(args.report, args.doc, args.readme)
        return
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTION_ORDER))
    if unknown:
        print(f"gpu_check: unknown section(s) {unknown}; choose from {SECTION_ORDER}", file=sys.stderr)
        sys.exit(2)
    shapes = SMOKE if args.smoke else FULL
    t_start = time.perf_counter()
    report = {"smoke": args.smoke, "device": None, "cuda": None, "gpu_memory_gib": None, "cpu_count": os.cpu_count(),
              "versions": package_versions(), "models": list(MODELS), "shapes": shapes, "sections": {},
              "results": {}}
    print(f"versions {report['versions']}", flush=True)
    expected = expected_results(shapes)
    for section in sections:
        left = shapes["total_budget_s"] - (time.perf_counter() - t_start)
        budget = min(shapes["budget_s"][section], left)
        if budget < MIN_SECTION_S:
            res = {"status": "skipped", "wall_s": 0.0, "results": {}, "environment": {},
                   "error": f"{left:.0f} s left of the total budget of {shapes['total_budget_s']} s"}
        else:
            res = run_section(section, args.smoke, budget)
        if report["device"] is None and res["environment"]:
            report.update(res["environment"])
            print(f"device {report['device']}", flush=True)
        report["sections"][section] = {"status": res["status"], "wall_s": res["wall_s"], "budget_s": budget,
                                       "error": res["error"]}
        skipped = res["results"].get("zero2_skipped")
        if skipped:
            report["sections"][section].update(status="skipped", error=skipped)
        for name in expected[section]:
            report["results"][name] = res["results"].get(name)
        report["results"].update({k: v for k, v in res["results"].items() if k not in report["results"]})
        print(f"section {section}: {report['sections'][section]['status']} in {res['wall_s']:.1f} s"
              + (f"  ({report['sections'][section]['error'][:300]})" if report['sections'][section]['error'] else ""),
              flush=True)
        for name in expected[section]:
            value = report["results"][name]
            print(f"RESULT {name} {'null' if value is None else (f'{value:.6g}' if isinstance(value, float) else value)}",
                  flush=True)
    report["wall_s"] = time.perf_counter() - t_start
    Path(args.out).write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
