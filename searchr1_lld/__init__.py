"""searchr1_lld: Search-R1 GRPO with Lazy-Likelihood-Displacement Shaping (LLDS)."""

__version__ = "0.1.0"
