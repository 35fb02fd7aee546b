"""One generation engine per evaluation process, whatever the number of checkpoints (``eval.py --compare``).

vLLM keeps one engine per process: its sleep-mode memory allocator is a per-process singleton (the GPU worker
asserts it), and an engine's process group and memory outlive the Python object. So :class:`CheckpointEngines`
builds the vLLM engine for the first checkpoint and streams each later checkpoint's weights into it
(``load_weights``: the engine's in-place reload, checked name by name and shape by shape against the engine model).
That needs the later checkpoints to be the same model with other weights: the same config (bar its name and dtype)
and the same tokenizer; otherwise it is an error that says to evaluate them in separate runs. The HF backend builds
each checkpoint's model afresh (plain torch modules, freed with the previous backend).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from searchr1_lld.config import RolloutConfig
from searchr1_lld.evaluation.metrics import EvalError
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.backends import BackendKind, GenerationBackend, backend_kind, make_backend

# config.json keys that name or store a checkpoint without changing the model it describes
_NOT_THE_MODEL = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")


def local_model_dir(model_path: str) -> Path:
    """``model_path`` as a local directory: itself, or a hub id's snapshot in the local cache (config and
    safetensors files only; offline, the cache must hold them)."""
    if Path(model_path).is_dir():
        return Path(model_path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_path, allow_patterns=["*.json", "*.safetensors"]))


def checkpoint_weights(model_path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the checkpoint's safetensors files, one at a time on the CPU."""
    from safetensors import safe_open

    files = sorted(local_model_dir(model_path).glob("*.safetensors"))
    if not files:
        raise EvalError(f"{model_path}: no *.safetensors files; a checkpoint streamed into a running engine must be "
                        "saved as safetensors (save_pretrained does)")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def model_config(model_path: str) -> dict[str, Any]:
    """The checkpoint's config.json as a dict, less the keys that do not change the model (:data:`_NOT_THE_MODEL`)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(local_model_dir(model_path))).to_dict()
    return {k: v for k, v in config.items() if k not in _NOT_THE_MODEL}


@dataclasses.dataclass
class CheckpointEngines:
    """The generation engine of each checkpoint of one evaluation, one engine per process (module docstring)."""

    cfg: RolloutConfig  # the engine's settings (``backend``: hf or vllm)
    dtype: str = "auto"
    device: str = "auto"
    backend: Optional[GenerationBackend] = None
    first: dict[str, Any] = dataclasses.field(default_factory=dict)  # the running engine's model and tokenizer
    kind: BackendKind = dataclasses.field(init=False)  # the engine's kind, resolved once from ``cfg``

    def __post_init__(self) -> None:
        self.kind = backend_kind(self.cfg)

    def backend_for(self, model_path: str, tokenizer: Tokenizer, tokenizer_path: str) -> GenerationBackend:
        """The engine for ``model_path``: a new one for the first checkpoint (and for every HF checkpoint), the running
        vLLM engine with ``model_path``'s weights streamed into it for each later one."""
        if self.backend is None or not self.kind.keeps_engine_across_checkpoints:
            self.backend = None  # the previous HF model is freed before the next is loaded
            self.backend = make_backend(self.cfg, tokenizer=tokenizer, model_path=model_path, dtype=self.dtype,
                                        tokenizer_path=tokenizer_path, device=self.device)
            self.first = {"path": model_path, "vocab": tokenizer.get_vocab()}
            return self.backend
        self._check_same_model(model_path, tokenizer)
        self.backend.load_weights(checkpoint_weights(model_path))
        print(f"[eval] {model_path}: weights streamed into the running vLLM engine (one engine per process)",
              flush=True)
        return self.backend

    def _check_same_model(self, model_path: str, tokenizer: Tokenizer) -> None:
        first = self.first["path"]
        theirs, ours = model_config(first), model_config(model_path)
        differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        reason = (f"its config differs from {first}'s in {', '.join(differ)}" if differ else
                  f"its tokenizer differs from {first}'s" if tokenizer.get_vocab() != self.first["vocab"] else "")
        if reason:
            raise EvalError(f"{model_path}: the vLLM backend evaluates the checkpoints of one run in one engine (one "
                            f"per process), streaming each one's weights into it, but {reason}. Evaluate it in a run "
                            "of its own and combine the results with --compare-dirs")
