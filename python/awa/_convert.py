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
import math
import re
import uuid
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from . import _awa

__all__ = [
    "MAX_JSON_DEPTH", "OrderingKey", "RunAt", "args_to_json_text", "build_request",
    "checked_setting", "copy_batch", "derive_kind", "json_text", "kind_for", "run_at_text",
]

MAX_JSON_DEPTH: int = _awa.MAX_JSON_DEPTH
"""Deepest nesting of lists and dicts accepted in args, metadata and payloads (the value
itself is level 1); deeper values raise ``awa.ValidationError`` naming the limit."""

# Integers the engine stores exactly (serde_json keeps i64 and u64; anything wider would
# silently become a float). Outside this range a value is refused, never rounded.
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
# Any integer outside the range has at least 19 digits: texts without such a run skip the walk.
_LONG_DIGITS = re.compile(r"\d{19}")


def derive_kind(name: str) -> str:
    """CamelCase → snake_case, acronyms kept together (``SMTPEmail`` → ``smtp_email``)."""
    return _awa.derive_kind(name)


def checked_setting(field: str, value: Any) -> float:
    """A numeric setting (interval, timeout, count) checked against the engine's range for
    ``field``: ``awa.ValidationError`` names the field and the range for NaN, infinite,
    negative, out-of-range or non-numeric values, before any of them reaches a Rust
    ``Duration``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):
        raise _awa.ValidationError(f"{field} must be a number, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        number = float("inf") if value > 0 else float("-inf")
    return float(_awa.check_setting(field, number))


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
_dumps_with_nan = json.JSONEncoder(default=_json_default, allow_nan=True, separators=(",", ":")).encode


def _segment(key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f".{key}"
    return f"[{json.dumps(key)}]"


def _unstorable(value: Any, root: str) -> Optional[str]:
    """The first value JSON cannot store exactly, described with its path (``args.items[3].n``),
    or None. ``value`` is plain JSON data (dicts, lists, scalars)."""
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                return (
                    f"{path} is an integer beyond 64 bits ({item}); it cannot be stored exactly "
                    f"(the range is {_INT_MIN} to {_INT_MAX}): pass it as a string"
                )
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{path} is {item}; JSON cannot hold NaN or infinite numbers"
        elif isinstance(item, dict):
            stack.extend((v, path + _segment(k)) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def _too_deep(what: str) -> Any:
    return _awa.ValidationError(
        f"{what} nests deeper than {MAX_JSON_DEPTH} levels of lists and dicts, the limit "
        "(awa.MAX_JSON_DEPTH)"
    )


def _check_text(text: str, what: str) -> str:
    """Refuse an encoded document holding an integer the engine would round."""
    if _LONG_DIGITS.search(text):
        problem = _unstorable(json.loads(text), what)
        if problem is not None:
            raise _awa.ValidationError(problem)
    return text


def json_text(value: Any, what: str) -> str:
    """Encode ``value`` (dicts, lists, dataclasses, ... see ``_json_default``) as JSON text the
    engine stores exactly. ``awa.ValidationError`` names the path of an integer beyond 64 bits
    or a NaN/infinite float, or the nesting limit; ``awa.SerializationError`` for a value
    JSON has no form for."""
    try:
        text = _dumps(value)
    except RecursionError:
        raise _too_deep(what) from None
    except ValueError as exc:
        problem = None
        try:
            problem = _unstorable(json.loads(_dumps_with_nan(value)), what)
        except (TypeError, ValueError, RecursionError):
            pass
        if problem is not None:
            raise _awa.ValidationError(problem) from None
        raise _awa.SerializationError(f"{what} does not convert to JSON: {exc}") from exc
    except TypeError as exc:
        raise _awa.SerializationError(f"{what} does not convert to JSON: {exc}") from exc
    return _check_text(text, what)


def args_to_json_text(args: Any) -> str:
    """Serialize a dataclass, a Pydantic model or a dict to JSON text (see :func:`json_text`
    for what is refused)."""
    if _is_pydantic(args):
        try:
            text: str = args.model_dump_json()
        except RecursionError:
            raise _too_deep("args") from None
        except (TypeError, ValueError) as exc:
            raise _awa.SerializationError(f"args do not convert to JSON: {exc}") from exc
        return _check_text(text, "args")
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return json_text(_shallow_fields(args), "args")
    if isinstance(args, Mapping):
        return json_text(dict(args), "args")
    raise _not_args(args)


def _not_args(args: Any) -> Exception:
    # A ValidationError, as awa-pg raises for the same input: the value is of a type args can
    # never be, not one JSON failed to encode.
    return _awa.ValidationError(
        f"args must be a dataclass, a Pydantic model or a dict, not {type(args).__name__}"
    )


def kind_for(args: Any, kind: Optional[str]) -> str:
    """The explicit kind, else the kind derived from the args' class name."""
    if kind is not None:
        return kind
    if isinstance(args, Mapping):
        raise _awa.ValidationError("kind is required when args is a dict")
    return derive_kind(type(args).__name__)


