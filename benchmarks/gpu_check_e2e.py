"""The GPU check's end-to-end section: the project's own entry points on the test-sized synthetic world, on the device.

- world: the world (its tiny policy, tokenizer, corpus, QA splits; BM25 index) built here, then a dense index of its
  corpus encoded on the device by a random-initialised BERT encoder saved beside it (no download: the check runs
  without network, and what is exercised is the dense path's devices, not retrieval quality);
- train: ``train.py`` for 3 steps (HF backend, the dense index in process, ``trainer.device`` the device), in its
  own process;
- eval: ``eval.py`` on the last checkpoint of that run, the same index;
- thread: the dense retriever built while the current CUDA device is the last GPU (cuda:1 on a machine with two),
  searched from a fresh thread (which starts on cuda:0), as the continuous scheduler's retrieval thread does: its
  hits must equal those of a search from the building thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from gpu_check_parts import guarded

REPO = Path(__file__).resolve().parent.parent
TRAIN_OVERRIDES = [
    "trainer.total_steps=3", "trainer.save_every=3", "trainer.train_batch_size=2", "trainer.ppo_mini_batch_size=2",
    "rollout.n=2", "rollout.max_turns=2", "rollout.max_tokens_per_turn=24", "rollout.max_obs_length=60",
    "rollout.max_total_length=1024", "trainer.micro_batch_token_budget=1000", "trainer.probe_every=0",
    "logging.progress_bar=false", "logging.plot_every=0", "rollout.backend=hf", "data.val_files=[]",
    "data.test_files=[]",
]
QUERIES = ["Where was the merchant born?", "Which river flows through the city?", "Who founded the company?"]


def world_config() -> Any:
    """The test world of tests/conftest.py (small enough to build in about a minute), BM25 as its own index."""
    from searchr1_lld.world.config import WorldConfig

    return WorldConfig(seed=0, num_people=24, num_cities=12, num_companies=16, num_rivers=4, distractors_per_entity=1,
                       multi_hop_fraction=0.4, num_train_questions=60, num_val_questions=24, num_test_questions=24,
                       tokenizer_vocab_size=1280, model_hidden_size=64, model_layers=2, model_heads=4,
                       model_kv_heads=2, model_intermediate_size=128, warmstart_trajectories=768, warmstart_epochs=1,
                       warmstart_lr=1e-2, warmstart_drills=256, warmstart_quality=0.7, warmstart_batch_size=8,
                       warmstart_measure=False, retriever="bm25")


WORLD_VARIABLE = "GPU_CHECK_WORLD"


def built_world(scratch: Path) -> Path:
    """The check's world (:func:`world_config`), built under ``scratch`` (a device machine keeps nothing between
    calls), or in the directory the GPU_CHECK_WORLD environment variable names, once for every later section and
    run (the CPU smoke tests name the test suite's cached world, of the same config; a directory holding another
    config's world is refused, never built over)."""
    from searchr1_lld.world.build import ensure_world

    named = os.environ.get(WORLD_VARIABLE)
    return ensure_world(Path(named) if named else scratch / "world", world_config(), progress=False)


def random_encoder(tokenizer_dir: Path, out: Path) -> Path:
    """A random-initialised 2-layer BERT with the world's tokenizer, saved as a local encoder directory."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=512,
                         pad_token_id=tok.pad_token_id or 0)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build(root: Path, device: torch.device) -> dict[str, Any]:
    """The world and its dense index (module docstring)."""
    from retriever.build import build_index

    world = built_world(root)
    encoder = random_encoder(world / "tokenizer", root / "encoder")
    devices = f"cuda:{device.index or 0}" if device.type == "cuda" else "cpu"
    index = build_index(world / "corpus.jsonl", root / "dense", retriever="e5", encoder=str(encoder),
                        devices=devices, show_progress=False)
    return {"world": world, "index": index, "encode_devices": devices}


def run_entry(cmd: list[str], timeout_s: float) -> float:
    """``cmd`` (an entry script of the repository) in its own process; its wall seconds, or RuntimeError with the
    tail of its output."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *cmd], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exit {proc.returncode}: {(proc.stdout + proc.stderr)[-1200:]}")
    return time.perf_counter() - t0


