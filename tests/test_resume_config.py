"""Resuming never mixes two configs' states; rerunning the same train.py command resumes the same run."""

from __future__ import annotations


import pytest
import yaml

from searchr1_lld.config import ConfigError, load_config, read_yaml
from searchr1_lld.learner.trainer import Trainer

from conftest import REPO_ROOT, on_world, world_args
from test_trainer import SMALL


def _cfg(*extra):
    return load_config(None, SMALL + list(extra))


def test_check_resume_config_refuses_lists_and_allows_only_safe_keys():
    from searchr1_lld.bookkeeping.resume import check_resume_config

    saved = _cfg("trainer.lr=1e-3", "algorithm.llds.enabled=true", "trainer.total_steps=2").to_dict()
    with pytest.raises(ConfigError) as e:
        check_resume_config(saved, _cfg("trainer.lr=2e-3", "algorithm.llds.enabled=false", "trainer.total_steps=2"))
    assert "algorithm.llds.enabled: True -> False" in str(e.value) and "trainer.lr: 0.001 -> 0.002" in str(e.value)
    # a safe key still needs to be named, and the message says how
    with pytest.raises(ConfigError, match="--allow-change trainer.total_steps"):
        check_resume_config(saved, _cfg("trainer.lr=1e-3", "algorithm.llds.enabled=true", "trainer.total_steps=4"))
    same = _cfg("trainer.lr=1e-3", "algorithm.llds.enabled=true", "trainer.total_steps=4", "trainer.resume=never",
                "trainer.run_name=elsewhere", "logging.progress_bar=true")
    assert check_resume_config(saved, same, ["trainer.total_steps", "logging.*"]) == {
        "trainer.total_steps": (2, 4), "logging.progress_bar": (False, True)}
    with pytest.raises(ConfigError, match="only these may change"):  # an unsafe key cannot be allowed
        check_resume_config(saved, same, ["trainer.lr"])


def test_a_field_added_after_the_run_started_is_no_change_at_its_default_only():
    from searchr1_lld.bookkeeping.resume import check_resume_config

    saved = _cfg("trainer.lr=1e-3").to_dict()
    del saved["trainer"]["select_on_test"]  # a run saved before the field existed
    assert check_resume_config(saved, _cfg("trainer.lr=1e-3")) == {}
    with pytest.raises(ConfigError, match="trainer.select_on_test: None -> True"):  # not at its default: a change
        check_resume_config(saved, _cfg("trainer.lr=1e-3", "trainer.select_on_test=true"))
    saved["trainer"]["select_on_test"] = True  # present in the saved config: compared as before
    with pytest.raises(ConfigError, match="trainer.select_on_test: True -> False"):
        check_resume_config(saved, _cfg("trainer.lr=1e-3"))


def test_default_run_name_is_deterministic_and_ignores_safe_keys():
    from searchr1_lld.bookkeeping.resume import default_run_name

    a = _cfg("trainer.total_steps=2")
    assert default_run_name(a) == default_run_name(_cfg("trainer.total_steps=2"))
    assert default_run_name(a) == default_run_name(_cfg("trainer.total_steps=9", "trainer.output_dir=x"))
    assert default_run_name(a) != default_run_name(_cfg("trainer.total_steps=2", "trainer.lr=5e-3"))
    assert default_run_name(a).startswith(a.name + "-")
    # the inputs are part of a run's identity: a model or index rebuilt under the same paths is a new run
    assert default_run_name(a, "abc123") == default_run_name(_cfg("trainer.total_steps=2"), "abc123")
    assert len({default_run_name(a), default_run_name(a, "abc123"), default_run_name(a, "def456")}) == 3


def test_resuming_onto_other_inputs_is_refused(tmp_path, monkeypatch):
    from searchr1_lld.bookkeeping import resume
    settle_run_dir = resume.settle_run_dir
    cfg = _cfg("trainer.total_steps=2", "trainer.resume=auto")
    settle_run_dir(cfg, tmp_path, True, (), inputs="inputs-a")
    assert (tmp_path / "inputs_fingerprint.txt").read_text().strip() == "inputs-a"
    step = tmp_path / "checkpoints" / "step_000001"  # a checkpoint to resume from (its contents are not read here)
    step.mkdir(parents=True)
    monkeypatch.setattr(resume.ckpt, "resolve_resume", lambda mode, run_dir: None if mode == "never" else step)
    settle_run_dir(cfg, tmp_path, True, (), inputs="inputs-a")  # same inputs: resumes
    with pytest.raises(ConfigError, match="inputs-a.*inputs-b"):
        settle_run_dir(cfg, tmp_path, True, (), inputs="inputs-b")
    settle_run_dir(_cfg("trainer.total_steps=2", "trainer.resume=never"), tmp_path, True, (), inputs="inputs-b")
    assert (tmp_path / "inputs_fingerprint.txt").read_text().strip() == "inputs-b"  # started over on the new inputs


