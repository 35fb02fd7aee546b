"""The synthetic world as a run trains on it (``train.py --world``): the world's config keys for ``--help-config``
and the run-config overrides that name its policy, index and splits."""

from __future__ import annotations

from searchr1_lld.config import format_help
from searchr1_lld.world.build import ensure_world_on_ranks, trainer_overrides
from searchr1_lld.world.config import WorldConfig, load_world_config


class TrainingWorld:
    """The :class:`searchr1_lld.learner.command.WorldSource` that train.py hands the run."""

    def reference(self) -> str:
        """The run config's keys, then the synthetic world's (configs/world/*.yaml, train.py --world)."""
        return (format_help() + "\n# The synthetic world (configs/world/*.yaml, train.py --world FILE):\n\n"
                + format_help(WorldConfig, prefix="world."))

    def overrides(self, world_config: str, world_dir: str, build: bool) -> list[str]:
        """``build``: build (local rank 0) or wait for (the other ranks) the world of ``world_config`` in
        ``world_dir``; the run-config overrides that train on it."""
        if build:
            ensure_world_on_ranks(world_dir, load_world_config(world_config))
        return trainer_overrides(world_dir)
