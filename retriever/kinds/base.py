"""What a retriever kind is asked: :class:`IndexKind`, one implementation per kind (retriever/kinds/dense.py,
retriever/kinds/bm25.py), registered by the name its manifests record (retriever/kinds/__init__.py).

A kind owns everything that differs between kinds: its build settings (a dataclass) and their options on
``python -m retriever build``, the files it builds beside the doc store, the manifest fields it records and
requires, and loading its files into a :class:`SearchBackend`. The steps every kind shares (the corpus checksum,
the doc store, the manifest, the integrity checks) stay in retriever/build.py, retriever/manifest.py and
retriever/index.py.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from retriever.faiss_index import GPU_PLACEMENTS


class UsageError(ValueError):
    """A command line that cannot work as given (the message says what to add)."""


class SearchBackend(Protocol):
    """A loaded index: ``search(queries, k) -> (scores [Q, k], rows [Q, k])``, best first (row -1: no hit)."""

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class CorpusFacts:
    """The corpus a build reads: its path, sha256 and row count."""

    path: Path
    sha256: str
    num_rows: int


@dataclass
class OpenOptions:
    """How an index is loaded for search: ``device`` of a query encoder (None: cuda if available), memory-mapped
    or read into RAM, on GPUs or not and where (``gpu_placement``: ``all``, sharded over every visible GPU, what one
    service per node does; ``own``, a whole copy on this process's own GPU, what a training rank's in-process index
    does), search parameters over the manifest's (``{"nprobe": 64}``)."""

    device: str | None = None
    mmap: bool = True
    use_gpu: bool = False
    search_params: dict[str, Any] | None = None
    gpu_placement: str = "all"

    def __post_init__(self) -> None:
        if self.gpu_placement not in GPU_PLACEMENTS:
            raise ValueError(f"gpu_placement must be one of {GPU_PLACEMENTS}, got {self.gpu_placement!r}")


Settings = TypeVar("Settings")


class IndexKind(ABC, Generic[Settings]):
    """One kind of index, named by its manifests' ``retriever`` value; ``settings_type`` is its build settings
    dataclass (its fields are ``build_index``'s keyword settings for this kind)."""

    name: ClassVar[str]
    settings_type: ClassVar[type]
    manifest_keys: ClassVar[tuple[str, ...]] = ()  # what its manifest must hold besides the keys every kind's has

    def add_build_options(self, parser: argparse.ArgumentParser) -> None:
        """Add its options to ``python -m retriever build`` (none by default)."""

    def settings_from_args(self, args: argparse.Namespace) -> dict[str, Any]:
        """Its build settings from the parsed command line, by name; raises :class:`UsageError` on a line that
        cannot work."""
        return {}

    def prepare(self, settings: Settings, num_rows: int) -> Settings:
        """The settings with every automatic value resolved for a corpus of ``num_rows`` rows."""
        return settings

    @abstractmethod
    def manifest_settings(self, settings: Settings) -> dict[str, Any]:
        """The settings its manifest records: a dir whose manifest already holds the same ones is not rebuilt."""

    @abstractmethod
    def build(self, corpus: CorpusFacts, out_dir: Path, settings: Settings, *, show_progress: bool) -> dict[str, Any]:
        """Write the doc store (``corpus.DocStoreWriter``) and its own files into ``out_dir``; return the manifest
        fields that describe them, ``files`` (``{role: relative path}``) among them."""

    @abstractmethod
    def served_files(self, index_dir: Path) -> list[Path]:
        """Its files a search reads (their sizes and sha256 go into the manifest), besides the doc store."""

    def check_encoder(self, manifest: dict, encoder: str, where: str) -> None:
        """Raise IndexMismatchError if the index was built with another encoder than ``encoder`` (a kind that
        encodes nothing accepts any)."""

    def describe(self, manifest: dict) -> dict[str, Any]:
        """What an opened index reports of its build (``info()``, ``/health``): encoder, index type, ..."""
        return {}

    @abstractmethod
    def open(self, index_dir: Path, manifest: dict, options: OpenOptions) -> tuple[SearchBackend, dict[str, Any]]:
        """Load its files for search -> (backend, what the load did: ``load_mode``, ...)."""
