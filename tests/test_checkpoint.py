"""Checkpoints: atomic write (half-written ones ignored), keep-last-k, exact restore of weights/optimiser/RNG."""

import random
import shutil

import numpy as np
import pytest
import torch

from searchr1_lld import checkpoint as ckpt


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
