"""benchmarks/gpu_check.py --smoke: the GPU check's code runs end to end on CPU at toy shapes and its JSON holds
every figure the GPU run reports; its own process never imports torch (no CUDA context beside the sections'), and
the learner section holds one model at a time. ``--report``: docs/gpu.md's block is what the report renders from the
committed JSON files, and the renderer merges and prints hand-made reports as it says."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import test_world_dir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402
import gpu_check_report  # noqa: E402
import paper_cell_cost  # noqa: E402
from searchr1_lld.preflight import memory_plan as mp  # noqa: E402

CPU_NULL = ("_peak_gib", "_persistent_gib")  # no allocator statistics on CPU: present, null
# runs gpu_check.py as the main program, then says whether that process (not its sections') imported torch
# docs/gpu.md's figures: this command, run in the repository, writes its gpu-check block from the committed files
REPORT_COMMAND = "python benchmarks/gpu_check.py --report docs/gpu_check/h200.json --doc docs/gpu.md --readme README.md"
AS_MAIN = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
           "print('parent imported torch:', 'torch' in sys.modules)")


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", AS_MAIN, str(REPO / "benchmarks" / "gpu_check.py"), "--smoke",
                           "--sections", "logprobs,learner,rollout", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_the_checks_own_process_never_imports_torch(smoke_report):
    """torch (and so CUDA) only in the sections' processes: the device facts come from them."""
    report, stdout = smoke_report
    assert "parent imported torch: False" in stdout
    assert report["device"].startswith("cpu") and report["cpu_count"] >= 1


def test_the_learner_section_holds_one_model_at_a_time(smoke_report):
    """Before each model is built, what is allocated (on CPU: the bytes of every tensor the garbage collector sees)
    is back at the section's baseline, the figure before the first model. A model and optimiser kept from the
    previous turn would add their tensors: at least the toy 0.5B's weights, 140 KB at smoke shapes."""
    r = smoke_report[0]["results"]
    baseline = r[f"learner_{gpu_check.MODELS[0]}_resident_before_gib"]
    for key in [f"learner_{m}_resident_before_gib" for m in gpu_check.MODELS[1:]] + ["packing_resident_before_gib"]:
        assert abs(r[key] - baseline) * 2**30 < 4096, (key, r)


def test_smoke_json_has_every_field(smoke_report):
    report, stdout = smoke_report
    assert report["smoke"] is True and report["device"].startswith("cpu")
    for mod in ("torch", "transformers", "accelerate", "triton", "deepspeed"):
        assert mod in report["versions"]
    assert report["versions"]["torch"] and report["versions"]["transformers"]
    expected = gpu_check.expected_results(gpu_check.SMOKE)
    for section in ("logprobs", "learner", "rollout"):
        assert report["sections"][section]["status"] == "ok", report["sections"][section]
        for name in expected[section]:
            assert name in report["results"], name
            assert f"RESULT {name} " in stdout, name
            value = report["results"][name]
            if name.endswith(CPU_NULL):
                assert value is None, name
            else:
                assert isinstance(value, (int, float)) and math.isfinite(value), (name, value)


def test_smoke_figures_are_sane(smoke_report):
    r = smoke_report[0]["results"]
    for m in gpu_check.MODELS:
        assert r[f"learner_{m}_optimizer_step_s_llds_on"] > 0 and r[f"learner_{m}_llds_step_overhead_ratio"] > 0
        assert 0 < r[f"learner_{m}_monitor_forward_share"] < 1
    for m in gpu_check.MODELS[:2]:
        for b in gpu_check.SMOKE["rollout_batches"]:
            assert r[f"rollout_tokens_per_s_{m}_b{b}"] > 0
            assert 0 <= r[f"rollout_loop_overhead_share_{m}_b{b}"] < 1
    # fp32 engine and fp32 learner compute the same log-probs up to rounding; a bf16 engine differs more
    assert r["logp_gap_fp32_max"] < 1e-4 and r["logp_gap_fp32_tokens"] > 0
    assert r["logp_gap_bf16_mean"] > r["logp_gap_fp32_mean"]
    # uneven rows: a share of the padded forwards' positions is padding, the packed path computes the same log-probs
    assert 0 < r["packing_padded_token_share"] < 1 and r["packing_logprob_max_gap"] < 1e-4
    assert r["packing_packed_over_padded"] > 0
    assert r["logprob_tile_rows_chosen"] == 256 and r["logprob_tile_vocab_chosen"] == gpu_check.SMOKE["vocab"]


