"""The GPU check's JSON files as markdown: ``python benchmarks/gpu_check.py --report A.json [B.json ...] --doc
docs/gpu.md`` writes :func:`render_block` between the markers of the document (:func:`replace_block`).

Pure: report dicts in, markdown out. Files are read in order and a section of a later file (its status, wall time
and results) replaces the same section of an earlier one, so a section rerun alone (``--sections rollout``) is
merged over the full check. Beside the learner's measured memory it prints what ``searchr1_lld.preflight.memory_plan``
predicts for the same shape (:func:`plan_rows`).
"""

from __future__ import annotations

from typing import Any

import paper_cell_cost
from searchr1_lld.preflight import memory_plan as mp

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")
SECTIONS = ("learner", "zero2", "rollout", "logprobs", "e2e", "launch")
# which section a result belongs to, by its name's prefix
PREFIXES = {"rollout": ("rollout_", "logp_gap_", "agreement_"), "learner": ("learner_", "packing_"),
            "zero2": ("zero2_",), "logprobs": ("logprob_",), "e2e": ("e2e_",), "launch": ("launch_",),
            "staleness": ("staleness_",)}
BEGIN = "<!-- gpu-check:begin"
END = "<!-- gpu-check:end -->"
GIB = 2**30


def section_of(name: str) -> str | None:
    return next((s for s, prefixes in PREFIXES.items() if name.startswith(prefixes)), None)


def merge(sources: list[tuple[str, dict]]) -> tuple[dict[str, Any], dict[str, tuple[str, dict]]]:
    """(results, {section: (path, report) it came from}): each section's results from the last file that ran it."""
    results: dict[str, Any] = {}
    origin: dict[str, tuple[str, dict]] = {}
    for path, report in sources:
        for section in report.get("sections", {}):
            origin[section] = (path, report)
            results = {k: v for k, v in results.items() if section_of(k) != section}
            results.update({k: v for k, v in report.get("results", {}).items() if section_of(k) == section})
    return results, origin


def num(value: Any, spec: str) -> str:
    """``value`` formatted; a missing figure (null: its section failed, or no allocator on CPU) as ``-``."""
    if value is None:
        return "-"
    if spec == "%":
        return f"{100 * value:.1f} %"
    return format(value, spec)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(cells) + " |" for cells in (header, ["---"] * len(header), *rows)]


def short(model: str) -> str:
    return model.removeprefix("qwen2.5-").upper()


def environment_lines(sources: list[tuple[str, dict]]) -> list[str]:
    lines = []
    for path, r in sources:
        versions = ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items() if v)
        gpu = f" ({num(r.get('gpu_memory_gib'), '.1f')} GiB)" if r.get("gpu_memory_gib") else ""
        lines.append(f"- `{path}`: {r.get('device')}{gpu}, CUDA {r.get('cuda') or '-'}, {r.get('cpu_count')} CPUs; "
                     f"{versions}; {num(r.get('wall_s'), '.0f')} s in all" + (" (smoke shapes)" * bool(r.get("smoke"))))
    return lines


def sources_table(origin: dict[str, tuple[str, dict]]) -> list[str]:
    rows = []
    for section in SECTIONS:
        if section in origin:
            path, r = origin[section]
            info = r["sections"][section]
            rows.append([section, f"`{path}`", info.get("status", "-"), num(info.get("wall_s"), ".0f"),
                         num(info.get("budget_s"), ".0f")])
    return table(["section", "from", "status", "wall s", "budget s"], rows)


def learner_table(res: dict[str, Any]) -> list[str]:
    def row(label: str, p: str, before: str) -> list[str]:
        ref = res.get(f"{p}_with_reference")
        figures = [num(res.get(f"{p}_{k}"), spec) for k, spec in (
            ("optimizer_step_s_llds_off", ".3f"), ("optimizer_step_s_llds_on", ".3f"),
            ("llds_step_overhead_ratio", ".3f"), ("peak_gib", ".2f"), ("persistent_gib", ".2f"))]
        return [label, "-" if ref is None else ("yes" if ref else "no"), *figures, before,
                num(res.get(f"{p}_monitor_forward_share"), "%")]

    rows = [row(short(m), f"learner_{m}", num(res.get(f"learner_{m}_resident_before_gib"), ".2f")) for m in MODELS]
    rows.append(row(f"{short(MODELS[1])} ZeRO-2, 1 rank", f"zero2_{MODELS[1]}", "-"))
    return table(["model", "reference", "step s, LLDS off", "step s, LLDS on", "LLDS overhead ratio", "peak GiB",
                  "persistent GiB", "resident before GiB", "monitor forward share"], rows)


