"""Durable batch operations: the dict shapes awa-pg names, and the conversion of a call's spec
and filter to the JSON text the engine checks (docs/batch-operations.md)."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Literal, Mapping, Optional, TypedDict, Union

BatchOperationKind = Literal["set_priority", "move_queue"]
BatchOperationState = Literal[
    "pending",
    "scanning",
    "running",
    "cancelling",
    "completed",
    "cancelled",
    "failed",
]


class BatchOperationFilter(TypedDict, total=False):
    """Which queued jobs an operation addresses; every given key must match."""

    kind: str
    queue: str
    ids: list[int]
    tag: str
    state: str
    created_at_gte: Union[_dt.datetime, str]
    created_at_lt: Union[_dt.datetime, str]


class BatchOperationPreview(TypedDict, total=False):
    """How many queued jobs match now, and the first ten of them (job dicts, by id)."""

    total_matched: int
    sample: list[dict[str, Any]]


class BatchOperation(TypedDict, total=False):
    """One row of ``awa.batch_operations``."""

    id: str
    op_kind: str
    filter: dict[str, Any]
    spec: dict[str, Any]
    state: str
    submitted_by: Optional[str]
    submitted_at: str
    started_at: Optional[str]
    finalized_at: Optional[str]
    cursor: Optional[dict[str, Any]]
    total_matched: Optional[int]
    processed: int
    skipped: int
    errored: int
    last_error: Optional[str]
    runner_instance: Optional[str]
    retention_until: Optional[str]
    updated_at: str


_TEXT_KEYS = ("kind", "queue", "tag", "state")
_INSTANT_KEYS = ("created_at_gte", "created_at_lt")


def instant_text(value: _dt.datetime) -> str:
    """A datetime as RFC 3339 text; a naive one is taken as UTC, as ``run_at`` is."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.isoformat()


def _type_error(what: str, expected: str, value: Any) -> TypeError:
    return TypeError(f"{what} must be {expected}, not {type(value).__name__}")


def filter_json(filter: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The filter as JSON text: datetimes become RFC 3339 text; a value of the wrong Python
    type raises ``TypeError`` (as awa-pg's does). Keys and values are checked by the engine
    (an unknown key, a state other than available/scheduled, a malformed timestamp:
    ``awa.ValidationError``)."""
    if filter is None:
        return None
    if not isinstance(filter, Mapping):
        raise _type_error("filter", "a dict", filter)
    out: dict[str, Any] = {}
    for key, value in filter.items():
        if not isinstance(key, str):
            raise _type_error("a filter key", "a str", key)
        if value is None:
            out[key] = None
        elif key in _TEXT_KEYS:
            if not isinstance(value, str):
                raise _type_error(f"filter {key}", "a str", value)
            out[key] = value
        elif key == "ids":
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise _type_error("filter ids", "a list of int", value)
            ids = list(value)
            for i in ids:
                if isinstance(i, bool) or not isinstance(i, int):
                    raise _type_error("filter ids entries", "int", i)
            out[key] = ids
        elif key in _INSTANT_KEYS:
            if isinstance(value, _dt.datetime):
                out[key] = instant_text(value)
            elif isinstance(value, str):
                out[key] = value
            else:
                raise _type_error(f"filter {key}", "a datetime or an RFC 3339 str", value)
        else:
            out[key] = value  # the engine names the unknown key
    return json.dumps(out, default=str)


def spec_json(spec: Mapping[str, Any]) -> str:
    """The spec as JSON text; ``priority`` must be an int and ``queue`` a str (else
    ``TypeError``); ranges and unknown keys are the engine's to check."""
    if not isinstance(spec, Mapping):
        raise _type_error("spec", "a dict", spec)
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if not isinstance(key, str):
            raise _type_error("a spec key", "a str", key)
        if key == "priority" and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise _type_error("priority", "an int", value)
        if key in ("queue", "op_kind") and value is not None and not isinstance(value, str):
            raise _type_error(key, "a str", value)
        out[key] = value
    return json.dumps(out, default=str)
