"""``AsyncClient.start()``'s queue list and keywords, checked and turned into the JSON the
native runtime reads (docs/workers.md).

Shapes are checked here with awa-pg 0.6.9's exception classes and messages (``TypeError``
for a queue entry or ``rate_limit`` of the wrong shape; ``awa.ConfigError``, which is both
``awa.ValidationError`` and ``ValueError``, for a missing name, a wrong mode, an unknown key or
a queue a ``@task`` uses that the list leaves out). Every number goes through the engine's
range table (``check_setting``), so its error names the field and the allowed range.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

from . import _awa
from ._convert import checked_setting

#: Keys a queue dict may have: awa-pg 0.6.9's, plus Awa's ``deadline_ms`` (an alias of
#: ``deadline_duration_ms``) and ``dlq``.
QUEUE_KEYS = frozenset(
    {
        "name",
        "max_workers",
        "min_workers",
        "weight",
        "rate_limit",
        "priority_aging_interval_ms",
        "deadline_duration_ms",
        "deadline_ms",
        "claimers",
        "claim_batch_size",
        "dlq",
    }
)

#: Default workers of a queue ``start()`` derives from the registered tasks (``queues=None``).
DEFAULT_MAX_WORKERS = 10

_RATE_LIMIT_SHAPE = "rate_limit must be a (max_rate: float, burst: int) tuple or None"
_ENTRY_SHAPE = "queue config must be a (name, max_workers) tuple or a dict"


def _error(message: str) -> Exception:
    return _awa.ConfigError(message)


def _number(queue: str, key: str, value: Any) -> float:
    try:
        return checked_setting(key, value)
    except _awa.ValidationError as exc:
        raise _error(f"queue {queue!r}: {exc}") from None


def _count(queue: str, key: str, value: Any) -> int:
    return int(_number(queue, key, value))


def _rate_limit(queue: str, value: Any) -> Optional[list[float]]:
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(_RATE_LIMIT_SHAPE)
    max_rate, burst = value
    return [
        _number(queue, "rate_limit.max_rate", max_rate),
        float(_count(queue, "rate_limit.burst", burst)),
    ]


def _from_dict(spec: Mapping[Any, Any], weighted_mode: bool) -> dict[str, Any]:
    if "name" not in spec:
        raise _error("queue config dict must have 'name' key")
    name = spec["name"]
    if not isinstance(name, str):
        raise TypeError(f"queue config 'name' must be a str, not {type(name).__name__}")
    if not name:
        raise _error("queue config 'name' must not be empty")
    unknown = sorted(str(k) for k in spec if k not in QUEUE_KEYS)
    if unknown:
        raise _error(
            f"queue {name!r}: unknown queue config key(s) {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(sorted(QUEUE_KEYS))}"
        )
    has_max = spec.get("max_workers") is not None
    has_weighted = spec.get("min_workers") is not None or spec.get("weight") is not None
    if has_max and has_weighted:
        raise _error("use max_workers for hard-reserved mode or min_workers for weighted mode, not both")
    out: dict[str, Any] = {"name": name}
    if has_max:
        out["max_workers"] = _count(name, "max_workers", spec["max_workers"])
    elif not weighted_mode:
        if has_weighted:
            raise _error(
                f"queue {name!r}: min_workers and weight need global_max_workers (weighted mode); "
                "without it give max_workers (hard-reserved mode)"
            )
        raise _error("max_workers required in hard-reserved mode (no global_max_workers set)")
    else:
        min_workers = spec.get("min_workers")
        weight = spec.get("weight")
        out["min_workers"] = 0 if min_workers is None else _count(name, "min_workers", min_workers)
        out["weight"] = 1 if weight is None else _count(name, "weight", weight)
    deadline = spec.get("deadline_duration_ms")
    alias = spec.get("deadline_ms")
    if deadline is not None and alias is not None:
        raise _error(f"queue {name!r}: give deadline_duration_ms or deadline_ms, not both")
    if deadline is not None:
        out["deadline_ms"] = _number(name, "deadline_duration_ms", deadline)
    elif alias is not None:
        out["deadline_ms"] = _number(name, "deadline_ms", alias)
    rate = _rate_limit(name, spec.get("rate_limit"))
    if rate is not None:
        out["rate_limit"] = rate
    for key in ("claimers", "claim_batch_size"):
        if spec.get(key) is not None:
            out[key] = _count(name, key, spec[key])
    if spec.get("priority_aging_interval_ms") is not None:
        out["priority_aging_interval_ms"] = _number(
            name, "priority_aging_interval_ms", spec["priority_aging_interval_ms"]
        )
    dlq = spec.get("dlq")
    if dlq is not None:
        if not isinstance(dlq, bool):
            raise TypeError(f"queue {name!r}: dlq must be a bool, not {type(dlq).__name__}")
        out["dlq"] = dlq
    return out


def queue_specs(
    queues: Optional[Sequence[Any]],
    task_queues: Iterable[str],
    global_max_workers: Optional[int],
) -> list[dict[str, Any]]:
    """The checked queue list: each entry a dict the native runtime reads."""
    declared = set(task_queues)
    weighted_mode = global_max_workers is not None
    if queues is None:
        if weighted_mode:
            raise _error("weighted mode requires explicit queue configs (global_max_workers set but queues=None)")
        return [{"name": q, "max_workers": DEFAULT_MAX_WORKERS} for q in sorted(declared)]
    if isinstance(queues, (str, bytes, Mapping)):
        raise TypeError("queues must be a list of (name, max_workers) tuples or dicts")
    parsed: list[dict[str, Any]] = []
    for entry in queues:
        if isinstance(entry, Mapping):
            parsed.append(_from_dict(entry, weighted_mode))
            continue
        if not isinstance(entry, (tuple, list)) or len(entry) != 2 or not isinstance(entry[0], str):
            raise TypeError(_ENTRY_SHAPE)
        if weighted_mode:
            raise _error("tuple queue config is not supported with global_max_workers; use dict form with min_workers/weight")
        parsed.append(_from_dict({"name": entry[0], "max_workers": entry[1]}, weighted_mode))
    seen: set[str] = set()
    for spec in parsed:
        if spec["name"] in seen:
            raise _error(f"queue {spec['name']!r} configured more than once")
        seen.add(spec["name"])
    missing = sorted(declared - seen)
    if missing:
        raise _error(
            "start() must configure the worker queues declared via @client.worker(..., queue=...): "
            + ", ".join(missing)
        )
    return parsed


#: ``start()`` keywords that set the runtime (milliseconds, hours), in the engine's names.
RUNTIME_KEYWORDS = (
    "poll_interval_ms",
    "heartbeat_interval_ms",
    "heartbeat_staleness_ms",
    "heartbeat_rescue_interval_ms",
    "deadline_rescue_interval_ms",
    "callback_rescue_interval_ms",
    "promote_interval_ms",
    "leader_election_interval_ms",
    "prune_interval_ms",
    "finalize_deadline_ms",
    "completed_retention_hours",
    "failed_retention_hours",
)

#: Whole-number ``start()`` keywords.
COUNT_KEYWORDS = ("global_max_workers", "cleanup_batch_size", "claim_batch", "completion_batch")

#: Keywords awa-pg 0.6.9 accepts that configure what Awa's canonical engine does not have
#: (queue storage's terminal counters): range-checked, then unused.
ACCEPTED_WITHOUT_EFFECT = ("terminal_count_rollup_interval_ms",)


def _keyword(key: str, value: Any) -> float:
    try:
        return checked_setting(key, value)
    except _awa.ValidationError as exc:
        raise _error(str(exc)) from None


def start_config(
    queues: Optional[Sequence[Any]], task_queues: Iterable[str], settings: Mapping[str, Any]
) -> dict[str, Any]:
    """The whole ``start()`` configuration: queues plus every keyword that was given."""
    counts: dict[str, int] = {}
    for key in COUNT_KEYWORDS:
        if settings.get(key) is not None:
            counts[key] = int(_keyword(key, settings[key]))
    intervals = {
        key: _keyword(key, settings[key]) for key in RUNTIME_KEYWORDS if settings.get(key) is not None
    }
    for key in ACCEPTED_WITHOUT_EFFECT:
        if settings.get(key) is not None:
            _keyword(key, settings[key])
    parsed = queue_specs(queues, task_queues, counts.get("global_max_workers"))
    out: dict[str, Any] = {"queues": parsed, "intervals": intervals, **counts}
    if settings.get("descriptor_retention_days") is not None:
        # Days; 0 keeps descriptors for good (awa-pg's meaning).
        out["descriptor_retention_days"] = _keyword("descriptor_retention_days", settings["descriptor_retention_days"])
    return out


#: ``storage_transition_role`` values (awa-pg's).
TRANSITION_ROLES = ("auto", "canonical_drain", "queue_storage_target")


def queue_storage_config(
    schema: Optional[str],
    counts: Mapping[str, Any],
    intervals: Mapping[str, Any],
    role: Optional[str],
) -> dict[str, Any]:
    """``start()``'s ``queue_storage_*`` keywords and ``storage_transition_role``, checked
    (docs/storage-transition.md). A count or interval that is not positive raises ``awa.ConfigError``
    (a ``ValueError``) with awa-pg's message; the claim-ring and stripe settings are checked
    and have no effect (this engine has neither; docs/queue-storage-design.md)."""
    checked: dict[str, float] = {}
    for key, value in [*counts.items(), *intervals.items()]:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise _error(f"{key} must be > 0")
        checked[key] = _keyword(key, value)
    if schema is not None and not isinstance(schema, str):
        raise TypeError(f"queue_storage_schema must be a str or None (got {type(schema).__name__})")
    if role is not None and role not in TRANSITION_ROLES:
        raise _error(
            "storage_transition_role must be one of 'auto', 'canonical_drain', or "
            f"'queue_storage_target' (got {role!r})"
        )
    return {
        "schema": schema,
        "queue_slot_count": checked["queue_storage_queue_slot_count"],
        "lease_slot_count": checked["queue_storage_lease_slot_count"],
        "queue_rotate_interval_ms": checked["queue_storage_queue_rotate_interval_ms"],
        "lease_rotate_interval_ms": checked["queue_storage_lease_rotate_interval_ms"],
        "transition_role": role,
    }