def plan_rows(res: dict[str, Any], shapes: dict, model_configs: dict[str, dict]) -> list[list[str]]:
    """Per learner configuration: the plan's update peak and resident states (``memory_plan.learner_plan``) of the
    same shape beside the measured peak and persistent memory, their ratios, and the terms of the plan's resident
    figure that are not held between optimiser steps (so absent from the measured persistent figure)."""
    tokens = mp.pass_tokens(0, shapes["tokens_per_row"], shapes["micro_rows"] * shapes["tokens_per_row"])
    configs = [(short(m), f"learner_{m}", m, 0) for m in MODELS] + [
        (f"{short(MODELS[1])} ZeRO-2, 1 rank", f"zero2_{MODELS[1]}", MODELS[1], 2)]
    rows = []
    for label, p, model, stage in configs:
        shape = mp.shape_from_hf_config(model_configs[model])
        reference = res.get(f"{p}_with_reference")
        reference = bool(shapes["reference"][model] and not stage if reference is None else reference)
        plan = mp.learner_plan(shape, zero_stage=stage, data_parallel=1, reference=reference, micro_batch_tokens=tokens)
        gradients = 4 * shape.params  # fp32 gradients (ZeRO-2 on one rank: the whole partition)
        freed = f"fp32 gradients {gradients / GIB:.2f}"
        if stage:
            buckets = plan.learner - mp.learner_bytes(shape, stage, 1, mp.Buckets(reduce=0, allgather=0))
            freed += f" + buckets {buckets / GIB:.2f}"
        peak, persistent = res.get(f"{p}_peak_gib"), res.get(f"{p}_persistent_gib")
        ratio = lambda measured, planned: None if measured is None else measured * GIB / planned  # noqa: E731
        rows.append([label, num(plan.update / GIB, ".2f"), num(peak, ".2f"), num(ratio(peak, plan.update), ".2f"),
                     num(plan.resident / GIB, ".2f"), num(persistent, ".2f"),
                     num(ratio(persistent, plan.resident), ".2f"), freed])
    return rows


def plan_table(res: dict[str, Any], report: dict, model_configs: dict[str, dict]) -> list[str]:
    if report.get("smoke"):
        return ["(smoke shapes: toy models, no allocator figures; the plan describes the full models)"]
    shapes = report["shapes"]
    tokens = shapes["micro_rows"] * shapes["tokens_per_row"]
    note = (f"The plan of each shape: forward passes of {tokens:,} tokens, gradient checkpointing, the fused log-prob "
            "head, AdamW, the reference as measured; without DeepSpeed fp32 weights under bf16 autocast, with ZeRO-2 "
            "bf16 weights, fp32 master and gradients, the buckets of configs/deepspeed/zero2.json; no engine, "
            "retriever or CUDA context (peak: `update`; resident: learner states + reference).")
    return [note, ""] + table(["model", "plan peak GiB", "measured peak GiB", "measured / plan", "plan resident GiB",
                               "measured persistent GiB", "measured / plan",
                               "in the plan's resident, freed between steps (GiB)"],
                              plan_rows(res, shapes, model_configs))


def rollout_tables(res: dict[str, Any], shapes: dict) -> list[str]:
    rows = [[short(m), str(b)] + [num(res.get(f"rollout_{k}_{m}_b{b}"), spec) for k, spec in (
        ("tokens_per_s", ",.0f"), ("loop_overhead_share", "%"), ("searches", "d"))]
        for m in MODELS[:2] for b in shapes["rollout_batches"]]
    gaps = [[label, num(res.get(f"logp_gap_{d}_max"), ".3g"), num(res.get(f"logp_gap_{d}_mean"), ".3g"),
             num(res.get(f"logp_gap_{d}_tokens"), ",d")]
            for d, label in (("bf16", "bf16 engine vs fp32 learner under bf16 autocast"), ("fp32", "fp32 vs fp32"))]
    return (table(["model", "batch", "generated tokens/s", "loop overhead (outside generate)", "searches"], rows) + [""]
            + table(["engine vs learner log-prob, 0.5B", "max abs gap", "mean abs gap", "tokens"], gaps))


