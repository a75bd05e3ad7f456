"""Handler return values that choose an outcome other than "completed", and the callback token."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Union

from . import _awa

__all__ = ["MAX_DELAY_SECONDS", "CallbackToken", "Cancel", "RetryAfter", "Snooze", "WaitForCallback", "callback_id_of"]

#: The longest delay ``RetryAfter`` and ``Snooze`` accept: 10 years (315,360,000 seconds), the
#: engine's limit. Longer, negative, NaN or infinite delays raise ``awa.ValidationError``.
MAX_DELAY_SECONDS: int = _awa.MAX_OUTCOME_DELAY_SECONDS


class DelayTypeError(_awa.ValidationError, TypeError):
    """A delay that is not a number: a ``TypeError`` as awa-pg raises, and a
    ``ValidationError`` as the rest of this package's bad values are."""


def _check_delay(field: str, value: Any) -> float:
    """``value`` as seconds, or ``awa.ValidationError`` naming ``field`` and the limit (also a
    ``TypeError`` when it is not a real number, as in awa-pg)."""
    limit = f"a finite number of seconds from 0 to {MAX_DELAY_SECONDS} (10 years)"
    if isinstance(value, bool):
        raise _awa.ValidationError(f"{field} must be {limit}, got {value!r}")
    if not isinstance(value, numbers.Real):
        raise DelayTypeError(f"{field} must be real number, not {type(value).__name__}: {limit}")
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        raise _awa.ValidationError(f"{field} must be {limit}, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DELAY_SECONDS:
        raise _awa.ValidationError(f"{field} must be {limit}, got {value!r}")
    return seconds


@dataclasses.dataclass(frozen=True)
class RetryAfter:
    """Run again after ``seconds`` (coerced to ``float``); burns an attempt.

    ``seconds`` must be finite, from 0 to 315,360,000 (10 years, ``MAX_DELAY_SECONDS``); anything else
    raises ``awa.ValidationError`` (a non-number also a ``TypeError``)."""

    seconds: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", _check_delay("RetryAfter.seconds", self.seconds))


@dataclasses.dataclass(frozen=True)
class Snooze:
    """Run again after ``seconds`` (coerced to ``float``) without burning an attempt.

    ``seconds`` must be finite, from 0 to 315,360,000 (10 years, ``MAX_DELAY_SECONDS``); anything else
    raises ``awa.ValidationError`` (a non-number also a ``TypeError``)."""

    seconds: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", _check_delay("Snooze.seconds", self.seconds))


@dataclasses.dataclass(frozen=True)
class Cancel:
    """Stop for good, recording ``reason`` (a ``str``; anything else is a ``TypeError``)."""

    reason: str = "cancelled by handler"

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str):
            raise TypeError(f"'{type(self.reason).__name__}' object is not an instance of 'str'")


@dataclasses.dataclass(frozen=True)
class CallbackToken:
    """What ``job.register_callback()`` returns: ``id`` is the callback id to hand to the
    external system (``complete_external(token.id, ...)``). ``str(token)`` is the id too."""

    id: str

    def __str__(self) -> str:
        return self.id


def callback_id_of(value: Union[CallbackToken, str], what: str = "callback_id") -> str:
    """The callback id of a token or of the id itself; ``TypeError`` for anything else."""
    if isinstance(value, CallbackToken):
        return value.id
    if isinstance(value, str):
        return value
    raise TypeError(f"{what} must be a CallbackToken or a str, not {type(value).__name__}")


@dataclasses.dataclass(frozen=True, init=False)
class WaitForCallback:
    """Park the job in ``waiting_external`` until the callback resolves.

    ``WaitForCallback(token)`` takes the ``CallbackToken`` from ``register_callback`` (as in
    awa-pg) or its id as a ``str``; ``callback_id`` (awa-pg's name) and ``token`` (this
    package's earlier name) both give the id. Follow-ups staged in this attempt are discarded
    (the handler's context ends here)."""

    token: str

    def __init__(self, token: Union[CallbackToken, str]) -> None:
        object.__setattr__(self, "token", callback_id_of(token, "token"))

    @property
    def callback_id(self) -> str:
        return self.token
