"""Evaluating the lab's policies on the world's splits: greedy EM (the evaluator library, in memory), sampled EM,
the training split, where the answers came from, and the warm start's own evaluations (cached)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from searchr1_lld import evaluation as ev
from searchr1_lld.rollout.inference import evaluating
from searchr1_lld.bookkeeping.checkpoint import latest_checkpoint
from searchr1_lld.config import Config, ConfigError
from searchr1_lld.evaluation.files import read_records
from searchr1_lld.evaluation.metrics import TRAJECTORIES
from searchr1_lld.protocols import Retriever, Tokenizer
from searchr1_lld.rollout.backends import make_backend
from searchr1_lld.rollout.backends.base import GenerationBackend
from searchr1_lld.world import read_card
from searchr1_lld.world.scoring import answer_provenance, provenance_rates

SAMPLED_SEED = 0  # every policy's sampled evaluation draws from the same seed
WORLD_DATASET = "synthetic"  # the name the world's splits are evaluated under


def world_rows(world_dir: Path, split: str, limit: int) -> dict[str, list[dict[str, Any]]]:
    """``{"synthetic": rows}`` of the world's ``split`` (qa/<split>.jsonl), the first ``limit`` (0 = all)."""
    return ev.load_eval_rows([f"{WORLD_DATASET}={Path(world_dir) / 'qa' / f'{split}.jsonl'}"], limit=limit)


def _eval_engine(model: torch.nn.Module, tokenizer: Tokenizer, cfg: Config,
                 seed: int | None = None) -> GenerationBackend:
    """The generation engine evaluations use: the in-memory policy, eval.batch_size questions per call."""
    engine_cfg = dataclasses.replace(cfg.rollout, backend="hf", generation_batch_size=cfg.eval.batch_size)
    return make_backend(engine_cfg, model=model, tokenizer=tokenizer, seed=seed)


def evaluate_policy(model: torch.nn.Module, tokenizer: Tokenizer, retriever: Retriever, cfg: Config, world_dir: Path,
                    out_dir: Path, name: str, split: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Greedy evaluation of an in-memory policy with the evaluator library on the world's ``split`` (default: test),
    first ``limit`` questions (default ``eval.limit``; 0 = all); returns results.json."""
    rows = world_rows(world_dir, split or "test", cfg.eval.limit if limit is None else limit)
    rollout_cfg = ev.eval_rollout_config(cfg.rollout, max_turns=cfg.eval.max_turns, topk=cfg.eval.topk)
    if out_dir.exists():
        shutil.rmtree(out_dir)  # results always belong to this policy (the evaluator would resume otherwise)
    with evaluating(model):
        res = ev.evaluate(rows, backend=_eval_engine(model, tokenizer, cfg), tokenizer=tokenizer, retriever=retriever,
                          rollout_cfg=rollout_cfg, out_dir=out_dir, batch_size=cfg.eval.batch_size,
                          template=cfg.data.prompt_template, chat_template=cfg.data.chat_template, name=name,
                          progress=False)
    assert res is not None
    return res


def evaluate_sampled(model: torch.nn.Module, tokenizer: Tokenizer, retriever: Retriever, cfg: Config, world_dir: Path,
                     samples: int) -> dict[str, Any]:
    """The sampled policy's test EM (:func:`searchr1_lld.evaluation.sampled_em`): ``samples`` rollouts per test
    question at ``rollout.temperature`` (what the training reward measures), seed ``SAMPLED_SEED``."""
    rows = world_rows(world_dir, "test", cfg.eval.limit)[WORLD_DATASET]
    rollout_cfg = ev.eval_rollout_config(cfg.rollout, max_turns=cfg.eval.max_turns, topk=cfg.eval.topk)
    t0 = time.time()
    with evaluating(model):
        m = ev.sampled_em(rows, backend=_eval_engine(model, tokenizer, cfg, seed=SAMPLED_SEED), tokenizer=tokenizer,
                          retriever=retriever, rollout_cfg=rollout_cfg, samples=samples,
                          batch_size=cfg.eval.batch_size, template=cfg.data.prompt_template,
                          chat_template=cfg.data.chat_template, progress=False)
    keys = ("em", "em_single_hop", "em_multi_hop", "n", "questions", "samples", "temperature",
            "mean_valid_searches", "invalid_action_rate", "answer_rate")
    return {**{k: m.get(k) for k in keys}, "seed": SAMPLED_SEED, "eval_s": round(time.time() - t0, 1)}


def load_policy(policy_dir: Path, world_dir: Path) -> tuple[torch.nn.Module, Tokenizer]:
    """A policy saved in ``policy_dir`` (fp32) and the world's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(world_dir / "tokenizer"))
    return AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32), tokenizer


