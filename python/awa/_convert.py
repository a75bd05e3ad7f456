"""Turning Python args and keyword options into the JSON request the engine validates.

Everything here runs while the caller holds the GIL; the result is one JSON string, so the
engine never needs to call back into Python to read a request.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import enum
import json
import uuid
from typing import Any, Callable, Mapping, Optional, Sequence

from . import _awa

__all__ = ["args_to_json_text", "build_request", "copy_batch", "derive_kind", "kind_for"]


def derive_kind(name: str) -> str:
    """CamelCase → snake_case, acronyms kept together (``SMTPEmail`` → ``smtp_email``)."""
    return _awa.derive_kind(name)


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _shallow_fields(value)
    if _is_pydantic(value):
        return value.model_dump(mode="json")
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, (_dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _shallow_fields(obj: Any) -> dict[str, Any]:
    # Nested dataclasses are converted by _json_default as json.dumps reaches them.
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _is_pydantic(obj: Any) -> bool:
    return hasattr(obj, "model_dump") and hasattr(type(obj), "model_fields")


_dumps = json.JSONEncoder(default=_json_default, allow_nan=False, separators=(",", ":")).encode


def args_to_json_text(args: Any) -> str:
    """Serialize a dataclass, a Pydantic model or a dict to JSON text."""
    try:
        if _is_pydantic(args):
            return args.model_dump_json()
        if dataclasses.is_dataclass(args) and not isinstance(args, type):
            return _dumps(_shallow_fields(args))
        if isinstance(args, Mapping):
            return _dumps(dict(args))
        raise TypeError(f"args must be a dataclass, a Pydantic model or a dict, not {type(args).__name__}")
    except (TypeError, ValueError) as exc:
        raise _awa.SerializationError(f"args do not convert to JSON: {exc}") from exc


def kind_for(args: Any, kind: Optional[str]) -> str:
    """The explicit kind, else the kind derived from the args' class name."""
    if kind is not None:
        return kind
    if isinstance(args, Mapping):
        raise _awa.ValidationError("kind is required when args is a dict")
    return derive_kind(type(args).__name__)


def _run_at_text(run_at: Optional[_dt.datetime]) -> Optional[str]:
    if run_at is None:
        return None
    if not isinstance(run_at, _dt.datetime):
        raise _awa.ValidationError(f"run_at must be a datetime, not {type(run_at).__name__}")
    if run_at.tzinfo is None:
        # A naive datetime is taken as UTC, the timezone the database stores.
        run_at = run_at.replace(tzinfo=_dt.timezone.utc)
    return run_at.isoformat()


