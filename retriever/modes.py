"""The retriever's modes as kinds: :data:`MODES` maps each ``retriever.mode`` name to an object that carries the mode's
facts (what it needs, how it is built, where its index lives in memory, its part of a run's preflight). The name is
read once, by :func:`retriever_mode`; later code asks the object.

A new mode is one class here (or in its own module) and one entry in :data:`MODES`.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import httpx

from retriever.client import RetrieverClient, RetrieverError, retry_delay
from retriever.inprocess import InProcessRetriever
from retriever.manifest import check_manifest, read_manifest, verify_files

URL_ENV = "SEARCHR1_RETRIEVER_URL"  # overrides retriever.url (e.g. one service that every node of a run reaches)
TOKEN_ENV = "SEARCHR1_RETRIEVER_TOKEN"  # the bearer token when retriever.token is not set
Check = tuple[bool, str, str]  # (the value is fine, its dotted key, what it must be)


class RetrieverSettings(Protocol):
    """What the modes read of a config section (the trainer's ``RetrieverConfig`` has these fields): ``mode``
    ``inprocess`` or ``http``, the HTTP client's address and retry policy, the in-process index dir and how to load
    it."""

    mode: str
    url: str
    index_dir: str
    timeout_s: float
    max_wait_s: float
    first_contact_s: float
    max_retries: int | None
    backoff_s: float
    token: str | None
    batch_size: int
    device: str | None
    use_gpu_index: bool
    expect_encoder: str | None


@dataclass
class IndexFacts:
    """What a memory plan needs of the retriever's index: its files' bytes (host RAM in-process), its size and type,
    and how many GPUs a service reports its index sharded over (its /health ``load_mode``, ``gpu xN``)."""

    host_bytes: float = 0.0
    num_docs: int = 0
    dim: int = 0
    index_type: str = ""
    service_gpus: int = 0


@dataclass
class Inspection:
    """A mode's preflight: what it found (zeros when nothing is known), the lines that passed, the problems."""

    facts: IndexFacts = field(default_factory=IndexFacts)
    ok: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def service_address(cfg: RetrieverSettings) -> tuple[str, str | None]:
    """(url, token) of the HTTP service a ``RetrieverConfig`` names: ``$SEARCHR1_RETRIEVER_URL`` over ``cfg.url``,
    ``cfg.token`` over ``$SEARCHR1_RETRIEVER_TOKEN``."""
    url = os.environ.get(URL_ENV, "").strip() or cfg.url
    if not url.startswith(("http://", "https://")):
        source = f"${URL_ENV}" if os.environ.get(URL_ENV, "").strip() else "retriever.url"
        raise RetrieverError(f"{source}={url!r}: must start with http:// or https://")
    return url, (cfg.token or os.environ.get(TOKEN_ENV) or None)


class RetrieverMode:
    """What a retriever mode must say about itself; one subclass per mode, one instance in MODES."""

    name: str = ""
    index_in_process: bool = False  # the index is loaded into this process (its files count in host memory)
    asks_service: bool = False  # it asks a running service, whose address $SEARCHR1_RETRIEVER_URL can give

    def build(self, cfg: RetrieverSettings,
              default_index_dir: str | Path | None = None) -> RetrieverClient | InProcessRetriever:
        raise NotImplementedError

    def checks(self, cfg: RetrieverSettings) -> list[Check]:
        """The config checks this mode adds to ``retriever.*``'s."""
        return []

    def addressed(self, cfg: RetrieverSettings) -> RetrieverSettings:
        """``cfg`` with the address the launch's environment gives (unchanged where the mode has none)."""
        return cfg

    def index_dir(self, cfg: RetrieverSettings) -> str | None:
        """The index dir this process opens (None: the index lives elsewhere)."""
        return None

    def inspect(self, cfg: RetrieverSettings, size_text: Callable[[float], str], wait: bool = False) -> Inspection:
        """The preflight's look at the index or the service (``size_text`` formats a byte count; ``wait``: give a
        service that is still starting the time its client would give it)."""
        raise NotImplementedError

    def gpu_index_copies(self, cfg: RetrieverSettings, facts: IndexFacts,
                         ranks_per_node: int) -> tuple[int, int, str] | None:
        """How a memory plan counts the index on each GPU: (GPUs each copy is sharded over, copies with a part on
        every GPU, a note or ""), None when it holds no GPU memory there."""
        return None


class HTTPMode(RetrieverMode):
    """The retriever service (``python -m retriever serve``) reached over the Search-R1 ``/retrieve`` protocol."""

    name = "http"
    asks_service = True

    def build(self, cfg: RetrieverSettings,
              default_index_dir: str | Path | None = None) -> RetrieverClient | InProcessRetriever:
        return RetrieverClient(cfg.url, timeout_s=cfg.timeout_s, max_wait_s=cfg.max_wait_s,
                               max_retries=cfg.max_retries, backoff_s=cfg.backoff_s, token=cfg.token,
                               batch_size=getattr(cfg, "batch_size", 256),
                               first_contact_s=cfg.first_contact_s)

    def checks(self, cfg: RetrieverSettings) -> list[Check]:
        return [(cfg.url.startswith(("http://", "https://")), "retriever.url", "must start with http:// or https://")]

    def addressed(self, cfg: RetrieverSettings) -> RetrieverSettings:
        url, token = service_address(cfg)
        return dataclasses.replace(cfg, url=url, token=token)

    def inspect(self, cfg: RetrieverSettings, size_text: Callable[[float], str], wait: bool = False) -> Inspection:
        """``GET /health`` answers (no retries; ``wait``: retried as the client retries, :meth:`health`); its encoder
        against retriever.expect_encoder."""
        out, expect = Inspection(), cfg.expect_encoder
        try:
            health = self.health(cfg, wait)
        except (httpx.HTTPError, ValueError) as e:
            out.problems.append(f"retriever.url {cfg.url}: not reachable ({type(e).__name__}: {e}); start "
                                "`python -m retriever serve --index DIR` first")
            return out
        encoder = health.get("encoder")
        if expect and encoder and Path(str(encoder)).name != Path(expect).name:
            out.problems.append(f"retriever.url {cfg.url} serves an index built with encoder {encoder!r}, "
                                f"retriever.expect_encoder is {expect!r}")
        else:
            out.ok.append(f"retriever: {cfg.url} answers: {health.get('retriever')} index of "
                          f"{health.get('num_docs')} docs, encoder {encoder}")
        mode = str(health.get("load_mode") or "")
        gpus = int(mode.split("x")[-1]) if mode.startswith("gpu x") and mode.split("x")[-1].isdigit() else 0
        out.facts = IndexFacts(num_docs=int(health.get("num_docs") or 0), dim=int(health.get("dim") or 0),
                               index_type=str(health.get("index_type") or ""), service_gpus=gpus)
        return out

    @staticmethod
    def health(cfg: RetrieverSettings, wait: bool) -> dict:
        """The service's ``/health`` answer. ``wait``: a service that is still starting (its port bound while the
        index loads: requests time out; or answering 5xx) is asked again, backing off from retriever.backoff_s with
        full jitter (:func:`retriever.client.retry_delay`: the ranks of a launch do not ask in step), for
        up to retriever.max_wait_s, one whose port refuses for up to retriever.first_contact_s, as its client
        (retriever/client.py) would wait at the first search; the last error is raised after that."""
        headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}
        start, attempt, reached, rng = time.monotonic(), 0, False, random.Random()
        while True:
            attempt += 1
            try:
                answer = httpx.get(cfg.url.rstrip("/") + "/health", timeout=min(5.0, cfg.timeout_s), headers=headers)
                if answer.status_code < 500 or not wait:
                    return answer.json()
                reached, error = True, httpx.HTTPStatusError(f"status {answer.status_code}", request=answer.request,
                                                             response=answer)
            except httpx.ConnectError as e:
                error = e
            except httpx.HTTPError as e:  # connected, no answer in time: a service loading its index
                reached, error = True, e
            limit = cfg.max_wait_s if reached else cfg.first_contact_s
            delay = retry_delay(attempt, max(cfg.backoff_s, 0.05), 30.0, rng)
            if not wait or time.monotonic() - start + delay > limit:
                raise error
            time.sleep(delay)

    def gpu_index_copies(self, cfg: RetrieverSettings, facts: IndexFacts,
                         ranks_per_node: int) -> tuple[int, int, str] | None:
        """A service reporting a GPU index: counted as co-located, sharded over this node's GPUs."""
        if not facts.service_gpus:
            return None
        return facts.service_gpus, 1, (f"plan: the retriever service's index on {facts.service_gpus} GPU(s) is "
                                       "counted as sharded over this node's GPUs (a service on other GPUs gives it "
                                       "back)")


