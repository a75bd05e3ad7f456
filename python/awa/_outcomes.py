"""Handler return values that choose an outcome other than "completed"."""

from __future__ import annotations

import dataclasses

__all__ = ["RetryAfter", "Snooze", "Cancel", "WaitForCallback"]


@dataclasses.dataclass(frozen=True)
class RetryAfter:
    """Run again after ``seconds``; burns an attempt."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class Snooze:
    """Run again after ``seconds`` without burning an attempt."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class Cancel:
    """Stop for good, recording ``reason``."""

    reason: str = "cancelled by handler"


@dataclasses.dataclass(frozen=True)
class WaitForCallback:
    """Park the job in ``waiting_external`` until the callback ``token`` resolves.

    Follow-ups staged in this attempt are discarded (the handler's context ends here)."""

    token: str
