"""Every YAML config in configs/ loads and validates; the paper grid and the ablations are complete and correct."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchr1_lld.config import load_config
from searchr1_lab.methods import lab_config, read_lab_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# accelerate / DeepSpeed launcher configs are not run configs; world configs are checked below
ALL_YAML = sorted(p for p in CONFIGS.rglob("*.y*ml") if not {"accelerate", "world"} & set(p.relative_to(CONFIGS).parts))
LAB_YAML = sorted((CONFIGS / "lab").glob("*.yaml"))  # run configs plus `world: FILE` (searchr1_lab.methods)
WORLD_YAML = sorted((CONFIGS / "world").glob("*.yaml"))


def test_there_are_configs():
    assert len(ALL_YAML) >= 24 + 12


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_config_loads_and_validates(path):
    cfg = lab_config(path, [], ".cache/world") if path in LAB_YAML else load_config(path)
    assert cfg.name and cfg.name != "default", f"{path} should set a name"


@pytest.mark.parametrize("path", WORLD_YAML, ids=lambda p: p.name)
def test_world_config_loads_and_every_run_config_names_one_that_exists(path):
    from searchr1_lld.config import resolve_repo_path
    from searchr1_lld.world import load_world_config

    load_world_config(path)
    for lab in LAB_YAML:
        named = read_lab_config(lab, [])[1]
        assert not named or resolve_repo_path(named).is_file(), f"{lab}: world {named} is missing"


def _paper():
    return {p.stem: load_config(p) for p in sorted((CONFIGS / "paper").glob("qwen*.yaml"))}


def test_paper_grid_is_complete():
    grid = _paper()
    combos = set()
    for stem, cfg in grid.items():
        assert cfg.name == stem
        llds = cfg.algorithm.llds
        method = "grpo" if not llds.enabled else ("llds-ma" if llds.ma != "off" else "llds")
        assert cfg.algorithm.method == method.replace("-", "_")
        combos.add((cfg.model.path, cfg.data.train_mix, method))
        assert stem.endswith("_" + method)
        # Search-R1's prompt for every model, through the tokenizer's chat template when it has one (Search-R1's rule)
        assert (cfg.data.prompt_template, cfg.data.chat_template) == ("search-r1", "auto")
    assert combos == {(f"Qwen/Qwen2.5-{s}{k}", mix, m) for s in ("3B", "7B") for k in ("", "-Instruct")
                      for mix in ("nq", "nq+hotpotqa") for m in ("grpo", "llds", "llds-ma")}


def test_paper_configs_carry_the_authors_run_settings():
    """The values of the authors' train_grpo_nqhot.sh + verl ppo_trainer.yaml (docs/configs.md has the table)."""
    for stem, cfg in _paper().items():
        a, r, t = cfg.algorithm, cfg.rollout, cfg.trainer
        seven_b_instruct_llds = "7b-instruct" in stem and a.llds.enabled
        assert a.llds.lam == (0.3 if seven_b_instruct_llds else 0.2), stem  # the paper's lambda for 7B-Instruct
        assert (a.llds.tau, a.llds.gate, a.llds.lam_answer, a.llds.ma_adaptive_rule) == (0.0, "action", 0.2, "code")
        assert a.llds.ma == ("adaptive" if stem.endswith("llds-ma") else "off")
        assert (a.kl_coef, a.kl_type, a.entropy_coef, a.clip_eps, a.policy_loss) == (
            0.001, "low_var_kl", 0.001, 0.2, "ppo_clip")
        assert (a.clip_low, a.clip_high, a.dual_clip, a.loss_agg_mode) == (None, None, None, "token-mean")
        assert (t.lr, t.warmup_ratio, t.lr_schedule, t.grad_clip, t.ppo_epochs) == (1e-6, 0.285, "constant", 1.0, 1)
        # 512 prompts per step; mini-batch 256 *responses* (verl's counting: 10 optimiser steps per step)
        assert (t.train_batch_size, t.ppo_mini_batch_size, t.total_steps) == (512, 256, 1005)
        assert (t.save_every, t.eval_every) == (50, 50)
        assert (r.n, r.temperature, r.top_p, r.max_turns, r.topk) == (5, 1.0, 0.95, 3, 3)
        assert (r.max_tokens_per_turn, r.max_obs_length, r.max_total_length, cfg.data.max_prompt_length) == (
            500, 500, 4096, 2048)
        assert r.backend == "vllm" and cfg.retriever.mode == "http"
        _reads_prepared_files(cfg)


