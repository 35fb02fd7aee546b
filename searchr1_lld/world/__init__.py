"""The synthetic search world: a fictional corpus no model can answer from memory, its QA splits, a retriever index,
a BPE tokenizer and a warm-started tiny Qwen2 policy -- everything the demo, the lab and the tests train on, built on a
CPU in minutes.

A plugin of the core, not part of it: the trainer, the rollout and the evaluator never import this package. The
world is built by its own command into a directory, and a run names the world's files in its own config keys
(:func:`trainer_overrides`)::

    python -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world

One job per module: ``config`` (WorldConfig, RECIPE_VERSION), ``generate`` (entities, passages), ``questions``
(the QA splits' questions), ``tokenizer``, ``trajectories`` / ``drills`` / ``renaming`` (the warm start's data),
``warm_start`` (the model and its supervised phase), ``scoring`` (what a trajectory did: format, first query, where
its answer came from), ``measure`` (the warm start through the real rollout), ``build`` (the directory, its card
``world.json`` and the build lock), ``shipped`` (a built policy exported, and installed into its own world
only), ``smollm2`` (the same world with a real pretrained policy).
"""

from searchr1_lld.world.build import (ensure_world, ensure_world_on_ranks, is_built, read_card, trainer_overrides,
                                      world_config_hash)
from searchr1_lld.world.config import RECIPE_VERSION, WorldConfig, load_world_config

__all__ = ["RECIPE_VERSION", "WorldConfig", "ensure_world", "ensure_world_on_ranks", "is_built", "load_world_config",
           "read_card", "trainer_overrides", "world_config_hash"]
