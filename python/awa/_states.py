"""Job states and the ``unique_opts["states"]`` bitmask (bit = position in ``JobState``)."""

from __future__ import annotations

import enum
from typing import Iterable, Union

__all__ = ["JobState", "DEFAULT_UNIQUE_STATES", "unique_states"]


class JobState(str, enum.Enum):
    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    COMPLETED = "completed"
    RETRYABLE = "retryable"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING_EXTERNAL = "waiting_external"

    @property
    def bit(self) -> int:
        return 1 << list(JobState).index(self)


def unique_states(states: Iterable[Union[JobState, str]]) -> int:
    """The bitmask for ``unique_opts["states"]`` selecting these states."""
    mask = 0
    for s in states:
        mask |= JobState(s).bit
    return mask


#: scheduled, available, running, completed, retryable: what ``unique_opts={}`` uses.
DEFAULT_UNIQUE_STATES = unique_states(
    [JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING, JobState.COMPLETED, JobState.RETRYABLE]
)