PREPARED = "data/flashrag"  # where `python -m searchr1_lld.data.flashrag --out data/flashrag` writes


def _reads_prepared_files(cfg):
    """Training reads the prepared train splits of its mix, evaluation the seven benchmarks' prepared files, so no
    rank calls the hub at start; the benchmarks keep their names. Greedy (the evaluator always decodes greedily),
    the paper's 4 turns, top-3."""
    from searchr1_lld.data.flashrag import EVAL_DATASETS, TRAIN_MIXES

    assert cfg.data.source == "files"
    assert cfg.data.train_files == [f"{PREPARED}/train/{name}.jsonl" for name in TRAIN_MIXES[cfg.data.train_mix]]
    assert cfg.eval.datasets == [f"{name}={PREPARED}/test/{name}.jsonl" for name in EVAL_DATASETS]
    assert (cfg.eval.max_turns, cfg.eval.topk) == (4, 3)


# the ablation axes: file prefix -> the LLDS key it varies; base.yaml is every axis's reference point
ABLATION_AXES = {"lambda-": "lam", "gate-": "gate", "tau-": "tau", "ma-": "ma"}


def test_ablation_grid():
    """Each axis's files vary one LLDS key; with base.yaml (its reference point, never a second file of the same run)
    they cover lambda 0-0.5, the three gates, tau 0-1 and the three answer masks."""
    base = load_config(CONFIGS / "ablations" / "base.yaml")
    abl = {p.stem: load_config(p) for p in sorted((CONFIGS / "ablations").glob("*.yaml"))
           if p.stem != "base" and not p.stem.startswith("method-")}
    assert all(s.startswith(tuple(ABLATION_AXES)) for s in abl)

    def axis(prefix: str) -> list:
        key = ABLATION_AXES[prefix]
        return sorted([getattr(c.algorithm.llds, key) for s, c in abl.items() if s.startswith(prefix)]
                      + [getattr(base.algorithm.llds, key)])

    assert axis("lambda-") == [0.0, 0.05, 0.1, 0.2, 0.5]
    assert axis("gate-") == sorted(["none", "response", "action"])
    assert axis("tau-") == [0.0, 0.01, 0.1, 1.0]
    assert axis("ma-") == sorted(["off", "fixed", "adaptive"])
    for name, cfg in abl.items():  # one knob changed, the rest is the headline setting
        assert cfg.model.path == "Qwen/Qwen2.5-3B" and cfg.data.train_mix == "nq+hotpotqa"
        assert (cfg.data.prompt_template, cfg.data.chat_template) == ("search-r1", "auto")
        assert cfg.algorithm.llds.enabled and cfg.algorithm.method == "llds"
        changed = _differences(base, cfg) - {"name"}
        assert changed and changed <= {f"algorithm.llds.{ABLATION_AXES[name.split('-')[0] + '-']}",
                                       "algorithm.llds.lam_answer"}, (name, changed)
        _reads_prepared_files(cfg)


def test_the_docs_count_the_ablation_runs_as_the_files_hold_them():
    """docs/configs.md's counts: the axes' distinct runs (base.yaml included) and the method files."""
    files = sorted((CONFIGS / "ablations").glob("*.yaml"))
    axes = [p for p in files if not p.stem.startswith("method-")]
    methods = [p for p in files if p.stem.startswith("method-")]
    text = (CONFIGS.parent / "docs" / "configs.md").read_text()
    assert f"## Ablations ({len(axes)} runs on four axes, and {len(methods)} other methods)" in text
    assert f"**The other collapse fixes by name** ({len(methods)} runs" in text


