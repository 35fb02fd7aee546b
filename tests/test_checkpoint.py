"""Checkpoints: atomic write (half-written ones ignored), keep-last-k, exact restore of weights/optimiser/RNG."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from searchr1_lld.bookkeeping import checkpoint as ckpt
def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    return model, opt, sched


def _train_one(model, opt, sched):
    loss = model(torch.randn(5, 4)).pow(2).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def _save(tmp_path, step, model, opt, sched, k=2):
    return ckpt.save_checkpoint(tmp_path, step, model=model, optimizer=opt, scheduler=sched,
                                trainer_state={"data": {"epoch": 0, "cursor": step}}, keep_last_k=k, save_policy=False)


def test_save_load_roundtrip_restores_everything(tmp_path):
    model, opt, sched = _setup()
    _train_one(model, opt, sched)
    random.seed(3); np.random.seed(3); torch.manual_seed(3)
    path = _save(tmp_path, 1, model, opt, sched)
    assert (path / ckpt.COMPLETE).is_file() and path.name == "step_000001"
    expected_next = (random.random(), np.random.rand(), torch.rand(1).item())
    after_ref = [p.detach().clone() for p in model.parameters()]

    model2, opt2, sched2 = _setup(seed=99)
    state = ckpt.load_checkpoint(path, model=model2, optimizer=opt2, scheduler=sched2)
    assert state["step"] == 1 and state["data"]["cursor"] == 1
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected_next
    assert sched2.last_epoch == sched.last_epoch == 1
    # the same update from the restored state gives the same weights
    torch.manual_seed(11); _train_one(model2, opt2, sched2)
    model3, opt3, sched3 = _setup(seed=5)
    ckpt.load_checkpoint(path, model=model3, optimizer=opt3, scheduler=sched3)
    torch.manual_seed(11); _train_one(model3, opt3, sched3)
    for a, b in zip(model2.parameters(), model3.parameters()):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(model2.parameters(), after_ref))  # it did move


def test_half_written_checkpoint_is_ignored(tmp_path):
    model, opt, sched = _setup()
    good = _save(tmp_path, 1, model, opt, sched)
    # a crash mid-save: temp dir left behind, and a final-named dir without the COMPLETE marker
    half = ckpt.checkpoint_root(tmp_path) / "step_000002"
    shutil.copytree(good, half)
    (half / ckpt.COMPLETE).unlink()
    (ckpt.checkpoint_root(tmp_path) / ".tmp-step_000003").mkdir()
    assert ckpt.latest_checkpoint(tmp_path) == good
    assert ckpt.resolve_resume("auto", tmp_path) == good
    with pytest.raises(FileNotFoundError):
        ckpt.resolve_resume(str(half), tmp_path)
    with pytest.raises(FileNotFoundError):
        ckpt.load_checkpoint(half, model=model, optimizer=opt, scheduler=sched)
    # the next save cleans the stale temp dir
    _save(tmp_path, 4, model, opt, sched)
    assert not (ckpt.checkpoint_root(tmp_path) / ".tmp-step_000003").exists()


def test_keep_last_k(tmp_path):
    model, opt, sched = _setup()
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, model, opt, sched, k=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000003", "step_000004"]
    assert ckpt.resolve_resume("never", tmp_path) is None


# --------------------------------------------------------------------------------------------------------------------
# Crash safety: kill -9 at every phase of save + prune
# --------------------------------------------------------------------------------------------------------------------

SAVE_PHASES = ["tmp_created", "policy_written", "optimizer_written", "scheduler_written", "trainer_state_written",
               "rng_written", "marker_written", "renamed", "prune_renamed", "prune_deleting", "pruned"]
WRITTEN_PHASES = {"policy_state.pt": "policy_written", "optimizer.pt": "optimizer_written",
                  "scheduler.pt": "scheduler_written", "trainer_state.json": "trainer_state_written",
                  "rng_rank0.pt": "rng_written"}


def _watch_save_phases(monkeypatch, step, on_phase):
    """Call ``on_phase(name)`` right after each step on disk that ends a phase of saving checkpoint ``step`` (the
    torch.save / json.dump / Path calls checkpoint.py makes, wrapped in this process). "pruned", the return of
    save_checkpoint, is the caller's to report."""
    real_save, real_dump = torch.save, json.dump
    real_mkdir, real_rename, real_unlink = Path.mkdir, Path.rename, Path.unlink
    emptied = set()  # directories of checkpoints/ a file was deleted from

    def save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        if isinstance(f, (str, Path)) and Path(f).name in WRITTEN_PHASES:
            on_phase(WRITTEN_PHASES[Path(f).name])

    def dump(obj, fp, *args, **kwargs):
        real_dump(obj, fp, *args, **kwargs)
        if Path(fp.name).name in WRITTEN_PHASES:
            fp.flush()  # as the file's close would: the phase ends with the whole file on disk
            on_phase(WRITTEN_PHASES[Path(fp.name).name])

    def mkdir(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self.name == f".tmp-step_{step:06d}":
            on_phase("tmp_created")

    def rename(self, target):
        moved = real_rename(self, target)
        if self.name == f"{ckpt.COMPLETE}.part":
            on_phase("marker_written")
        elif self.name.startswith(".tmp-"):
            on_phase("renamed")
        elif Path(target).name.startswith(".trash-"):
            on_phase("old_same_step_moved" if self.name == f"step_{step:06d}" else "prune_renamed")
        return moved

    def unlink(self, *args, **kwargs):
        real_unlink(self, *args, **kwargs)
        deleting = next((d for d in self.parents if d.parent.name == "checkpoints"), None)
        if deleting is not None and deleting not in emptied:
            emptied.add(deleting)
            on_phase("prune_deleting")

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(json, "dump", dump)
    for name, fn in (("mkdir", mkdir), ("rename", rename), ("unlink", unlink)):
        monkeypatch.setattr(Path, name, fn)


def _killed_child(fn):
    """Run ``fn`` in a forked child; return True when the child died of SIGKILL."""
    import os
    import signal

    pid = os.fork()
    if pid == 0:  # child
        try:
            fn()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _kill_self():
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _assert_resumable(run_dir, model, opt, sched, allowed_steps):
    """Every step_* directory is complete, the newest one loads, and it is one of ``allowed_steps``."""
    root = ckpt.checkpoint_root(run_dir)
    for d in root.glob("step_*"):
        assert ckpt.incomplete_reason(d) is None, f"{d.name} looks like a checkpoint but is not: {ckpt.incomplete_reason(d)}"
    latest = ckpt.resolve_resume("auto", run_dir)
    assert latest is not None and int(latest.name.split("_")[1]) in allowed_steps
    state = ckpt.load_checkpoint(latest, model=model, optimizer=opt, scheduler=sched)
    assert state["step"] == int(latest.name.split("_")[1])


@pytest.mark.parametrize("resave", [False, True], ids=["new", "resave"])
def test_a_save_passes_its_phases_in_order(tmp_path, monkeypatch, resave):
    """The phases the kill test below stops at: each seen once, in the order save_checkpoint takes them."""
    model, opt, sched = _setup()
    for step in (1, 2):
        _save(tmp_path, step, model, opt, sched, k=1)
    target = 2 if resave else 3
    seen = []
    _watch_save_phases(monkeypatch, target, seen.append)
    _save(tmp_path, target, model, opt, sched, k=1)
    monkeypatch.undo()
    written = SAVE_PHASES[:SAVE_PHASES.index("marker_written") + 1]
    # a re-save moves the old directory away (its files are deleted as trash); a new step prunes the oldest
    expected = written + (["old_same_step_moved", "renamed", "prune_deleting"] if resave
                          else ["renamed", "prune_renamed", "prune_deleting"])
    assert seen == expected


# (phase, re-save the newest step instead of saving a new one): a re-save moves the old directory away first and
# prunes nothing with keep_last_k=1; a new step prunes the oldest.
KILL_CASES = [(p, False) for p in SAVE_PHASES] + [
    (p, True) for p in SAVE_PHASES + ["old_same_step_moved"] if p not in ("prune_renamed", "prune_deleting")]


@pytest.mark.parametrize("phase,resave", KILL_CASES, ids=[f"{p}-{'resave' if r else 'new'}" for p, r in KILL_CASES])
def test_kill_at_every_phase_of_save_and_prune(tmp_path, monkeypatch, phase, resave):
    model, opt, sched = _setup()
    for step in (1, 2):
        _train_one(model, opt, sched)
        _save(tmp_path, step, model, opt, sched, k=1)
    target = 2 if resave else 3

    def crash(name):
        if name == phase:
            _kill_self()

    def save_and_report_the_end():
        _save(tmp_path, target, model, opt, sched, k=1)
        crash("pruned")

    _watch_save_phases(monkeypatch, target, crash)
    assert _killed_child(save_and_report_the_end), f"never reached phase {phase}"
    monkeypatch.undo()
    _assert_resumable(tmp_path, *_setup(seed=7), allowed_steps={2, target})
    # the next save cleans up and leaves exactly the last k complete checkpoints
    _save(tmp_path, 4, model, opt, sched, k=1)
    assert [p.name for p in ckpt.checkpoint_root(tmp_path).iterdir()] == ["step_000004"]


def test_kill_in_the_middle_of_deleting_an_old_checkpoint(tmp_path, monkeypatch):
    """The reported failure: pruning killed after the weights, optimiser and scheduler were deleted but before the
    COMPLETE marker was -> that directory must not count as a checkpoint."""
    model, opt, sched = _setup()
    _save(tmp_path, 1, model, opt, sched, k=1)
    import os

    real_unlink = os.unlink
    kept_marker = []

    def unlink_all_but_marker(path, *a, **kw):  # the marker survives the delete ...
        if os.path.basename(path) == ckpt.COMPLETE:
            kept_marker.append(path)
            return None
        return real_unlink(path, *a, **kw)

    def die_on_rmdir(path, *a, **kw):  # ... and the process dies before the directory goes
        if kept_marker:
            _kill_self()
        raise AssertionError("rmdir before any marker was deleted")

    monkeypatch.setattr(os, "unlink", unlink_all_but_marker)
    monkeypatch.setattr(os, "rmdir", die_on_rmdir)
    assert _killed_child(lambda: _save(tmp_path, 2, model, opt, sched, k=1))
    monkeypatch.undo()
    listed = ckpt.list_checkpoints(tmp_path)
    assert [p.name for p in listed] == ["step_000002"]
    for p in listed:  # everything listed as a checkpoint loads
        ckpt.load_checkpoint(p, model=model, optimizer=opt, scheduler=sched)


def test_marker_lists_files_and_a_missing_file_makes_it_incomplete(tmp_path):
    model, opt, sched = _setup()
    path = _save(tmp_path, 1, model, opt, sched)
    assert ckpt.incomplete_reason(path) is None
    assert "optimizer.pt" in (path / ckpt.COMPLETE).read_text()
    (path / "scheduler.pt").unlink()
    assert ckpt.incomplete_reason(path) == "scheduler.pt is missing"
    assert ckpt.latest_checkpoint(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="scheduler.pt is missing"):
        ckpt.resolve_resume(str(path), tmp_path)
