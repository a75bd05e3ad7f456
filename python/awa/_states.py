"""Job states and the ``unique_opts["states"]`` bitmask (bit = position in ``JobState``)."""

from __future__ import annotations

import enum
from typing import Iterable, Union

__all__ = ["JobState", "DEFAULT_UNIQUE_STATES", "unique_states"]


class JobState(str, enum.Enum):
    """A job's state, with awa-pg's member names (``JobState.Available``).

    ``str(state)`` is the database value (``"available"``) and ``int(state)`` its position
    (``Scheduled`` is 0), as in awa-pg. Unlike awa-pg's native enum the members are also
    strings (``JobState.Available == "available"``) and hashable. The upper-case names
    (``JobState.AVAILABLE``) are aliases kept from earlier releases of this package."""

    Scheduled = "scheduled"
    Available = "available"
    Running = "running"
    Completed = "completed"
    Retryable = "retryable"
    Failed = "failed"
    Cancelled = "cancelled"
    WaitingExternal = "waiting_external"

    # Aliases (same values: enum makes them the members above).
    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    COMPLETED = "completed"
    RETRYABLE = "retryable"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING_EXTERNAL = "waiting_external"

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return f"JobState.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __int__(self) -> int:
        return _POSITION[self.value]

    def __index__(self) -> int:
        return _POSITION[self.value]

    @property
    def bit(self) -> int:
        """This state's bit in a ``unique_opts["states"]`` mask."""
        return 1 << int(self)


_POSITION = {s.value: i for i, s in enumerate(JobState)}


def unique_states(states: Iterable[Union[JobState, str]]) -> int:
    """The bitmask for ``unique_opts["states"]`` selecting these states."""
    mask = 0
    for s in states:
        mask |= JobState(s).bit
    return mask


#: scheduled, available, running, completed, retryable: what ``unique_opts={}`` uses.
DEFAULT_UNIQUE_STATES = unique_states(
    [JobState.Scheduled, JobState.Available, JobState.Running, JobState.Completed, JobState.Retryable]
)