def logprob_tables(res: dict[str, Any], shapes: dict) -> list[str]:
    rows = [[f"{t:,}", mode] + [num(res.get(f"logprob_{k}_T{t}_{mode}"), spec) for k, spec in (
        ("fused_peak_gib", ".2f"), ("naive_peak_gib", ".2f"), ("peak_ratio", ".3f"), ("fused_s", ".3f"),
        ("naive_s", ".3f"), ("time_ratio", ".2f"))]
        for t in shapes["logprob_tokens"] for mode in ("bf16", "autocast")]
    t_max = max(shapes["logprob_tokens"])
    sweep = [[f"{mib} MiB", num(res.get(f"logprob_tile_{mib}mib_rows"), "d"),
              num(res.get(f"logprob_tile_{mib}mib_s_T{t_max}"), ".3f"),
              num(res.get(f"logprob_tile_{mib}mib_peak_gib_T{t_max}"), ".2f")] for mib in shapes["tile_sweep_mib"]]
    sweep.append(["default", num(res.get("logprob_tile_rows_chosen"), "d"), "-", "-"])
    return (table(["T", "mode", "fused peak GiB", "naive peak GiB", "fused / naive peak", "fused s", "naive s",
                   "fused / naive time"], rows) + [""]
            + table(["CUDA tile budget", f"rows x {num(res.get('logprob_tile_vocab_chosen'), ',d')}",
                     f"fused s, T = {t_max:,}", f"fused peak GiB, T = {t_max:,}"], sweep))


E2E_ROWS = (("GPUs", "e2e_gpus"), ("dense index encoded on", "e2e_encode_devices"),
            ("train.py: steps", "e2e_train_steps"), ("train.py: s (3 steps, with start-up)", "e2e_train_s"),
            ("train.py: checkpoint", "e2e_train_checkpoint"), ("eval.py: questions", "e2e_eval_questions"),
            ("eval.py: EM", "e2e_eval_em"), ("eval.py: s", "e2e_eval_s"),
            ("retriever built on", "e2e_thread_encoder_device"),
            ("fresh thread starts on CUDA device", "e2e_thread_worker_start_device"),
            ("fresh thread's hits equal the building thread's", "e2e_thread_hits_equal"))


PACKING_ROWS = (("padded rows: padding's share of the positions", "packing_padded_token_share"),
                ("update tokens/s, padded rows", "packing_update_tokens_per_s_padded"),
                ("update tokens/s, packed rows", "packing_update_tokens_per_s_packed"),
                ("packed speed-up (padded s / packed s)", "packing_packed_over_padded"),
                ("largest packed vs padded log-prob difference", "packing_logprob_max_gap"),
                ("allocated before the part, GiB", "packing_resident_before_gib"))


LAUNCH_ROWS = (("2 processes, in-process index: devices chosen", "launch_index_devices"),
               ("2 processes, in-process index: load modes", "launch_index_load_modes"),
               ("index placement: GPU memory taken, GiB", "launch_index_taken_gib"),
               ("index placement: the plan's count, GiB", "launch_index_plan_gib"),
               ("launch's allocator: expandable segments", "launch_allocator_expandable"),
               ("launch's allocator: share of freed memory back to the driver", "launch_allocator_returned_share"),
               ("default allocator: share of freed memory back to the driver",
                "launch_allocator_default_returned_share"),
               ("vLLM: level-2 wake without a weight load refused", "launch_engine_wake_refused"),
               ("vLLM asleep: GPU memory kept, GiB", "launch_engine_asleep_gib"),
               ("vLLM asleep: the plan's count, GiB", "launch_engine_plan_asleep_gib"),
               ("first update: dtype", "launch_llds_dtype"),
               ("first update: largest |logp_old - logp_new|", "launch_llds_max_abs_displacement"),
               ("first update: mean |logp_old - logp_new|", "launch_llds_mean_abs_displacement"),
               ("first update: LLDS active-token fraction", "launch_llds_active_token_frac"),
               ("first update: LLDS mean penalty", "launch_llds_mean_penalty"),
               ("tau that keeps the action gate closed", "launch_llds_tau_to_close_gate"))