def final_policy(rec: dict[str, Any], world_dir: Path) -> tuple[torch.nn.Module, Tokenizer]:
    """A finished run's final policy (the one its greedy EM scored), from its last checkpoint, and the tokenizer."""
    ckpt = latest_checkpoint(rec["run_dir"])
    if ckpt is None or not (ckpt / "policy").is_dir():
        raise ConfigError(f"run {rec['run_dir']} kept no checkpoint with its final policy; rerun it (--fresh), or "
                          "pass --sampled 0 / --train-eval 0")
    state = ckpt / "trainer_state.json"
    step = json.loads(state.read_text()).get("step") if state.is_file() else None
    if step != rec["steps"]:
        raise ConfigError(f"the last checkpoint of {rec['run_dir']} is step {step}, not the run's final step "
                          f"{rec['steps']}")
    return load_policy(ckpt / "policy", world_dir)


def sampled_of_run(cfg: Config, rec: dict[str, Any], world_dir: Path, retriever: Retriever,
                   samples: int) -> dict[str, Any]:
    """A finished run's sampled evaluation, from its last checkpoint's policy (the policy its greedy EM scored)."""
    model, tokenizer = final_policy(rec, world_dir)
    return evaluate_sampled(model, tokenizer, retriever, cfg, world_dir, samples)


TRAIN_EVAL_DIR = "eval_train"  # a run's (and the warm start's) greedy evaluation on the first training questions


def train_eval_done(eval_dir: Path, questions: int, world_dir: Path) -> bool:
    """True when ``eval_dir`` holds a finished greedy evaluation of the first ``questions`` training questions
    (0 = all) of the world in ``world_dir``."""
    path = eval_dir / "results.json"
    if not path.is_file():
        return False
    rows = world_rows(world_dir, "train", questions)[WORLD_DATASET]
    return ev.load_results(eval_dir)["datasets"][WORLD_DATASET]["n"] == len(rows)


def evaluate_train(model: torch.nn.Module, tokenizer: Tokenizer, retriever: Retriever, cfg: Config, world_dir: Path,
                   eval_dir: Path, questions: int, name: str) -> None:
    """Greedy evaluation on the first ``questions`` questions of the train split (0 = all) into ``eval_dir``: what
    the policy answers on the questions it was trained on, against the held-out test split."""
    evaluate_policy(model, tokenizer, retriever, cfg, world_dir, eval_dir, name=name, split="train", limit=questions)


def provenance(eval_dir: Path, contents_of: dict[str, str]) -> dict[str, Any] | None:
    """EM and where the answers came from (:func:`searchr1_lld.world.scoring.provenance_rates`) over the trajectories of the
    evaluation in ``eval_dir``; None when there is none."""
    recs = read_records(eval_dir / TRAJECTORIES)
    if not recs:
        return None
    flags = [answer_provenance(r["retrieved_ids"], r["golden_answers"], r["prediction"], r["em"] > 0.5, contents_of)
             for r in recs]
    return {"em": sum(r["em"] for r in recs) / len(recs), "n": len(recs), **provenance_rates(flags)}


def eval_summary(results: dict[str, Any]) -> dict[str, Any]:
    """The numbers of the EM table from one results.json (the synthetic dataset)."""
    m = results["datasets"]["synthetic"]
    return {"em": m["em"], "em_single_hop": m.get("em_single_hop"), "em_multi_hop": m.get("em_multi_hop"),
            "n": m["n"], "n_single_hop": m.get("n_single_hop"), "n_multi_hop": m.get("n_multi_hop"),
            "mean_valid_searches": m["mean_valid_searches"], "invalid_action_rate": m["invalid_action_rate"],
            "answer_rate": m["answer_rate"]}


def evaluate_warm_start(cfg: Config, world_dir: Path, retriever: Retriever, out_dir: Path) -> dict[str, Any]:
    """The untrained (warm-started) policy's test EM: the common starting point of every run."""
    model, tokenizer = load_policy(world_dir / "model", world_dir)
    t0 = time.time()
    results = evaluate_policy(model, tokenizer, retriever, cfg, world_dir, out_dir, name="warm start")
    return {"eval": eval_summary(results), "eval_s": round(time.time() - t0, 1), "run_dir": str(out_dir)}


def warm_start_sampled(cfg: Config, world_dir: Path, retriever: Retriever, path: Path, samples: int,
                       fresh: bool = False) -> dict[str, Any]:
    """The warm start's sampled evaluation, cached in ``path`` (recomputed when the sample count or the world's
    config hash differs, or ``fresh``)."""
    world_hash = (read_card(world_dir) or {}).get("config_hash")
    if path.is_file() and not fresh:
        cached = json.loads(path.read_text())
        if cached.get("samples") == samples and cached.get("world_hash") == world_hash:
            return cached
    model, tokenizer = load_policy(world_dir / "model", world_dir)
    out = {**evaluate_sampled(model, tokenizer, retriever, cfg, world_dir, samples), "world_hash": world_hash}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    return out


def load_warm_start(eval_dir: Path) -> dict[str, Any]:
    return {"eval": eval_summary(ev.load_results(eval_dir)), "eval_s": 0.0, "run_dir": str(eval_dir)}


