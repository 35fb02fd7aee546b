"""The typed config: YAML + dotted overrides, _base_ inheritance, type checks, unknown keys, impossible values."""

import pytest

from searchr1_lld.config import Config, ConfigError, load_config, parse_override, save_config
from conftest import REPO_ROOT


def _write(path, text):
    path.write_text(text)
    return path


def test_defaults_validate_and_match_design():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.algorithm.llds.lam == 0.2 and cfg.algorithm.llds.gate == "action" and cfg.algorithm.llds.tau == 0.0
    assert cfg.algorithm.kl_type == "low_var_kl" and cfg.algorithm.kl_coef == 0.001
    assert cfg.algorithm.entropy_coef == 0.0
    assert cfg.rollout.n == 5


def test_yaml_and_overrides(tmp_path):
    path = _write(
        tmp_path / "exp.yaml",
        "name: exp\nalgorithm:\n  llds:\n    lam: 0.1\n    gate: response\ntrainer:\n  total_steps: 7\n  lr: 1e-6\n",
    )
    cfg = load_config(path, ["algorithm.llds.lam=0.3", "trainer.ppo_epochs=2", "algorithm.kl_coef=0", "retriever.token=null"])
    assert cfg.name == "exp"
    assert cfg.algorithm.llds.lam == 0.3  # override beats the file
    assert cfg.algorithm.llds.gate == "response"  # file beats the default
    assert cfg.algorithm.llds.tau == 0.0  # untouched sibling keeps its default
    assert cfg.trainer.total_steps == 7 and cfg.trainer.ppo_epochs == 2
    assert cfg.trainer.lr == pytest.approx(1e-6)  # "1e-6" is a string to PyYAML; floats accept it
    assert isinstance(cfg.algorithm.kl_coef, float) and cfg.algorithm.kl_coef == 0.0  # int accepted for float
    assert cfg.retriever.token is None


def test_override_float_without_dot():
    assert load_config(None, ["trainer.lr=3e-5"]).trainer.lr == pytest.approx(3e-5)


def test_base_inheritance(tmp_path):
    _write(tmp_path / "base.yaml", "name: base\ntrainer:\n  total_steps: 11\n  lr: 0.001\nalgorithm:\n  llds:\n    lam: 0.05\n")
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub" / "child.yaml", "_base_: ../base.yaml\nname: child\ntrainer:\n  total_steps: 3\n")
    cfg = load_config(tmp_path / "sub" / "child.yaml")
    assert cfg.name == "child"
    assert cfg.trainer.total_steps == 3  # child overrides
    assert cfg.trainer.lr == pytest.approx(0.001)  # deep merge keeps the base's sibling
    assert cfg.algorithm.llds.lam == 0.05


def test_base_cycle_and_missing_file(tmp_path):
    _write(tmp_path / "a.yaml", "_base_: b.yaml\n")
    _write(tmp_path / "b.yaml", "_base_: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_unknown_keys_named(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.llds.lamda"):
        load_config(None, ["algorithm.llds.lamda=0.1"])
    with pytest.raises(ConfigError, match="trainer.totl_steps"):
        load_config(_write(tmp_path / "x.yaml", "trainer:\n  totl_steps: 3\n"))
    with pytest.raises(ConfigError, match="bogus"):
        load_config(None, ["bogus=1"])


@pytest.mark.parametrize(
    "override,key",
    [
        ("trainer.total_steps=2.5", "trainer.total_steps"),  # int rejects floats
        ("trainer.total_steps=true", "trainer.total_steps"),  # ... and bools
        ("algorithm.llds.lam=abc", "algorithm.llds.lam"),  # float rejects words
        ("algorithm.llds.enabled=3", "algorithm.llds.enabled"),  # bool rejects numbers
        ("algorithm.llds.gate=span", "algorithm.llds.gate"),  # Literal choices
        ("algorithm.kl_type=k4", "algorithm.kl_type"),
        ("trainer.adam_betas=0.9", "trainer.adam_betas"),  # list expected
        ("algorithm=3", "algorithm"),  # section expected
    ],
)
def test_wrong_types_rejected(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["trainer.train_batch_size=8", "trainer.ppo_mini_batch_size=16"], "trainer.ppo_mini_batch_size"),
        (["trainer.train_batch_size=12", "trainer.ppo_mini_batch_size=7"], "trainer.ppo_mini_batch_size"),
        (["trainer.train_batch_size=8", "rollout.n=5", "trainer.ppo_mini_batch_size=80"], "trainer.ppo_mini_batch_size"),
        (["algorithm.llds.lam=-0.1"], "algorithm.llds.lam"),
        (["algorithm.llds.lam_answer=-1"], "algorithm.llds.lam_answer"),
        (["algorithm.dual_clip=0.5"], "algorithm.dual_clip"),
        (["algorithm.clip_eps=0"], "algorithm.clip_eps"),
        (["rollout.top_p=1.5"], "rollout.top_p"),
        (["rollout.n=0"], "rollout.n"),
        (["trainer.warmup_ratio=1.0"], "trainer.warmup_ratio"),
        (["data.train_mix=nq+triviaqa"], "data.train_mix"),
        (["trainer.total_steps=10", "trainer.val_subsample=6", "trainer.full_eval_steps=[11]"],
         "trainer.full_eval_steps"),
        (["trainer.total_steps=10", "trainer.full_eval_steps=[5]"], "trainer.full_eval_steps"),  # no subsample
    ],
)
def test_impossible_values_rejected(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, overrides)