def _differences(a, b) -> set[str]:
    from searchr1_lld.config import config_differences

    return set(config_differences(a, b))


def test_each_method_runs_on_the_papers_3b_cell_sharing_every_other_setting_with_llds():
    """configs/ablations/method-<name>.yaml for every preset but LLDS's own, which the axes' files already run (the
    gate arms are gate-*.yaml; llds is base.yaml, llds_ma is ma-adaptive.yaml): the same cell as the LLDS ablation
    base, differing only in the name, algorithm.method and what the preset pins."""
    from searchr1_lld.config.methods import METHODS, PINNED_KEYS

    llds = load_config(CONFIGS / "ablations" / "base.yaml")
    files = {p.stem.removeprefix("method-"): p for p in (CONFIGS / "ablations").glob("method-*.yaml")}
    assert set(files) == set(METHODS) - {"llds", "llds_ma", "llds_action", "llds_response"}
    ma = load_config(CONFIGS / "ablations" / "ma-adaptive.yaml")  # the llds_ma preset's run, under the method llds
    assert ma.algorithm.llds.ma == "adaptive" and llds.algorithm.method == "llds"
    allowed = {"name", "algorithm.method", *(f"algorithm.{k}" for k in PINNED_KEYS)}
    for name, path in files.items():
        cfg = load_config(path)
        assert cfg.algorithm.method == name and cfg.name == f"ablation-method-{name}"
        assert (cfg.model.path, cfg.data.train_mix) == ("Qwen/Qwen2.5-3B", "nq+hotpotqa")
        assert _differences(llds, cfg) <= allowed, name
    assert _differences(llds, load_config(files["gspo"])) >= {"algorithm.policy_loss", "algorithm.llds.enabled"}


def test_the_lab_runs_every_method_on_the_sandbox_with_the_llds_runs_settings(tmp_path):
    """configs/lab/methods.yaml: every preset is a lab arm; the arms' configs differ only in the method's keys."""
    from searchr1_lld.config.methods import METHODS
    from searchr1_lab.methods import check_only_llds_differs, method_config, parse_methods

    arms = parse_methods(",".join(METHODS))
    configs = [method_config(CONFIGS / "lab" / "methods.yaml", [], arm, 0, world_dir=".cache/world",
                             runs_dir=tmp_path) for arm in arms]
    check_only_llds_differs(configs)
    assert [c.algorithm.method for c in configs] == list(METHODS)


def test_eval_section_validation():
    from searchr1_lld.config import ConfigError

    assert load_config(None, ["eval.datasets=[nq,hotpotqa]"]).eval.datasets == ["nq", "hotpotqa"]
    for bad, key in (("eval.datasets=[nq,webq]", "eval.datasets"), ("eval.datasets=[nq,nq]", "eval.datasets"),
                     ("eval.batch_size=0", "eval.batch_size"), ("eval.topk=0", "eval.topk"),
                     ("eval.max_turns=0", "eval.max_turns")):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [bad])
    # the engine is a backend kind, checked when eval.py makes its plan (before any rows file is read)
    from searchr1_lld.evaluation.command import EvalOptions, resolve

    with pytest.raises(ConfigError, match=r"must be one of \['hf', 'vllm'\] \(got 'sglang'\).*eval.backend"):
        resolve(EvalOptions(out="o", datasets="nq", set=["eval.backend=sglang"]))


def test_paper_eval_config_is_the_papers_protocol():
    cfg = load_config(CONFIGS / "paper" / "eval.yaml")
    assert (cfg.data.prompt_template, cfg.data.chat_template, cfg.model.path) == ("search-r1", "auto", "")
    _reads_prepared_files(cfg)
    assert (cfg.rollout.max_tokens_per_turn, cfg.rollout.max_obs_length, cfg.rollout.max_total_length) == (
        500, 500, 4096)
