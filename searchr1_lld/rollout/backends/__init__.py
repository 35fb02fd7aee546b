"""Generation backends behind one contract (base.py): transformers (hf.py), vLLM (vllm.py), scripted (tests)."""

from searchr1_lld.rollout.backends.base import BackendBase, GenerationBackend, GenerationOutput, StopDetector

__all__ = ["BackendBase", "GenerationBackend", "GenerationOutput", "StopDetector", "make_backend"]


def make_backend(cfg, *, model=None, tokenizer=None, model_path: str = "", seed=None):
    """Build the backend named by ``cfg.backend`` (a RolloutConfig): "hf" needs ``model``, "vllm" ``model_path``."""
    if cfg.backend == "hf":
        from searchr1_lld.rollout.backends.hf import HFBackend

        if model is None or tokenizer is None:
            raise ValueError("rollout.backend=hf needs the model and tokenizer")
        return HFBackend(model, tokenizer, batch_size=cfg.generation_batch_size, seed=seed)
    if cfg.backend == "vllm":
        from searchr1_lld.rollout.backends.vllm import VLLMBackend

        if not model_path:
            raise ValueError("rollout.backend=vllm needs model_path (a local HF model dir or hub id)")
        return VLLMBackend(model_path, tokenizer, cfg, seed=seed)
    raise ValueError(f"unknown rollout.backend {cfg.backend!r}; expected 'hf' or 'vllm'")
