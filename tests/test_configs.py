"""Every YAML config in configs/ loads and validates; the paper grid and the ablations are complete and correct."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchr1_lld.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# accelerate / DeepSpeed launcher configs are not run configs
ALL_YAML = sorted(p for p in CONFIGS.rglob("*.y*ml") if "accelerate" not in p.relative_to(CONFIGS).parts)


def test_there_are_configs():
    assert len(ALL_YAML) >= 24 + 12


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_config_loads_and_validates(path):
    cfg = load_config(path)
    assert cfg.name and cfg.name != "default", f"{path} should set a name"


def _paper():
    return {p.stem: load_config(p) for p in sorted((CONFIGS / "paper").glob("qwen*.yaml"))}


def test_paper_grid_is_complete():
    grid = _paper()
    combos = set()
    for stem, cfg in grid.items():
        assert cfg.name == stem
        llds = cfg.algorithm.llds
        method = "grpo" if not llds.enabled else ("llds-ma" if llds.ma != "off" else "llds")
        combos.add((cfg.model.path, cfg.data.train_mix, method))
        assert stem.endswith("_" + method)
        instruct = cfg.model.path.endswith("-Instruct")
        assert cfg.data.prompt_template == ("chat" if instruct else "base")
    assert combos == {(f"Qwen/Qwen2.5-{s}{k}", mix, m) for s in ("3B", "7B") for k in ("", "-Instruct")
                      for mix in ("nq", "nq+hotpotqa") for m in ("grpo", "llds", "llds-ma")}


def test_paper_hyperparameters_match_design_defaults():
    for cfg in _paper().values():
        a, r, t = cfg.algorithm, cfg.rollout, cfg.trainer
        assert (a.llds.lam, a.llds.tau, a.llds.gate, a.llds.lam_answer) == (0.2, 0.0, "action", 0.2)
        assert (a.kl_coef, a.kl_type, a.entropy_coef) == (0.001, "low_var_kl", 0.0)
        assert (t.lr, t.warmup_ratio, t.train_batch_size, t.ppo_mini_batch_size, t.grad_clip) == (
            1e-6, 0.285, 512, 256, 1.0)
        assert (r.n, r.temperature, r.max_turns, r.topk, r.max_tokens_per_turn, r.max_obs_length) == (
            5, 1.0, 4, 3, 500, 500)
        assert r.backend == "vllm" and cfg.retriever.mode == "http" and cfg.retriever.topk == 3
        assert cfg.data.source == "flashrag"
        assert (cfg.eval.max_turns, cfg.eval.topk, len(cfg.eval.datasets)) == (4, 3, 7)


def test_ablation_grid():
    abl = {p.stem: load_config(p) for p in sorted((CONFIGS / "ablations").glob("*.yaml")) if p.stem != "base"}
    lams = sorted(c.algorithm.llds.lam for s, c in abl.items() if s.startswith("lambda-"))
    assert lams == [0.0, 0.05, 0.1, 0.2, 0.5]
    assert {c.algorithm.llds.gate for s, c in abl.items() if s.startswith("gate-")} == {"none", "response", "action"}
    assert {c.algorithm.llds.ma for s, c in abl.items() if s.startswith("ma-")} == {"off", "fixed", "adaptive"}
    for cfg in abl.values():  # one knob changed, the rest is the headline setting
        assert cfg.model.path == "Qwen/Qwen2.5-3B" and cfg.data.train_mix == "nq+hotpotqa"
        assert cfg.algorithm.llds.enabled


def test_eval_section_validation():
    from searchr1_lld.config import ConfigError

    assert load_config(None, ["eval.datasets=[nq,hotpotqa]"]).eval.datasets == ["nq", "hotpotqa"]
    for bad, key in (("eval.datasets=[nq,webq]", "eval.datasets"), ("eval.datasets=[]", "eval.datasets"),
                     ("eval.batch_size=0", "eval.batch_size"), ("eval.topk=0", "eval.topk"),
                     ("eval.max_turns=0", "eval.max_turns"), ("eval.backend=sglang", "eval.backend")):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [bad])