def test_a_group_of_one_response_is_refused_for_what_it_is():
    """rollout.n=1 on the tiny config (whose mini-batch would not divide either): the message is about rollout.n."""
    with pytest.raises(ConfigError, match=r"^rollout\.n: must be >= 2: GRPO's advantage compares the responses"):
        load_config(str(REPO_ROOT / "configs" / "tiny.yaml"), ["rollout.n=1"])


def test_bad_override_syntax():
    with pytest.raises(ConfigError):
        parse_override("trainer.total_steps")
    with pytest.raises(ConfigError):
        parse_override("=3")
    with pytest.raises(ConfigError, match="not a section"):
        load_config(None, ["name=x", "name.sub=1"])


def test_save_and_reload_round_trip(tmp_path):
    cfg = load_config(None, ["algorithm.llds.gate=none", "trainer.lr=2e-6", "name=rt"])
    save_config(cfg, tmp_path / "saved.yaml")
    again = load_config(tmp_path / "saved.yaml")
    assert again == cfg


def test_every_config_field_has_a_help_text_and_help_config_prints_it():
    from searchr1_lld.config import Config, format_help, iter_fields
    from searchr1_lld.world import WorldConfig

    for cls, prefix in ((Config, ""), (WorldConfig, "world.")):
        fields = list(iter_fields(cls, prefix))
        assert len(fields) > 20
        missing = [key for key, f, _, _ in fields if not f.metadata.get("help", "").strip()]
        assert missing == [], f"config fields without help: {missing}"
        text = format_help(cls, prefix)
        for key, f, _, default in fields:
            assert f"  {key} (" in text and f"default {default!r}): {f.metadata['help']}" in text


def test_train_py_help_config_prints_every_section(capsys):
    import importlib.util

    from conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location("train_cli", REPO_ROOT / "train.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["--help-config"]) == 0
    out = capsys.readouterr().out
    for section in ("[data]", "[rollout]", "[retriever]", "[algorithm]", "[algorithm.llds]", "[trainer]", "[eval]",
                    "[world]"):
        assert section in out
    assert "algorithm.llds.lam (float, default 0.2): lambda: LLDS coefficient" in out


def test_world_config_lives_outside_the_run_config():
    from searchr1_lld.config import ConfigError, load_config
    from searchr1_lab.methods import read_lab_config
    from searchr1_lld.world import load_world_config

    assert not hasattr(load_config(None).data, "world")
    for key in ("data.world.seed=1", "data.world_dir=x", "data.world_config=x"):
        with pytest.raises(ConfigError, match="unknown key data.world"):
            load_config(None, [key])
    from conftest import REPO_ROOT

    # the lab trains in the world of configs/world/v5.yaml (WorldConfig's defaults); the first lab's small world
    # still loads
    lab_world = load_world_config(read_lab_config(REPO_ROOT / "configs/lab/lab.yaml", [])[1])
    assert lab_world == load_world_config(None)
    v1_world = load_world_config(REPO_ROOT / "configs/world/lab.yaml")
    assert (v1_world.num_people, v1_world.retriever) == (16, "bm25")
    assert load_world_config("configs/world/default.yaml", ["seed=3"]).seed == 3
    with pytest.raises(ConfigError, match="world.multi_hop_fraction"):
        load_world_config(None, ["multi_hop_fraction=2"])