def _options(
    *,
    queue: str = "default",
    priority: int = 2,
    max_attempts: int = 25,
    tags: Optional[Sequence[str]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    run_at: Optional[_dt.datetime] = None,
    unique_opts: Optional[Mapping[str, Any]] = None,
    ordering_key: Optional[str] = None,
) -> dict[str, Any]:
    """The insert options as JSON-ready values (the engine checks their ranges)."""
    options: dict[str, Any] = {
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "tags": list(tags) if tags is not None else [],
        "run_at": _run_at_text(run_at),
        "ordering_key": ordering_key,
    }
    if metadata is not None:
        try:
            options["metadata"] = json.loads(_dumps(dict(metadata)))
        except (TypeError, ValueError) as exc:
            raise _awa.SerializationError(f"metadata does not convert to JSON: {exc}") from exc
    if unique_opts is not None:
        options["unique_opts"] = dict(unique_opts)
    return options


def _options_text(options: Mapping[str, Any]) -> str:
    try:
        return json.dumps(options, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise _awa.ValidationError(f"invalid insert option: {exc}") from exc


def build_request(
    args: Any,
    *,
    kind: Optional[str] = None,
    queue: str = "default",
    priority: int = 2,
    max_attempts: int = 25,
    tags: Optional[Sequence[str]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    run_at: Optional[_dt.datetime] = None,
    unique_opts: Optional[Mapping[str, Any]] = None,
    ordering_key: Optional[str] = None,
) -> str:
    """Build the JSON request for one insert or staged follow-up: the options as a small JSON
    object with the args' JSON text spliced in (the args are serialized exactly once)."""
    request = {
        "kind": kind_for(args, kind),
        **_options(
            queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
        ),
    }
    args_text = args_to_json_text(args)
    head = _options_text(request)
    return '{"args":' + args_text + "," + head[1:]


def _plain_converter(cls: type) -> tuple[Callable[[Any], Any], Optional[str]]:
    """How to turn args of this class into JSON-ready values, and the kind the class name
    gives (``None`` for mappings, which need ``kind=``)."""
    if _is_pydantic_class(cls):
        # Through its own JSON, so the values are exactly what insert() stores
        # (model_dump_json writes NaN as null, model_dump would keep it).
        return (lambda args: json.loads(args.model_dump_json())), derive_kind(cls.__name__)
    if dataclasses.is_dataclass(cls):
        names = tuple(f.name for f in dataclasses.fields(cls))
        return (lambda args: {n: getattr(args, n) for n in names}), derive_kind(cls.__name__)
    if issubclass(cls, dict):
        return (lambda args: args), None
    if issubclass(cls, Mapping):
        return dict, None

    def reject(args: Any) -> Any:
        raise _awa.SerializationError(
            "args do not convert to JSON: args must be a dataclass, a Pydantic model or a dict, "
            f"not {type(args).__name__}"
        )

    return reject, None


def _is_pydantic_class(cls: type) -> bool:
    return hasattr(cls, "model_dump") and hasattr(cls, "model_fields")


def copy_batch(
    jobs: Sequence[Any],
    opts: Mapping[str, Any],
    own: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
) -> tuple[list[str], str, str, Optional[list[Optional[str]]]]:
    """The arguments of the native ``insert_many_copy``: one kind per job, every job's args as
    one JSON array (one encoder call for the whole batch), the shared options as JSON once, and
    for jobs given as ``(args, {options})`` their merged options (``None`` when no job has any).
    ``own`` is awa-pg's ``opts=``: one entry per job, ``None`` or that job's own options (the
    same as passing ``(args, {options})``).

    This is the cheap counterpart of building one JSON request per job: per job it costs a
    class lookup and a shallow dict; the engine validates every job as for ``insert_many``.
    """
    if own is not None:
        if len(own) != len(jobs):
            raise _awa.ValidationError(f"opts has {len(own)} entries for {len(jobs)} jobs")
        jobs = [job if extra is None else (job, extra) for job, extra in zip(jobs, own)]
    shared = dict(opts)
    shared_kind = shared.pop("kind", None)
    shared_text = _options_text(_options(**shared))
    converters: dict[type, tuple[Callable[[Any], Any], Optional[str]]] = {}
    kinds: list[str] = []
    plain: list[Any] = []
    own: dict[int, str] = {}
    for index, item in enumerate(jobs):
        kind = shared_kind
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
            args, extra = item
            merged = {**shared, **extra}
            kind = merged.pop("kind", shared_kind)
            own[index] = _options_text(_options(**merged))
        else:
            args = item
        cls = type(args)
        found = converters.get(cls)
        if found is None:
            found = converters[cls] = _plain_converter(cls)
        to_plain, derived = found
        plain.append(to_plain(args))
        if kind is None:
            if derived is None:
                raise _awa.ValidationError("kind is required when args is a dict")
            kind = derived
        kinds.append(kind)
    try:
        args_text = _dumps(plain)
    except (TypeError, ValueError) as exc:
        raise _awa.SerializationError(f"args do not convert to JSON: {exc}") from exc
    own_list = [own.get(i) for i in range(len(kinds))] if own else None
    return kinds, args_text, shared_text, own_list