class InProcessMode(RetrieverMode):
    """The index opened in this process (``retriever.index_dir``); with ``retriever.use_gpu_index`` a whole copy on
    this process's own GPU (every rank of a node sharding its own copy over all the node's GPUs would put each
    rank's shard, FAISS temporary memory and CUDA context on every GPU)."""

    name = "inprocess"
    index_in_process = True

    def build(self, cfg: RetrieverSettings,
              default_index_dir: str | Path | None = None) -> RetrieverClient | InProcessRetriever:
        index_dir = cfg.index_dir or default_index_dir
        if not index_dir:
            raise ValueError("retriever.index_dir is empty and no default index dir was given")
        return InProcessRetriever(index_dir, device=getattr(cfg, "device", None),
                                  encoder=getattr(cfg, "expect_encoder", None),
                                  use_gpu=getattr(cfg, "use_gpu_index", False), gpu_placement="own")

    def index_dir(self, cfg: RetrieverSettings) -> str | None:
        return cfg.index_dir

    def inspect(self, cfg: RetrieverSettings, size_text: Callable[[float], str], wait: bool = False) -> Inspection:
        """The index dir's manifest, its files' sizes, the encoder against retriever.expect_encoder."""
        out = Inspection()
        if not cfg.index_dir:
            out.problems.append("retriever.index_dir is empty (retriever.mode=inprocess): build one with "
                                "`python -m retriever build` or use retriever.mode=http")
            return out
        try:
            manifest = read_manifest(cfg.index_dir)
            verify_files(cfg.index_dir, manifest, skip_hash=True)
            check_manifest(manifest, encoder=cfg.expect_encoder, index_dir=cfg.index_dir)
        except (OSError, ValueError) as e:
            out.problems.append(f"retriever.index_dir: {' '.join(str(e).split())}")
            return out
        size = float(sum(v["bytes"] for v in (manifest.get("checksums") or {}).values()))
        out.ok.append(f"retriever: {cfg.index_dir}: {manifest['retriever']} index of {manifest['num_docs']:,} docs"
                      + (f", encoder {manifest['encoder']}" if manifest.get("encoder") else "")
                      + f", file sizes as built ({size_text(size)})")
        out.facts = IndexFacts(host_bytes=size, num_docs=int(manifest["num_docs"]),
                               dim=int(manifest.get("dim") or 0), index_type=str(manifest.get("index_type") or ""))
        return out

    def gpu_index_copies(self, cfg: RetrieverSettings, facts: IndexFacts,
                         ranks_per_node: int) -> tuple[int, int, str] | None:
        """retriever.use_gpu_index: a whole copy on each rank's own GPU."""
        return (1, 1, "") if cfg.use_gpu_index else None


MODES: dict[str, RetrieverMode] = {mode.name: mode for mode in (InProcessMode(), HTTPMode())}


def retriever_mode(cfg: RetrieverSettings) -> RetrieverMode:
    """The mode ``retriever.mode`` names."""
    if cfg.mode not in MODES:
        raise ValueError(f"retriever.mode must be one of {sorted(MODES)} (got {cfg.mode!r})")
    return MODES[cfg.mode]
