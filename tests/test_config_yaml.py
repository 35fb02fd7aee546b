"""YAML 1.1 traps in configs: only true/false are booleans, so `ma: off` stays the string 'off'."""

import pytest

from searchr1_lld.config import ConfigError, load_config


def test_off_is_a_string_in_overrides():
    cfg = load_config(None, ["algorithm.llds.ma=off", "algorithm.llds.gate=none"])
    assert cfg.algorithm.llds.ma == "off"
    assert cfg.algorithm.llds.gate == "none"


def test_off_is_a_string_in_yaml(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("algorithm:\n  llds:\n    ma: off\n    enabled: false\n")
    cfg = load_config(f)
    assert cfg.algorithm.llds.ma == "off" and cfg.algorithm.llds.enabled is False


def test_yes_no_are_not_booleans():
    with pytest.raises(ConfigError, match="algorithm.llds.enabled"):
        load_config(None, ["algorithm.llds.enabled=no"])