def test_unknown_section_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--smoke", "--sections", "nope"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown section" in proc.stderr


def smoke_section(section: str, tmp_path: Path, timeout_s: float) -> dict:
    """``gpu_check.py --smoke --sections <section>`` in its own process: the results of the section, which must be ok
    (DeepSpeed's CPU communication extension is built once, cached in the repository; the check's world is the
    suite's cached test world)."""
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           "TORCH_EXTENSIONS_DIR": str(REPO / ".cache" / "torch_extensions"),
           "GPU_CHECK_WORLD": str(test_world_dir())}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--smoke", "--sections", section,
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["sections"][section]["status"] == "ok", report["sections"][section]
    return report["results"]


@pytest.mark.slow
def test_smoke_zero2_section(tmp_path):
    """The ZeRO-2 section on one CPU rank (DeepSpeed builds its CPU communication extension once, cached)."""
    pytest.importorskip("deepspeed")
    r = smoke_section("zero2", tmp_path, timeout_s=900)
    assert r["zero2_qwen2.5-1.5b_optimizer_step_s_llds_on"] > 0
    # the engine ran with the project's configs/deepspeed/zero2.json and the trainer's overrides
    ds = json.loads((REPO / "configs" / "deepspeed" / "zero2.json").read_text())
    assert r["zero2_config_file"] == "configs/deepspeed/zero2.json"
    assert r["zero2_engine_zero_stage"] == ds["zero_optimization"]["stage"] == 2
    assert r["zero2_engine_reduce_bucket_size"] == ds["zero_optimization"]["reduce_bucket_size"]
    assert ds["communication_data_type"] == ds["data_types"]["grad_accum_dtype"] == "fp32"
    assert r["zero2_engine_communication_data_type"] == r["zero2_engine_grad_accum_dtype"] == "torch.float32"
    from searchr1_lld.config import Config

    assert r["zero2_engine_gradient_clipping"] == Config().trainer.grad_clip


@pytest.mark.slow
def test_smoke_e2e_section_trains_evaluates_and_searches_from_a_thread(tmp_path):
    """The end-to-end section on CPU: the world and its dense index, train.py for 3 steps, eval.py on the checkpoint,
    the dense retriever searched from a fresh thread; the whole check's budgets keep it within its 540 s."""
    r = smoke_section("e2e", tmp_path, timeout_s=600)
    assert r["e2e_train_steps"] == 3 and r["e2e_train_checkpoint"] == "step_000003" and r["e2e_train_s"] > 0
    assert r["e2e_eval_questions"] == 8 and 0 <= r["e2e_eval_em"] <= 1
    assert r["e2e_encode_devices"] == r["e2e_thread_encoder_device"] == "cpu" and r["e2e_thread_hits_equal"] is True
    assert set(gpu_check.expected_results(gpu_check.SMOKE)["e2e"]) <= set(r)
    full = gpu_check.FULL
    assert set(gpu_check.SECTION_ORDER) == set(full["budget_s"]) and full["total_budget_s"] == 540
    assert 2 * full["e2e_entry_timeout_s"] < full["budget_s"]["e2e"]  # train and eval fit the section's budget


def test_smoke_launch_section_on_cpu(tmp_path):
    """The launch section on CPU: the old-policy pass and the first update's forwards (packed, train mode, with
    gradient) give the same fp32 log-probs to the last bit, so LLDS has nothing to act on there; the parts that need
    a GPU (FAISS placement, the allocator, vLLM's sleep mode) say so instead of reporting."""
    r = smoke_section("launch", tmp_path, timeout_s=300)
    assert r["launch_llds_dtype"] == "fp32"
    for name in ("max_abs_displacement", "mean_abs_displacement", "tau_to_close_gate", "active_token_frac",
                 "mean_penalty"):
        assert r[f"launch_llds_{name}"] == 0.0, (name, r)
    assert r["launch_index_skipped"] == "needs a GPU and a GPU build of FAISS"
    assert r["launch_allocator_skipped"] == "needs a GPU"
    assert r["launch_engine_skipped"] in ("sleep mode is CUDA-only",) or r["launch_engine_skipped"].startswith("vllm")
    assert not [k for k in r if k.endswith("_error")], r


# --------------------------------------------------------------------------------------------------------------------
# --report: docs/gpu.md from the committed JSON files
# --------------------------------------------------------------------------------------------------------------------


