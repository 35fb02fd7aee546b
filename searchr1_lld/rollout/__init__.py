"""Multi-turn Search-R1 rollout: the agent loop, trajectories, and generation backends (hf, vllm; their kinds)."""

from searchr1_lld.rollout.agent_loop import run_agent_loop
from searchr1_lld.rollout.types import Trajectory, TrajectoryBatch, to_batch

__all__ = ["run_agent_loop", "Trajectory", "TrajectoryBatch", "to_batch"]
