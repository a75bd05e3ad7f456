"""Handler return values that choose an outcome other than "completed"."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from . import _awa

__all__ = ["MAX_DELAY_SECONDS", "Cancel", "RetryAfter", "Snooze", "WaitForCallback"]

#: The longest delay ``RetryAfter`` and ``Snooze`` accept: 10 years (315,360,000 seconds), the
#: engine's limit. Longer, negative, NaN or infinite delays raise ``awa.ValidationError``.
MAX_DELAY_SECONDS: int = _awa.MAX_OUTCOME_DELAY_SECONDS


def _check_delay(field: str, value: Any) -> float:
    """``value`` as seconds, or ``awa.ValidationError`` naming ``field`` and the limit."""
    limit = f"a finite number of seconds from 0 to {MAX_DELAY_SECONDS} (10 years)"
    if isinstance(value, bool):
        raise _awa.ValidationError(f"{field} must be {limit}, got {value!r}")
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        raise _awa.ValidationError(f"{field} must be {limit}, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DELAY_SECONDS:
        raise _awa.ValidationError(f"{field} must be {limit}, got {value!r}")
    return seconds


@dataclasses.dataclass(frozen=True)
class RetryAfter:
    """Run again after ``seconds``; burns an attempt.

    ``seconds`` must be finite, from 0 to 315,360,000 (10 years, ``MAX_DELAY_SECONDS``); anything else
    raises ``awa.ValidationError``."""

    seconds: float

    def __post_init__(self) -> None:
        _check_delay("RetryAfter.seconds", self.seconds)


@dataclasses.dataclass(frozen=True)
class Snooze:
    """Run again after ``seconds`` without burning an attempt.

    ``seconds`` must be finite, from 0 to 315,360,000 (10 years, ``MAX_DELAY_SECONDS``); anything else
    raises ``awa.ValidationError``."""

    seconds: float

    def __post_init__(self) -> None:
        _check_delay("Snooze.seconds", self.seconds)


@dataclasses.dataclass(frozen=True)
class Cancel:
    """Stop for good, recording ``reason``."""

    reason: str = "cancelled by handler"


@dataclasses.dataclass(frozen=True)
class WaitForCallback:
    """Park the job in ``waiting_external`` until the callback ``token`` resolves.

    Follow-ups staged in this attempt are discarded (the handler's context ends here)."""

    token: str
