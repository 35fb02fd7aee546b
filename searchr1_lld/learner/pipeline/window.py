"""The staleness window of a pipelined run (trainer.staleness = k >= 1): which steps' rollouts are requested when,
which are in flight, and the bound every batch keeps. No processes here (the transport is rollouts.py's).

Versions count the learner's rollout steps trained: the weights published after step t's update are version t + 1,
the initial ones version 0 (a resumed run at step s publishes version s first). A worker loads the newest published
version when it starts a request and stamps every trajectory with it.

Schedule: before step ``start`` waits for its batch, the rollouts of steps ``start .. start + k - 1`` are requested;
once step t's batch has arrived (before its update), step t + k's is requested. A request made then is served with
version >= t (the version published before it), and trained at step t + k, so

    staleness = (step trained) - (version generated) <= k                         (the bound; checked on every batch)

With k = 1 this is one-step off-policy: step t + 1's rollout runs beside step t's update, with version t.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from searchr1_lld.rollout.types import Trajectory


class StalenessError(RuntimeError):
    """A batch held a trajectory older than the bound (a bug of the schedule or the transport, never silent)."""


@dataclass
class RolloutRequest:
    """One step's rollout, as the learner asks a worker for it."""

    step: int  # the step that will train it
    rows: list[dict[str, Any]]  # its prompt rows (this rank's share)
    seed: int  # the step's seed (learner/step.step_seed): each request's sampling seed derives from it


@dataclass
class RolloutResult:
    """One step's rollout, as a worker returns it."""

    step: int
    trajectories: list[Trajectory]  # each stamped with ``version`` (Trajectory.policy_version)
    version: int  # the weights' version the worker generated with
    published_at_end: int  # the newest version published when the worker finished it
    rollout_s: float  # seconds the worker spent generating it
    engine_wait_s: float  # seconds the worker waited for this request after its previous one (engine idle)
    timings: dict[str, float] = field(default_factory=dict)  # the agent loop's (generate_s, retrieve_s, ...)


@dataclass
class RolloutFailure:
    """What a worker returns instead of a result when its engine or its rollout raised: the error, as text (the run
    stops with it; a restart would fail the same way)."""

    error: str


def staleness_metrics(result: RolloutResult, step: int) -> dict[str, float]:
    """The staleness of the batch that step ``step`` trains: per trajectory, ``step - policy_version`` (mean and
    max), and the version lag, ``published_at_end - version``: the versions the learner published while the worker
    generated the batch (0: the learner did not update meanwhile)."""
    ages = [step - int(t.policy_version) for t in result.trajectories]
    return {"async/staleness_mean": sum(ages) / max(len(ages), 1), "async/staleness_max": float(max(ages, default=0)),
            "async/version_lag": float(result.published_at_end - result.version)}


def check_bound(result: RolloutResult, step: int, staleness: int) -> None:
    """StalenessError unless every trajectory of ``result`` was generated at most ``staleness`` versions before
    ``step`` (and none by weights newer than the step's)."""
    ages = [step - int(t.policy_version) for t in result.trajectories]
    if any(a > staleness or a < 0 for a in ages):
        versions = sorted({t.policy_version for t in result.trajectories})
        raise StalenessError(f"step {step} received trajectories of versions {versions}: outside "
                             f"[{step - staleness}, {step}] (trainer.staleness={staleness})")


class StalenessWindow:
    """The requests of a pipelined run: which to make next, which are in flight (requested, not yet trained), and the
    prompt sampler's state before each (a checkpoint saves the oldest, so a resumed run draws the rows of the
    in-flight requests again and generates them anew: none is trained twice, none skipped)."""

    def __init__(self, staleness: int, start: int) -> None:
        if staleness < 1:
            raise ValueError(f"a staleness window needs staleness >= 1, got {staleness}")
        self.staleness = staleness
        self.next_request = start  # the step whose rollout is requested next
        self.in_flight: dict[int, RolloutRequest] = {}
        self.sampler_before: dict[int, dict[str, Any]] = {}

    def due(self, step: int, received: bool) -> list[int]:
        """The steps to request now, while step ``step`` waits for its batch (``received`` False) or has it (True):
        through ``step + k - 1``, or through ``step + k`` once it has it (module docstring)."""
        last = step + self.staleness - (0 if received else 1)
        return list(range(self.next_request, last + 1))

    def add(self, request: RolloutRequest, sampler_before: dict[str, Any]) -> None:
        """``request`` made (its rows drawn after the sampler stood at ``sampler_before``)."""
        if request.step != self.next_request:
            raise ValueError(f"requests go in step order: expected step {self.next_request}, got {request.step}")
        self.in_flight[request.step] = request
        self.sampler_before[request.step] = sampler_before
        self.next_request += 1

    def take(self, result: RolloutResult) -> bool:
        """Whether ``result`` is the first answer to a request in flight (then it leaves the window); a duplicate (a
        restarted worker's) or an unknown step is False."""
        if result.step not in self.in_flight:
            return False
        del self.in_flight[result.step]
        self.sampler_before.pop(result.step, None)
        return True

    def requests(self) -> list[RolloutRequest]:
        """The requests in flight, oldest first (a restarted worker gets them again)."""
        return [self.in_flight[s] for s in sorted(self.in_flight)]

    def sampler_state_to_save(self, current: dict[str, Any]) -> dict[str, Any]:
        """The prompt sampler's state a checkpoint records: before the oldest request in flight, else ``current``."""
        return self.sampler_before[min(self.sampler_before)] if self.sampler_before else current