RunAt = Union[_dt.datetime, str]
"""``run_at``: a ``datetime`` (naive means UTC) or an RFC 3339 string
(``"2099-01-01T00:00:00Z"``, with a ``Z`` or an offset), as awa-pg accepts."""

OrderingKey = Union[str, bytes]
"""``ordering_key``: a ``str``, or UTF-8 ``bytes`` (awa-pg's type; Awa stores it as text)."""


# Date, time, optional fraction, and a Z or numeric offset: what chrono's RFC 3339 parser takes.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})\Z")


def run_at_text(run_at: Optional[RunAt]) -> Optional[str]:
    """``run_at`` as the RFC 3339 text the engine parses; a string is passed through for the
    engine to check (strictly: a date alone or a missing offset is refused)."""
    if run_at is None:
        return None
    if isinstance(run_at, str):
        if not _RFC3339.match(run_at):
            raise _awa.ValidationError(
                f"run_at {run_at!r} is not an RFC 3339 timestamp with an offset (e.g. 2099-01-01T00:00:00Z)"
            )
        return run_at
    if not isinstance(run_at, _dt.datetime):
        raise _awa.ValidationError(f"run_at must be a datetime or an RFC 3339 string, not {type(run_at).__name__}")
    if run_at.tzinfo is None:
        # A naive datetime is taken as UTC, the timezone the database stores.
        run_at = run_at.replace(tzinfo=_dt.timezone.utc)
    return run_at.isoformat()


def _ordering_key_text(key: Optional[OrderingKey]) -> Optional[str]:
    if key is None or isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray, memoryview)):
        try:
            return bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            raise _awa.ValidationError(
                "ordering_key bytes must be UTF-8 text (Awa stores the key as text)"
            ) from None
    raise _awa.ValidationError(f"ordering_key must be a str or bytes, not {type(key).__name__}")


def _tags_list(tags: Optional[Sequence[str]]) -> list[str]:
    if tags is None:
        return []
    # A str is a Sequence of str too: without this check "urgent" would become 6 tags.
    if isinstance(tags, (str, bytes)) or not isinstance(tags, (Sequence, set, frozenset)):
        raise _awa.ValidationError(f"tags must be a list of str, not {type(tags).__name__}")
    out = list(tags)
    for i, tag in enumerate(out):
        if not isinstance(tag, str):
            raise _awa.ValidationError(f"tags[{i}] must be a str, not {type(tag).__name__}")
    return out


def _options(
    *,
    queue: str = "default",
    priority: int = 2,
    max_attempts: int = 25,
    tags: Optional[Sequence[str]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    run_at: Optional[RunAt] = None,
    unique_opts: Optional[Mapping[str, Any]] = None,
    ordering_key: Optional[OrderingKey] = None,
) -> dict[str, Any]:
    """The insert options as JSON-ready values (the engine checks their ranges)."""
    options: dict[str, Any] = {
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "tags": _tags_list(tags),
        "run_at": run_at_text(run_at),
        "ordering_key": _ordering_key_text(ordering_key),
    }
    if metadata is not None:
        options["metadata"] = json.loads(json_text(dict(metadata), "metadata"))
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
    run_at: Optional[RunAt] = None,
    unique_opts: Optional[Mapping[str, Any]] = None,
    ordering_key: Optional[OrderingKey] = None,
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
        raise _not_args(args)

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
        jobs = [job if extra is None else (job, extra) for job, extra in zip(jobs, own, strict=True)]
    shared = dict(opts)
    shared_kind = shared.pop("kind", None)
    shared_text = _options_text(_options(**shared))
    converters: dict[type, tuple[Callable[[Any], Any], Optional[str]]] = {}
    kinds: list[str] = []
    plain: list[Any] = []
    own_texts: dict[int, str] = {}
    for index, item in enumerate(jobs):
        kind = shared_kind
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
            args, extra = item
            merged = {**shared, **extra}
            kind = merged.pop("kind", shared_kind)
            own_texts[index] = _options_text(_options(**merged))
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
        args_text = json_text(plain, "args")
    except _awa.ValidationError:
        # Name the job: the batch's args are one document, the user thinks of them per job.
        for index, item in enumerate(plain):
            try:
                json_text(item, "args")
            except _awa.ValidationError as exc:
                raise _awa.ValidationError(f"jobs[{index}]: {exc}") from None
        raise
    own_list = [own_texts.get(i) for i in range(len(kinds))] if own_texts else None
    return kinds, args_text, shared_text, own_list