def train(root: Path, built: dict[str, Any], device: torch.device, timeout_s: float) -> dict[str, Any]:
    from searchr1_lld.bookkeeping.checkpoint import list_checkpoints
    from searchr1_lld.world.build import trainer_overrides

    run = root / "runs" / "e2e"
    seconds = run_entry(["train.py", "--config", "configs/tiny.yaml", *trainer_overrides(built["world"]),
                         f"retriever.index_dir={built['index']}", f"trainer.device={device.type}",
                         f"trainer.output_dir={root / 'runs'}", "trainer.run_name=e2e", *TRAIN_OVERRIDES], timeout_s)
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    checkpoints = list_checkpoints(run)
    if not checkpoints:
        raise RuntimeError(f"train.py wrote no checkpoint under {run}")
    built["checkpoint"] = checkpoints[-1] / "policy"
    return {"e2e_train_s": seconds, "e2e_train_steps": len(steps), "e2e_train_checkpoint": checkpoints[-1].name}


def evaluate(root: Path, built: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    world, out = built["world"], root / "eval"
    seconds = run_entry(["eval.py", "--model", str(built["checkpoint"]), "--tokenizer", str(world / "tokenizer"),
                         "--index", str(built["index"]), "--template", "tiny", "--backend", "hf", "--datasets",
                         f"synthetic={world / 'qa' / 'test.jsonl'}", "--limit", "8", "--out", str(out),
                         "--no-progress"], timeout_s)
    res = json.loads((out / "results.json").read_text())["datasets"]["synthetic"]
    return {"e2e_eval_s": seconds, "e2e_eval_questions": res["n"], "e2e_eval_em": res["em"]}


def thread_search(built: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The dense retriever built on the last GPU (current device set to it), searched from a fresh thread."""
    from retriever import InProcessRetriever

    if device.type == "cuda":
        torch.cuda.set_device(torch.cuda.device_count() - 1)
    retriever = InProcessRetriever(built["index"])
    here = retriever.search(QUERIES, 3)
    there: dict[str, Any] = {}

    def search() -> None:
        there["current_device"] = torch.cuda.current_device() if device.type == "cuda" else None
        try:
            there["hits"] = retriever.search(QUERIES, 3)
        except Exception as err:  # the failure this part is here to show (recorded, not raised in the thread)
            there["error"] = f"{type(err).__name__}: {err}"

    worker = threading.Thread(target=search)
    worker.start()
    worker.join()
    if "error" in there:
        raise RuntimeError(f"search from a fresh thread failed: {there['error']}")
    ids = lambda hits: [[h["id"] for h in q] for q in hits]  # noqa: E731
    return {"e2e_thread_encoder_device": retriever.backend.encoder.device,
            "e2e_thread_worker_start_device": there["current_device"],
            "e2e_thread_hits_equal": ids(there["hits"]) == ids(here)}


def section_e2e(device: torch.device, shapes: dict, smoke: bool) -> dict[str, Any]:
    """world -> train -> eval, then the thread part (module docstring); each part guarded as the other sections'
    are (a failed part leaves its error and the later parts that need it out)."""
    import tempfile

    out: dict[str, Any] = {"e2e_gpus": torch.cuda.device_count() if device.type == "cuda" else 0}
    with tempfile.TemporaryDirectory() as tmp:
        root, built = Path(tmp), {}
        guarded(out, "e2e_world", lambda: _recorded(built, build(root, device)), device)
        if "index" in built:
            guarded(out, "e2e_train", lambda: train(root, built, device, shapes["e2e_entry_timeout_s"]), device)
            guarded(out, "e2e_thread", lambda: thread_search(built, device), device)
        if "checkpoint" in built:
            guarded(out, "e2e_eval", lambda: evaluate(root, built, shapes["e2e_entry_timeout_s"]), device)
    return out


def _recorded(built: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    built.update(facts)
    return {"e2e_encode_devices": facts["encode_devices"]}
