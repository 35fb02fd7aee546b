"""A reference package's wheel, pinned by version and sha256, downloaded once from PyPI into ``.cache/<package>``
(``pip download <package>==<version> --no-deps``): what tests/verl_reference.py and tests/trl_reference.py compare
against. A failed download or a changed file fails the test that asked for it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

CACHE_ROOT = Path(__file__).resolve().parents[1] / ".cache"


def pinned_wheel(package: str, version: str, sha256: str, label: str) -> Path:
    """``.cache/<package>/<package>-<version>-py3-none-any.whl``, downloaded when missing and checked against
    ``sha256``; ``label`` names the reference in the failures (pytest.fail when PyPI cannot be reached)."""
    cache = CACHE_ROOT / package
    path = cache / f"{package}-{version}-py3-none-any.whl"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps", "-d",
                               str(cache)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not path.is_file():
            pytest.fail(f"the {label} reference could not be downloaded (pip download {package}=={version} "
                        f"--no-deps; PyPI must be reachable): {done.stderr[-2000:]}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        pytest.fail(f"{path}: sha256 {digest}, expected {sha256} (remove it to download it again)")
    return path