def test_the_inputs_fingerprint_follows_the_contents_of_local_inputs(tmp_path):
    """A model dir rebuilt in place (same path, another config or tokenizer) changes the fingerprint; a hub id enters
    by name; an untouched tree gives the same fingerprint."""
    from searchr1_lld.bookkeeping.resume import inputs_fingerprint

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n')
    cfg = _cfg(f"model.path={model}", f"data.train_files=[{rows}]")
    first = inputs_fingerprint(cfg)
    assert inputs_fingerprint(cfg) == first
    (model / "config.json").write_text('{"hidden_size": 128}')
    second = inputs_fingerprint(cfg)
    assert second != first
    rows.write_text('{"id": "1", "question": "q", "golden_answers": ["b"]}\n')
    assert inputs_fingerprint(cfg) != second
    assert inputs_fingerprint(_cfg("model.path=Qwen/Qwen2.5-3B")) != inputs_fingerprint(_cfg("model.path=Qwen/Qwen2.5-7B"))
    curve = tmp_path / "multipliers.json"  # a replayed learning-rate curve is an input too
    curve.write_text('{"lr_multiplier": [0.5, 0.5]}')
    replay = _cfg(f"model.path={model}", f"trainer.step_size.multiplier_file={curve}")
    third = inputs_fingerprint(replay)
    curve.write_text('{"lr_multiplier": [0.5, 0.4]}')
    assert inputs_fingerprint(replay) != third


def _trainer(cfg, tiny_world, retriever):
    return Trainer(on_world(cfg, tiny_world), retriever=retriever)


@pytest.fixture(scope="module")
def retriever(tiny_world):
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(tiny_world / "index")


def test_resume_with_a_changed_config_is_refused_and_the_saved_config_kept(tmp_path, tiny_world, retriever):
    base = [f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "trainer.save_every=1", "trainer.lr=1e-3",
            "algorithm.llds.enabled=true"]
    _trainer(_cfg(*base, "trainer.total_steps=1"), tiny_world, retriever).run(evaluate=False)
    run_dir = tmp_path / "r"
    saved = (run_dir / "config.yaml").read_text()
    # same run name, another lr and LLDS off: refused before anything is loaded or written
    changed = _trainer(_cfg(*base, "trainer.total_steps=2", "trainer.lr=5e-3", "algorithm.llds.enabled=false"),
                       tiny_world, retriever)
    with pytest.raises(ConfigError, match="trainer.lr: 0.001 -> 0.005"):
        changed.run(evaluate=False)
    assert (run_dir / "config.yaml").read_text() == saved and changed.step == 0
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    # a longer run: allowed when asked for, logged, the earlier config kept next to the new one
    longer = _trainer(_cfg(*base, "trainer.total_steps=2"), tiny_world, retriever)
    with pytest.raises(ConfigError, match="allow-change trainer.total_steps"):
        longer.run(evaluate=False)
    res = longer.run(evaluate=False, allow_changes=["trainer.total_steps"])
    assert res.steps == 2 and [h["step"] for h in res.history] == [1, 2]  # the resumed step's record came back
    assert read_yaml(run_dir / "config.yaml")["trainer"]["total_steps"] == 2
    assert (run_dir / "config.before-step_000001.yaml").read_text() == saved
    assert yaml.safe_load(saved)["trainer"]["total_steps"] == 1
    # starting over (resume=never) in the used directory: the earlier run's checkpoints and metrics are moved aside,
    # so a later resume=auto cannot pick up the old run's step 2 and no metrics are lost or mixed
    again = _trainer(_cfg(*base, "trainer.total_steps=1", "trainer.resume=never"), tiny_world, retriever)
    again.run(evaluate=False)
    from searchr1_lld.bookkeeping.checkpoint import list_checkpoints

    assert [p.name for p in list_checkpoints(run_dir)] == ["step_000001"]
    (archive,) = run_dir.glob("previous-*")
    assert [p.name for p in list_checkpoints(archive)] == ["step_000001", "step_000002"]
    assert len((archive / "metrics.jsonl").read_text().splitlines()) == 2
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_rerunning_the_same_train_command_resumes(tmp_path, tiny_world, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_cli", REPO_ROOT / "train.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    argv = ["--no-eval", *SMALL, *world_args(tiny_world), f"trainer.output_dir={tmp_path}",
            "trainer.total_steps=1", "trainer.save_every=1"]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out
    assert cli.main(argv) == 0
    second = capsys.readouterr().out
    runs = list(tmp_path.iterdir())
    assert len(runs) == 1, runs  # one run directory, found again
    assert f"resumed from {runs[0] / 'checkpoints' / 'step_000001'} at step 1" in second, second
    assert len((runs[0] / "metrics.jsonl").read_text().splitlines()) == 1  # no step ran twice
    # --resume RUN_DIR continues it with its own saved config (here: 1 more step, allowed explicitly)
    assert cli.main(["--no-eval", "--resume", str(runs[0]), "--allow-change", "trainer.total_steps",
                     "trainer.total_steps=2"]) == 0
    assert len((runs[0] / "metrics.jsonl").read_text().splitlines()) == 2
    assert "run directory: " + str(runs[0]) in first