def facts_table(header: str, rows: tuple[tuple[str, str], ...], res: dict[str, Any]) -> list[str]:
    """One figure per row (label, result name); ``-``: not reached."""
    def shown(value: Any) -> str:
        if isinstance(value, float):
            return num(value, ",.0f" if abs(value) >= 1000 else ".3g")
        return "-" if value is None else str(value)

    return table([header, "value"], [[label, shown(res.get(key))] for label, key in rows])


def cost_estimate(sources: list[tuple[str, dict]], paper: tuple[dict, int]) -> dict[str, Any] | None:
    """:func:`paper_cell_cost.estimate` of the merged ``sources`` (None without the learner's figures); ``paper``:
    :func:`paper_cell_cost.paper_facts`."""
    res, origin = merge(sources)
    if "learner" not in origin:
        return None
    shapes = {**origin["learner"][1]["shapes"],
              "rollout_batches": origin.get("rollout", origin["learner"])[1]["shapes"].get("rollout_batches")}
    return paper_cell_cost.estimate(res, shapes, *paper)


def render_block(sources: list[tuple[str, dict]], model_configs: dict[str, dict], doc: str,
                 paper: tuple[dict, int] | None = None) -> str:
    """The markdown block of ``sources`` ([(path as the command names it, report)], later sections overriding),
    between its markers; ``model_configs``: the HF config of each model (benchmarks/model_configs/) for the plan;
    ``paper``: the paper configs' shapes (:func:`paper_cell_cost.paper_facts`) for the cost estimate."""
    res, origin = merge(sources)
    command = f"python benchmarks/gpu_check.py --report {' '.join(p for p, _ in sources)} --doc {doc}"
    lines = [f"{BEGIN} ({command}) -->", "", *environment_lines(sources), "", *sources_table(origin), "",
             "`-`: no figure (its section did not reach it, or it is not measured there)."]
    learner = origin.get("learner") or origin.get("zero2")
    if learner:
        shapes = learner[1]["shapes"]
        lines += ["", f"**Learner: one optimiser step (micro-batch {shapes['micro_rows']} x "
                      f"{shapes['tokens_per_row']:,} tokens), memory, the monitor's share**", "", *learner_table(res),
                  "", "**Memory plan (`searchr1_lld.preflight.memory_plan.learner_plan`) against the measurement**", "",
                  *plan_table(res, learner[1], model_configs)]
    if "learner" in origin:
        lines += ["", "**Packed forwards against padded rows (0.5B, uneven trajectories, `step.update_policy`)**", "",
                  *facts_table("packing", PACKING_ROWS, res)]
    if "rollout" in origin:
        lines += ["", "**Rollout (HF backend) and the engine-vs-learner log-prob gap**", "",
                  *rollout_tables(res, origin["rollout"][1]["shapes"])]
    if "logprobs" in origin:
        shapes = origin["logprobs"][1]["shapes"]
        lines += ["", f"**Log-prob + entropy, forward + backward, V = {shapes['vocab']:,}, "
                      f"H = {shapes['logprob_hidden']:,}: fused tiles vs naive**", "", *logprob_tables(res, shapes)]
    if "e2e" in origin:
        lines += ["", "**End to end: train.py and eval.py on the device, the dense retriever from a fresh thread**", "",
                  *facts_table("end to end", E2E_ROWS, res)]
    if "launch" in origin:
        lines += ["", "**Launch: per-rank index placement, the allocator, the wake guard, the first update's LLDS**",
                  "", *facts_table("launch", LAUNCH_ROWS, res)]
    estimate = cost_estimate(sources, paper) if paper else None
    if estimate:
        lines += ["", "**A paper cell on 8 GPUs, estimated from these figures** (benchmarks/paper_cell_cost.py: the "
                      "arithmetic and its assumptions; L: tokens a trajectory, prompt, generated and retrieved)", "",
                  *paper_cell_cost.table_lines(estimate)]
    return "\n".join(lines + ["", END])


def _span(text: str) -> tuple[int, int]:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no '{BEGIN} ... -->' ... '{END}' markers in the document")
    return start, end + len(END)


def block_of(text: str) -> str:
    """The gpu-check block of ``text``, markers included."""
    start, end = _span(text)
    return text[start:end]


def replace_block(text: str, block: str) -> str:
    """``text`` with its gpu-check block (markers included) replaced by ``block``."""
    start, end = _span(text)
    return text[:start] + block + text[end:]
