"""Generation backends behind one contract (base.py): transformers (hf.py), vLLM (vllm.py), scripted (tests)."""

from searchr1_lld.rollout.backends.base import BackendBase, GenerationBackend, GenerationOutput, StopDetector

__all__ = ["BackendBase", "GenerationBackend", "GenerationOutput", "StopDetector", "make_backend"]


def make_backend(cfg, *, model=None, tokenizer=None, model_path: str = "", seed=None, dtype: str = "auto",
                 tokenizer_path: str = "", shares_learner_weights: bool = False):
    """Build the backend named by ``cfg.backend`` (a RolloutConfig).

    "hf": generation with ``model`` (``shares_learner_weights``: it is the learner's own module, so weight loads
    are no-ops); "vllm": one engine on this rank's GPU loaded from ``model_path`` (rank / world size from the
    launcher's environment).
    """
    if cfg.backend == "hf":
        from searchr1_lld.rollout.backends.hf import HFBackend

        if model is None or tokenizer is None:
            raise ValueError("rollout.backend=hf needs the model and tokenizer")
        return HFBackend(model, tokenizer, batch_size=cfg.generation_batch_size, seed=seed,
                         shares_learner_weights=shares_learner_weights)
    if cfg.backend == "vllm":
        from searchr1_lld.rollout.backends.vllm import VLLMBackend

        if not model_path:
            raise ValueError("rollout.backend=vllm needs model_path (a local HF model dir or hub id)")
        return VLLMBackend(model_path, tokenizer, cfg, seed=seed, dtype=dtype, tokenizer_path=tokenizer_path)
    raise ValueError(f"unknown rollout.backend {cfg.backend!r}; expected 'hf' or 'vllm'")
