"""Every device explicit: no bare ``"cuda"`` names a device in the package (PyTorch's current device is per thread,
so a bare ``"cuda"`` means cuda:0 in a worker thread whatever the rank's GPU), encoders resolve ``cuda:<index>`` when
they are built, and the continuous scheduler's retrieval thread computes on its caller's GPU.

The GPU is faked: ``torch.cuda.is_available`` / ``current_device`` / ``set_device`` replaced by a per-thread device
index, as PyTorch keeps it (a new thread starts on 0)."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT
from searchr1_lld.distributed import explicit_device, set_thread_cuda_device, thread_cuda_device
from test_continuous_scheduler import ANSWER, CONTINUOUS, SEARCH, STEP_S, scripted_by_question
from test_rollout_support import DictRetriever, make_tokenizer, row

PACKAGE_FILES = sorted([*(REPO_ROOT / "searchr1_lld").rglob("*.py"), *(REPO_ROOT / "retriever").rglob("*.py"),
                        REPO_ROOT / "train.py", REPO_ROOT / "eval.py"])
MOVES = {"to", "device", "set_device", "cuda"}  # calls whose argument names a device


def _names_a_device(node: ast.Constant, parent: ast.AST) -> bool:
    """Whether the string constant ``node`` stands for a device where it is: an argument of ``.to`` /
    ``torch.device`` / ``set_device``, a ``device=`` keyword, a branch of ``x if c else y``, a returned value, or the
    value assigned to a name that says device."""
    if isinstance(parent, ast.Call) and node in parent.args:
        func = parent.func
        return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in MOVES
    if isinstance(parent, ast.keyword):
        return parent.arg == "device"
    if isinstance(parent, ast.IfExp):
        return node is not parent.test
    if isinstance(parent, ast.Return):
        return True
    if isinstance(parent, (ast.Assign, ast.AnnAssign)):
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        return any("device" in ast.unparse(t).lower() for t in targets)
    return False


def bare_cuda_devices(source: str) -> list[int]:
    """Lines where a bare ``"cuda"`` names a device (:func:`_names_a_device`)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return sorted(n.lineno for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value == "cuda" and _names_a_device(n, parents[n]))


def test_the_static_check_finds_each_way_of_naming_a_bare_cuda_device():
    found = bare_cuda_devices('x.to("cuda")\ntorch.device("cuda")\nf(device="cuda")\n'
                              'd = "cuda" if ok else "cpu"\ndef g():\n    return "cuda"\nself.device = "cuda"\n'
                              'torch.cuda.set_device("cuda")\n')
    assert found == [1, 2, 3, 4, 6, 7, 8]
    assert bare_cuda_devices('if d == "cuda": pass\nd.startswith("cuda")\nBATCH = {"cuda": 512}\n'
                             'state["cuda"] = 1\nx: Literal["cpu", "cuda"] = "cpu"\ntile(v, "cuda")\n') == []


def test_no_bare_cuda_device_in_the_package():
    found = {str(f.relative_to(REPO_ROOT)): lines for f in PACKAGE_FILES if (lines := bare_cuda_devices(f.read_text()))}
    assert found == {}, f"name the device in full (cuda:<index>: searchr1_lld.distributed.explicit_device): {found}"


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four fake GPUs; the current device is per thread and starts at 0 in every thread, as in PyTorch."""
    local = threading.local()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: getattr(local, "index", 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: setattr(local, "index", int(
        str(index).removeprefix("cuda:"))))
    return local


def test_devices_resolve_to_the_current_gpu_of_the_building_thread(fake_gpus):
    from retriever.encoders import resolve_device

    torch.cuda.set_device(2)
    assert explicit_device("auto") == explicit_device("cuda") == "cuda:2" and explicit_device("cuda:1") == "cuda:1"
    assert resolve_device(None) == resolve_device("cuda") == "cuda:2" and resolve_device("cpu") == "cpu"
    assert thread_cuda_device() == 2
    seen = []
    worker = threading.Thread(target=lambda: seen.append(explicit_device("cuda")))
    worker.start()
    worker.join()
    assert seen == ["cuda:0"]  # why a worker thread must be told: a new thread starts on device 0
    worker = threading.Thread(target=lambda: (set_thread_cuda_device(2), seen.append(explicit_device("cuda"))))
    worker.start()
    worker.join()
    assert seen == ["cuda:0", "cuda:2"]


def test_the_encoder_moves_its_model_and_queries_to_the_gpu_it_was_built_on(fake_gpus, monkeypatch, tmp_path):
    import transformers

    from retriever import encoders

    moved = []

    class FakeModel:
        config = type("C", (), {"hidden_size": 4})()

        def to(self, device):
            moved.append(device)
            return self

        def eval(self):
            return self

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", lambda *a, **k: FakeModel())
    torch.cuda.set_device(3)
    enc = encoders.E5Encoder(str(tmp_path), device="cuda")
    assert enc.device == "cuda:3" and moved == ["cuda:3"] and enc.fp16
    assert encoders.E5Encoder(str(tmp_path)).device == "cuda:3"


def test_the_retrieval_thread_searches_on_the_callers_gpu(fake_gpus):
    """A rank on cuda:3 rolls out with the continuous scheduler; its retriever runs in the scheduler's worker thread
    and must find cuda:3 current there (an encoder that moves queries with the current device would otherwise
    compute on cuda:0 next to weights on cuda:3)."""
    from searchr1_lld.rollout import run_agent_loop
    from scripted_backends import ScriptedStreamBackend

    class DeviceRecordingRetriever(DictRetriever):
        def __init__(self):
            super().__init__()
            self.devices: list[tuple[str, int]] = []

        def search(self, queries, topk):
            self.devices.append((threading.current_thread().name, torch.cuda.current_device()))
            return super().search(queries, topk)

    torch.cuda.set_device(3)
    plans = {f"s{i}": [SEARCH, ANSWER] for i in range(2)}
    qs = [row(i, question=f"Where is Lake Varo? ({name})") for i, name in enumerate(plans)]
    retriever = DeviceRecordingRetriever()
    run_agent_loop(qs, backend=ScriptedStreamBackend(scripted_by_question(plans), make_tokenizer(), step_s=STEP_S),
                   tokenizer=make_tokenizer(), retriever=retriever, cfg=CONTINUOUS, n=1)
    assert retriever.devices and all(name.startswith("rollout-retrieval") for name, _ in retriever.devices)
    assert [device for _, device in retriever.devices] == [3] * len(retriever.devices)
