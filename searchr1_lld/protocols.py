"""What the core asks of the things it is handed: small structural types (``typing.Protocol``) instead of ``Any``.

A transformers tokenizer, ``retriever.make_retriever(...)``'s retrievers and accelerate's ``Accelerator`` satisfy
them as they are; tests pass small fakes. The rollout engine's interface is owned by the rollout package
(``searchr1_lld.rollout.backends.base.GenerationBackend``).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class Tokenizer(Protocol):
    """The tokenizer calls the rollout, the learner and the evaluator make (a transformers tokenizer has them)."""

    pad_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...


@runtime_checkable
class Retriever(Protocol):
    """``search(queries, topk)``: one list of hits per query, best first; each hit ``{"id", "contents", "score"}``.
    A failure raises ``retriever.RetrieverError``; never a silently empty result."""

    def search(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]: ...


class Accelerator(Protocol):
    """The part of ``accelerate.Accelerator`` the learner and the evaluator use."""

    process_index: int
    num_processes: int
    is_main_process: bool
    device: torch.device
    distributed_type: Any
    state: Any

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def reduce(self, tensor: torch.Tensor, reduction: str = ...) -> torch.Tensor: ...

    def wait_for_everyone(self) -> None: ...

    def end_training(self) -> None: ...

    def autocast(self) -> Any: ...


class ModelStateStore(Protocol):
    """The part of a training engine (``searchr1_lld.learner.engines``) a checkpoint asks for: the model's and the
    optimiser's state, written into and read from a checkpoint's directory by the kind that runs them."""

    def save_state(self, directory: Any, step: int, model: Any, optimizer: Any, tokenizer: Tokenizer | None,
                   save_policy: bool) -> None: ...

    def load_state(self, directory: Any, model: Any, optimizer: Any) -> None: ...