def test_docs_gpu_block_is_what_the_report_renders_from_the_committed_json(monkeypatch):
    """The figures of docs/gpu.md cannot drift from docs/gpu_check/*.json: its block equals the rendered one."""
    monkeypatch.chdir(REPO)
    args = REPORT_COMMAND.split()
    paths, doc_path = args[args.index("--report") + 1: args.index("--doc")], args[args.index("--doc") + 1]
    doc = (REPO / "docs" / "gpu.md").read_text()
    assert REPORT_COMMAND in doc, "docs/gpu.md names the command that writes its block"
    assert gpu_check_report.block_of(doc) == gpu_check.report_block(paths, doc_path)
    readme = (REPO / "README.md").read_text()
    assert f"{paper_cell_cost.README_BEGIN} ({REPORT_COMMAND}) -->" in readme, "the README's cost paragraph names it"
    assert "\n".join(gpu_check.readme_cost_lines(paths)) in readme


def test_report_command_rewrites_the_block_in_place(tmp_path):
    """The documented command on a copy of docs/gpu.md and the JSON files: the document comes back unchanged."""
    (tmp_path / "docs" / "gpu_check").mkdir(parents=True)
    for name in ("gpu.md", "gpu_check/h200.json"):
        (tmp_path / "docs" / name).write_text((REPO / "docs" / name).read_text())
    (tmp_path / "README.md").write_text(paper_cell_cost.replace_readme_block((REPO / "README.md").read_text(),
                                                                            ["stale"], "old"))
    doc = tmp_path / "docs" / "gpu.md"
    doc.write_text(gpu_check_report.replace_block(doc.read_text(), f"{gpu_check_report.BEGIN} -->\nstale\n"
                                                                    f"{gpu_check_report.END}"))
    cmd = REPORT_COMMAND.replace("benchmarks/gpu_check.py", str(REPO / "benchmarks" / "gpu_check.py"))
    proc = subprocess.run([sys.executable, *cmd.split()[1:]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert doc.read_text() == (REPO / "docs" / "gpu.md").read_text()
    assert (tmp_path / "README.md").read_text() == (REPO / "README.md").read_text()


def hand_report(sections: dict, results: dict, **extra) -> dict:
    return {"smoke": True, "device": "cpu (test)", "cuda": None, "gpu_memory_gib": None, "cpu_count": 2,
            "versions": {"torch": "9.9"}, "shapes": gpu_check.SMOKE, "wall_s": 1.0,
            "sections": {s: {"status": st, "wall_s": w, "budget_s": 120, "error": None} for s, (st, w) in
                         sections.items()}, "results": results, **extra}


def test_renderer_on_hand_made_reports():
    """A later file's section replaces the earlier one's whole (status, wall time, results); a null figure prints
    as "-"; a section in no file prints no table."""
    m0, m1 = gpu_check.MODELS[:2]
    first = hand_report({"learner": ("ok", 5.0), "rollout": ("timeout", 120.0)}, {
        f"learner_{m0}_optimizer_step_s_llds_on": 1.5, f"learner_{m0}_optimizer_step_s_llds_off": None,
        f"learner_{m0}_with_reference": 1, f"rollout_tokens_per_s_{m0}_b4": 100.0, "logp_gap_bf16_max": 0.5})
    second = hand_report({"rollout": ("ok", 50.0)}, {f"rollout_tokens_per_s_{m1}_b4": 2000.0})
    results, origin = gpu_check_report.merge([("a.json", first), ("b.json", second)])
    assert origin["rollout"][0] == "b.json" and origin["learner"][0] == "a.json"
    assert results == {f"learner_{m0}_optimizer_step_s_llds_on": 1.5, f"learner_{m0}_optimizer_step_s_llds_off": None,
                       f"learner_{m0}_with_reference": 1, f"rollout_tokens_per_s_{m1}_b4": 2000.0}
    block = gpu_check_report.render_block([("a.json", first), ("b.json", second)], {}, "x.md")
    lines = block.splitlines()
    command = "python benchmarks/gpu_check.py --report a.json b.json --doc x.md"
    assert lines[0] == f"{gpu_check_report.BEGIN} ({command}) -->"
    assert lines[-1] == gpu_check_report.END
    assert "| rollout | `b.json` | ok | 50 | 120 |" in lines and "| learner | `a.json` | ok | 5 | 120 |" in lines
    assert "| 0.5B | yes | - | 1.500 | - | - | - | - | - |" in lines  # LLDS off null; no allocator on CPU
    assert "| 1.5B | 4 | 2,000 | - | - |" in lines and "| 0.5B | 4 | - | - | - |" in lines  # a's rollout replaced
    assert "| bf16 engine vs fp32 learner under bf16 autocast | - | - | - |" in lines
    assert not any("fused tiles vs naive" in line for line in lines)  # no logprobs section in either file
    assert any(line.startswith("(smoke shapes") for line in lines)  # no plan for toy models
    with pytest.raises(ValueError, match="markers"):
        gpu_check_report.replace_block("no block here", block)
    doc = f"before\n{gpu_check_report.BEGIN} -->\nold\n{gpu_check_report.END}\nafter\n"
    assert gpu_check_report.replace_block(doc, block) == f"before\n{block}\nafter\n"


def test_renderer_shows_the_end_to_end_section():
    report = hand_report({"e2e": ("ok", 80.0)}, {"e2e_gpus": 2, "e2e_encode_devices": "cuda:0", "e2e_train_steps": 3,
                                                 "e2e_train_s": 31.25, "e2e_eval_em": 0.125, "e2e_eval_s": None,
                                                 "e2e_thread_encoder_device": "cuda:1",
                                                 "e2e_thread_worker_start_device": 0, "e2e_thread_hits_equal": True})
    lines = gpu_check_report.render_block([("g.json", report)], {}, "x.md").splitlines()
    assert "| e2e | `g.json` | ok | 80 | 120 |" in lines
    for row in ("| train.py: steps | 3 |", "| train.py: s (3 steps, with start-up) | 31.2 |", "| eval.py: EM | 0.125 |",
                "| eval.py: s | - |", "| retriever built on | cuda:1 |", "| fresh thread starts on CUDA device | 0 |",
                "| fresh thread's hits equal the building thread's | True |"):
        assert row in lines, row


def test_every_result_the_check_reports_belongs_to_its_section():
    """The renderer files each figure under the section that measured it, so a section rerun alone carries all of
    its figures (a figure under no section would be dropped from the document)."""
    for shapes in (gpu_check.FULL, gpu_check.SMOKE):
        for section, names in gpu_check.expected_results(shapes).items():
            assert {gpu_check_report.section_of(n) for n in names} == {section}, section


def test_renderer_shows_the_packing_part():
    report = hand_report({"learner": ("ok", 90.0)}, {
        "packing_padded_token_share": 0.3242, "packing_resident_before_gib": 0.0625, "packing_packed_over_padded": 1.443,
        "packing_update_tokens_per_s_packed": 22042.9})
    lines = gpu_check_report.render_block([("g.json", report)], {}, "x.md").splitlines()
    for row in ("| padded rows: padding's share of the positions | 0.324 |", "| update tokens/s, padded rows | - |",
                "| update tokens/s, packed rows | 22,043 |", "| packed speed-up (padded s / packed s) | 1.44 |"):
        assert row in lines, row


def test_learner_plan_is_the_plan_without_engine_retriever_or_context():
    shape = mp.QWEN25["3b"]
    for stage, ref in ((0, True), (2, False)):
        plan = mp.learner_plan(shape, zero_stage=stage, data_parallel=1, reference=ref, micro_batch_tokens=32768)
        acts = mp.activation_bytes(shape, 32768, fused_head=True, zero_stage=stage)
        reference = 4 * shape.params if ref else 0.0
        assert plan.resident == mp.learner_bytes(shape, stage, 1) + reference
        assert plan.update == pytest.approx(plan.resident + acts)


def test_renderer_shows_the_launch_section():
    report = hand_report({"launch": ("ok", 60.0)}, {
        "launch_index_devices": "0,0", "launch_index_load_modes": "gpu:0,gpu:0", "launch_index_taken_gib": 2.31,
        "launch_llds_active_token_frac": 0.41, "launch_engine_wake_refused": True,
        "launch_llds_dtype": "bf16 autocast"})
    lines = gpu_check_report.render_block([("g.json", report)], {}, "x.md").splitlines()
    assert "| launch | `g.json` | ok | 60 | 120 |" in lines
    for row in ("| 2 processes, in-process index: devices chosen | 0,0 |",
                "| index placement: GPU memory taken, GiB | 2.31 |", "| first update: dtype | bf16 autocast |",
                "| first update: LLDS active-token fraction | 0.41 |",
                "| vLLM: level-2 wake without a weight load refused | True |",
                "| vLLM asleep: GPU memory kept, GiB | - |"):
        assert row in lines, row


def test_the_paper_cell_cost_is_the_arithmetic_its_docstring_states():
    """Hand-computed: update 32,768 tokens in 2 s (16,384/s), a forward of 16 x 4,096 tokens in 1 s (65,536/s); 80
    trajectories a step over 8 GPUs (10 each); L = 1,024: 10,240 tokens a GPU, 0.625 s update + 3 x 0.15625 s forward
    = 1.09375 s a step; the cap of 2,048 drops L = 4,096; 360 steps; HF rollout 1,000 tokens/s."""
    res = {"learner_qwen2.5-3b_optimizer_step_s_llds_on": 2.0, "learner_qwen2.5-3b_tokens_per_micro_batch": 32768,
           "learner_qwen2.5-3b_monitor_forward_s": 1.0, "rollout_tokens_per_s_qwen2.5-1.5b_b256": 1000.0}
    shapes = {"rows": 16, "tokens_per_row": 4096, "rollout_batches": [64, 256]}
    paper = {"trajectories": 80, "steps": 360, "eval_every": 100, "max_total_length": 2048}
    e = paper_cell_cost.estimate(res, shapes, paper, eval_questions=160)
    assert [c["tokens"] for c in e["cells"]] == [1024, 2048]
    assert e["cells"][0]["step_s"] == pytest.approx(1.09375) and e["cells"][1]["step_s"] == pytest.approx(2.1875)
    assert e["cells"][0]["hours_3b"] == pytest.approx(1.09375 * 360 / 3600)
    assert e["cells"][0]["hours_7b"] == pytest.approx(e["cells"][0]["hours_3b"] * 7.62 / 3.09)
    assert e["generate_s_per_100"] == pytest.approx(1.0)
    assert (e["final_eval_steps"], e["evaluations"], e["full_eval_steps"]) == (2.0, 4, 8.0)
    assert e["sample_eval_steps"] == pytest.approx(4 * paper_cell_cost.SAMPLE / 80)
    assert paper_cell_cost.estimate({}, shapes, paper, 160) is None  # no learner figures, no estimate
    assert "| 3B: learner GPU-hours / cell | 1 | 2 |" in paper_cell_cost.table_lines(e)


@pytest.mark.slow
def test_smoke_staleness_section_measures_k0_against_k1(tmp_path):
    """The staleness section on CPU: the test world's policy trained with the synchronous step and with one rollout
    worker beside the update (trainer.staleness=1), tokens trained per second and idle shares of each."""
    r = smoke_section("staleness", tmp_path, timeout_s=600)
    assert set(gpu_check.expected_results(gpu_check.SMOKE)["staleness"]) <= set(r)
    assert r["staleness_tokens_per_s_k0"] > 0 and r["staleness_tokens_per_s_k1"] > 0
    assert r["staleness_speedup_k1_over_k0"] == pytest.approx(
        r["staleness_tokens_per_s_k1"] / r["staleness_tokens_per_s_k0"])
    assert all(0 <= r[f"staleness_{side}_idle_share_k{k}"] <= 1 for side in ("learner", "engine") for k in (0, 1))


def test_the_staleness_benchmark_summarises_paired_runs_by_hand():
    """benchmarks/bench_staleness.summary: medians per label, the speed-up as the geometric mean of the per-repeat
    ratios against k0 (1.5 and 2.0: sqrt 3)."""
    import bench_staleness

    run = lambda tps, learner, engine: {"tokens_per_s": tps, "learner_idle_share": learner,  # noqa: E731
                                        "engine_idle_share": engine}
    out = bench_staleness.summary({"k0": [run(100.0, 0.4, 0.6), run(200.0, 0.2, 0.8)],
                                   "k1": [run(150.0, 0.0, 0.1), run(400.0, 0.0, 0.3)]})
    assert out["tokens_per_s_k0"] == 150.0 and out["tokens_per_s_k1"] == 275.0
    assert out["learner_idle_share_k0"] == pytest.approx(0.3) and out["engine_idle_share_k1"] == pytest.approx(0.2)
    assert out["speedup_k1_over_k0"] == pytest.approx(math.sqrt(3))
    assert "speedup_k0_over_k0" not in out
