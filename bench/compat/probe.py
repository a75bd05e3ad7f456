"""Compatibility probe: record what the installed ``awa`` package looks like and how it behaves.

Run once under each virtualenv (awa-pg 0.6.9, then ours) and compare the two JSON files with
``diff.py``. The script imports nothing from this repository: it only sees the installed
``awa`` package, so the same file measures both.

Two parts:

* **surface** - every public name of ``awa`` (``__all__`` plus other public attributes), each
  class's public members (kind: method / property / field / enum member / attribute) and every
  callable's ``inspect.signature`` (parameter names, kinds, defaults); the same for the
  ``awa.testing``, ``awa.bridge`` and ``awa.callback_contract`` submodules.
* **probes** - a fixed, ordered list of behaviour checks run against a fresh database created for
  this run (and dropped afterwards). Each records deterministic observations: a value's type or
  shape, a state name, or the exception class with its hierarchy. Every probe is isolated (one
  failure never stops the run) and has a timeout (a hung call is recorded as ``Timeout``).

Usage::

    python probe.py --database-url postgres://postgres@127.0.0.1:5432/postgres --out result.json
    python probe.py ... --reference awa-pg.json   # also resolve the reference's client members
                                                  # through instance attribute lookup
    python probe.py --foreign-schema-url URL --out f.json  # only: migrate/insert on a database
                                                           # another package already migrated
"""

# The probe records whatever a call raises, so it catches every Exception on purpose.
# ruff: noqa: BLE001, S110, S112

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import enum
import importlib
import importlib.metadata as md
import inspect
import json
import math
import os
import re
import sys
import time
import traceback
import uuid
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import awa

# --------------------------------------------------------------------------------------------
# Describing values and errors
# --------------------------------------------------------------------------------------------

#: Members inherited from these bases are not part of a package's own surface.
_BASES = (object, BaseException, Exception, str, int, dict, tuple, list, enum.Enum, enum.IntEnum)
_PROTOCOL = ("__aenter__", "__aexit__", "__enter__", "__exit__", "__bool__", "__len__", "__iter__",
             "__await__", "__call__")


def tname(value: Any) -> str:
    return "None" if value is None else type(value).__name__


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def describe_error(exc: BaseException) -> dict[str, Any]:
    """The exception class, its hierarchy up to ``Exception`` and a short message (callback
    ids in it replaced by ``<uuid>``, so that two runs give the same text)."""
    mro = [c.__name__ for c in type(exc).__mro__ if c not in (object, BaseException)]
    return {"raises": type(exc).__name__, "mro": mro, "message": _UUID.sub("<uuid>", str(exc))[:300]}


def state_name(state: Any) -> Any:
    """A job state as its lowercase name, whatever its type (enum, native enum or str)."""
    if state is None:
        return None
    if isinstance(state, enum.Enum) and isinstance(state.value, str):
        return state.value
    return str(state)


def shape(value: Any, depth: int = 0) -> Any:
    """A deterministic, value-free description of ``value``'s structure."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return f"bool:{value}"
    # Before the enum and str checks: awa-pg's JobState is a native enum and ours a str Enum;
    # both are described by their str() (the state's value), so the same state compares equal.
    if type(value).__name__ == "JobState":
        return f"JobState:{value}"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}:{value.name}"
    if isinstance(value, (int, float, str, bytes)):
        return type(value).__name__
    if isinstance(value, dt.datetime):
        return "datetime(aware)" if value.tzinfo is not None else "datetime(naive)"
    if isinstance(value, (list, tuple)):
        inner = [shape(value[0], depth + 1)] if value and depth < 3 else []
        return {type(value).__name__: inner, "len": len(value)}
    if isinstance(value, dict):
        if depth >= 3:
            return {"dict": "...", "len": len(value)}
        return {"dict": {str(k): shape(v, depth + 1) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}}
    if depth >= 2:
        return tname(value)
    attrs: dict[str, Any] = {}
    for name in dir(value):
        if name.startswith("_"):
            continue
        try:
            attr = getattr(value, name)
        except Exception as exc:  # a property that raises is itself an observation
            attrs[name] = {"raises": type(exc).__name__}
            continue
        if callable(attr) and not isinstance(attr, enum.Enum):
            continue
        attrs[name] = shape(attr, depth + 1)
    return {"obj": tname(value), "attrs": attrs}


# --------------------------------------------------------------------------------------------
# Surface
# --------------------------------------------------------------------------------------------


def _default(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return "<required>"
    if value is Ellipsis:
        return "<native default>"  # PyO3 text signatures show non-literal defaults as "..."
    return repr(value)[:80]


def describe_callable(obj: Any, drop_self: bool) -> dict[str, Any]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError) as exc:
        return {"signature": None, "signature_error": type(exc).__name__}
    params = []
    for i, p in enumerate(sig.parameters.values()):
        if drop_self and i == 0 and p.name in ("self", "cls"):
            continue
        params.append({"name": p.name, "kind": p.kind.name, "default": _default(p.default)})
    out: dict[str, Any] = {"signature": params, "text": str(sig)}
    if inspect.iscoroutinefunction(obj):
        out["async"] = True
    return out


def _owner(cls: type, name: str) -> type | None:
    for base in cls.__mro__:
        if name in vars(base):
            return base
    return None


def describe_member(cls: type, name: str) -> dict[str, Any]:
    try:
        raw = inspect.getattr_static(cls, name)
    except AttributeError:
        raw = None
    raw_type = type(raw).__name__
    value = getattr(cls, name, None)
    if isinstance(raw, property) or raw_type in ("getset_descriptor", "member_descriptor"):
        return {"kind": "property"}
    if isinstance(value, cls) and not callable(value):
        return {"kind": "enum_member"}
    if type(value).__name__ == cls.__name__:
        return {"kind": "enum_member"}
    if isinstance(raw, staticmethod):
        return {"kind": "staticmethod", **describe_callable(value, drop_self=False)}
    if isinstance(raw, classmethod) or raw_type == "classmethod_descriptor":
        return {"kind": "classmethod", **describe_callable(value, drop_self=False)}
    if callable(value):
        return {"kind": "method", **describe_callable(value, drop_self=True)}
    return {"kind": "attribute", "type": tname(value)}


def describe_class(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "class", "bases": [c.__name__ for c in cls.__mro__[1:] if c is not object],
                           "qualname": f"{cls.__module__}.{cls.__qualname__}"}
    if issubclass(cls, BaseException):
        out["kind"] = "exception"
        out["mro"] = [c.__name__ for c in cls.__mro__ if c not in (object, BaseException)]
    if isinstance(cls, type) and getattr(cls, "__total__", None) is not None and issubclass(cls, dict):
        out["kind"] = "typeddict"
        out["keys"] = sorted(getattr(cls, "__annotations__", {}))
        return out
    members: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = _owner(cls, name)
        if owner is None or owner in _BASES:
            continue
        members[name] = describe_member(cls, name)
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if not f.name.startswith("_") and f.name not in members or not f.name.startswith("_"):
                members[f.name] = {"kind": "field"}
    if isinstance(cls, enum.EnumMeta):
        for name in cls.__members__:
            members[name] = {"kind": "enum_member"}
    out["members"] = dict(sorted(members.items()))
    out["protocol"] = sorted(n for n in _PROTOCOL if (o := _owner(cls, n)) is not None and o not in _BASES)
    out["constructor"] = describe_callable(cls, drop_self=False)
    return out


def describe_object(name: str, obj: Any) -> dict[str, Any]:
    if inspect.ismodule(obj):
        return {"kind": "module", "module": obj.__name__}
    if getattr(obj, "__origin__", None) is not None or type(obj).__module__ == "typing":
        return {"kind": "typing-alias", "repr": repr(obj)[:200]}
    if isinstance(obj, type):
        return describe_class(obj)
    if callable(obj):
        return {"kind": "function", **describe_callable(obj, drop_self=False)}
    return {"kind": "value", "type": tname(obj), "repr": repr(obj)[:80]}


def module_names(mod: Any) -> list[str]:
    """A module's public names: ``__all__``, else what it defines (not what it imports)."""
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    names = []
    for name, obj in vars(mod).items():
        if name.startswith("_") or inspect.ismodule(obj) or type(obj).__name__ == "TypeVar":
            continue
        defined_here = getattr(obj, "__module__", None) == mod.__name__
        constant = name.isupper() and isinstance(obj, (str, int, float, bytes))
        if defined_here or constant or type(obj).__module__ == mod.__name__:
            names.append(name)
    return sorted(names)


def surface() -> dict[str, Any]:
    out: dict[str, Any] = {"awa": {"__all__": list(getattr(awa, "__all__", [])), "names": {}}}
    top = out["awa"]
    names = list(getattr(awa, "__all__", []))
    names += [n for n in dir(awa) if not n.startswith("_") and n not in names]
    for name in names:
        obj = getattr(awa, name, None)
        if obj is None and not hasattr(awa, name):
            top["names"][name] = {"kind": "missing-but-in-__all__"}
            continue
        if inspect.ismodule(obj) and name not in top["__all__"]:
            continue  # submodules are described below
        top["names"][name] = describe_object(name, obj)
        if name == "RawClient":  # awa-pg's private native layer: its member names are enough
            top["names"][name]["members"] = {m: {"kind": e["kind"]} for m, e in top["names"][name]["members"].items()}
    for sub in ("testing", "bridge", "callback_contract"):
        key = f"awa.{sub}"
        try:
            mod = importlib.import_module(key)
        except Exception as exc:
            out[key] = {"import": describe_error(exc)}
            continue
        entry: dict[str, Any] = {"import": "ok", "names": {}}
        for name in module_names(mod):
            entry["names"][name] = describe_object(name, getattr(mod, name))
        out[key] = entry
    return out


def instance_members(url: str, reference: dict[str, Any]) -> dict[str, Any]:
    """For each reference client member our class does not define, look it up on an instance
    (a client may forward calls through ``__getattr__``)."""
    out: dict[str, Any] = {}
    ref_names = reference.get("surface", {}).get("awa", {}).get("names", {})
    for cls_name in ("AsyncClient", "Client"):
        cls = getattr(awa, cls_name, None)
        ref = ref_names.get(cls_name, {}).get("members", {})
        if cls is None or not ref:
            continue
        try:
            inst = cls(url)
        except Exception as exc:
            out[cls_name] = {"construct": describe_error(exc)}
            continue
        found: dict[str, Any] = {}
        for name in ref:
            if hasattr(cls, name):
                continue
            try:
                attr = getattr(inst, name)
            except Exception:
                continue
            found[name] = describe_callable(attr, drop_self=False) if callable(attr) else {"kind": "attribute"}
        out[cls_name] = found
        close = getattr(inst, "close", None)
        try:
            if cls_name == "Client" and close is not None:
                close()
        except Exception:
            pass
    return out


# --------------------------------------------------------------------------------------------
# Probe machinery
# --------------------------------------------------------------------------------------------

Probe = Callable[["Ctx"], Awaitable[Any]]
PROBES: list[tuple[str, float, Probe]] = []


def probe(name: str, timeout: float = 20.0) -> Callable[[Probe], Probe]:
    def register(fn: Probe) -> Probe:
        PROBES.append((name, timeout, fn))
        return fn
    return register


async def call(fn: Any, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    """Call ``fn`` (awaiting the result when it is awaitable): ``(observation, value)``."""
    try:
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        return describe_error(exc), None
    return {"returns": returned(value)}, value


def returned(value: Any) -> str:
    """The type of a return value; ``()`` is told apart (a native unit result can surface as it)."""
    return "tuple:empty" if value == () and isinstance(value, tuple) else tname(value)


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    """Run a blocking call on a worker thread: ``(observation, value)``."""
    def run() -> tuple[dict[str, Any], Any]:
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            return describe_error(exc), None
        return {"returns": returned(value)}, value
    return await asyncio.to_thread(run)


class Ctx:
    """State shared by the probes of one run."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: Any = None
        self.jobs: dict[str, Any] = {}
        self.seen: dict[str, Any] = {}  # observations made inside handlers
        self.tokens: dict[str, Any] = {}

    def need(self, *keys: str) -> None:
        missing = [k for k in keys if k not in self.jobs]
        if missing:
            raise RuntimeError(f"precondition missing: {missing}")


def job_fields(job: Any) -> dict[str, Any]:
    """The deterministic facts of a returned job."""
    if job is None:
        return {"job": "None"}
    out: dict[str, Any] = {"type": tname(job)}
    for attr in ("id", "kind", "queue", "priority", "attempt", "max_attempts", "tags", "metadata", "args",
                 "errors", "run_at", "created_at", "finalized_at", "deadline", "progress"):
        if not hasattr(job, attr):
            out[attr] = "<absent>"
            continue
        value = getattr(job, attr)
        out[attr] = tname(value) if attr in ("id", "run_at", "created_at", "finalized_at", "deadline") else _plain(value)
    if hasattr(job, "state"):
        out["state_type"] = tname(job.state)
        out["state"] = state_name(job.state)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return {"dataclass": tname(value), **{f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    return tname(value)


async def wait_state(client: Any, job_id: int, targets: set[str], timeout: float = 20.0) -> str | None:
    """Poll ``get_job`` until the job is in one of ``targets`` or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        job = await client.get_job(job_id)
        last = state_name(job.state)
        if last in targets:
            return last
        await asyncio.sleep(0.1)
    return f"timeout (last: {last})"


# --------------------------------------------------------------------------------------------
# Job args types
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PlainArgs:
    n: int = 0


@dataclasses.dataclass
class UniqueArgs:
    key: str = "k"


@dataclasses.dataclass
class OkJob:
    n: int = 0


@dataclasses.dataclass
class RetryJob:
    n: int = 0


@dataclasses.dataclass
class SnoozeJob:
    n: int = 0


@dataclasses.dataclass
class CancelJob:
    n: int = 0


@dataclasses.dataclass
class ErrorJob:
    n: int = 0


@dataclasses.dataclass
class TerminalJob:
    n: int = 0


@dataclasses.dataclass
class FailJob:
    n: int = 0


@dataclasses.dataclass
class CallbackJob:
    name: str = ""


@dataclasses.dataclass
class CelJob:
    name: str = ""


@dataclasses.dataclass
class SequentialJob:
    name: str = ""


@dataclasses.dataclass
class InspectJob:
    n: int = 0


@dataclasses.dataclass
class TestArgs:
    n: int = 0


FUTURE = dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)


async def insert_probe(ctx: Ctx, args: Any = None, **kw: Any) -> dict[str, Any]:
    obs, job = await call(ctx.client.insert, PlainArgs() if args is None else args, **kw)
    if job is not None:
        obs.update(job_fields(job))
    return obs


# --------------------------------------------------------------------------------------------
# Probes: schema, constructor, insert
# --------------------------------------------------------------------------------------------


@probe("module.migrate_function")
async def _(ctx: Ctx) -> Any:
    fn = getattr(awa, "migrate", None)
    if fn is None:
        return {"raises": "AttributeError"}
    obs, _v = await call(fn, ctx.url)
    return obs


@probe("module.migrations")
async def _(ctx: Ctx) -> Any:
    obs, value = await call(awa.migrations)
    if value is not None:
        obs["shape"] = shape(value[:1]) if isinstance(value, list) else shape(value)
    return obs


@probe("module.current_migration_version")
async def _(ctx: Ctx) -> Any:
    obs, _value = await call(awa.current_migration_version)
    return obs


@probe("module.derive_kind")
async def _(ctx: Ctx) -> Any:
    return {n: awa.derive_kind(n) for n in ("SendEmail", "SMTPEmail", "HTTPRequestV2", "ok")}


@probe("client.construct_and_migrate")
async def _(ctx: Ctx) -> Any:
    obs, client = await in_thread(awa.AsyncClient, ctx.url)
    if client is None:
        return obs
    ctx.client = client
    mig, _v = await call(client.migrate)
    again, _v = await call(client.migrate)
    return {"construct": obs, "migrate": mig, "migrate_again": again}


@probe("client.construct_unreachable", timeout=40)
async def _(ctx: Ctx) -> Any:
    start = time.monotonic()
    obs, client = await in_thread(awa.AsyncClient, "postgres://postgres@127.0.0.1:9/nothing")
    if client is not None:
        obs2, _v = await call(client.insert, PlainArgs())
        obs = {"construct": obs, "first_call": obs2}
    elapsed = time.monotonic() - start
    obs["elapsed"] = "<5s" if elapsed < 5 else "5-35s" if elapsed < 35 else ">=35s"
    message = obs.get("message", "")
    obs["message_names_host_port"] = "127.0.0.1" in message and ":9" in message
    return obs


@probe("types.misc")
async def _(ctx: Ctx) -> Any:
    """Small runtime facts application code leans on (annotations, comparisons, pickling)."""
    import pickle
    js = awa.JobState
    member = getattr(js, "Available", None)
    return {
        "Job[int]": _compare(lambda: tname(awa.Job[int])),
        "int(JobState.Available)": _compare(lambda: int(member)) if member is not None else "<absent>",
        "hash(JobState.Available)": _compare(lambda: tname(hash(member))) if member is not None else "<absent>",
        "repr(JobState.Available)": _compare(lambda: repr(member)) if member is not None else "<absent>",
        "JobState('available')": _compare(lambda: tname(js("available"))),
        "exception_module": awa.AwaError.__module__,
        "exception_name": awa.AwaError.__name__,
        "pickle(ValidationError)": _compare(lambda: tname(pickle.loads(pickle.dumps(awa.ValidationError("x"))))),
        "RetryAfter(1) == RetryAfter(1)": _compare(lambda: awa.RetryAfter(1) == awa.RetryAfter(1)),
        "RetryAfter('x')": _compare(lambda: tname(awa.RetryAfter("x"))),
        "RetryAfter(1).seconds": _compare(lambda: tname(awa.RetryAfter(1).seconds)),
        "Snooze(-1)": _compare(lambda: tname(awa.Snooze(-1))),
        "Cancel().reason": _compare(lambda: awa.Cancel().reason),
    }


@probe("jobstate.members")
async def _(ctx: Ctx) -> Any:
    js = awa.JobState
    names = sorted(js.__members__) if isinstance(js, enum.EnumMeta) else sorted(
        n for n in dir(js) if not n.startswith("_") and type(getattr(js, n)).__name__ == "JobState")
    out: dict[str, Any] = {"names": names}
    for attr in ("Available", "WaitingExternal", "Completed"):
        member = getattr(js, attr, None)
        out[attr] = "<absent>" if member is None else {"str": str(member), "eq_str": member == attr.lower()}
    return out


@probe("insert.defaults")
async def _(ctx: Ctx) -> Any:
    obs, job = await call(ctx.client.insert, PlainArgs(n=1))
    if job is not None:
        ctx.jobs["plain"] = job
        obs.update(job_fields(job))
        obs["state_eq_JobState_Available"] = _compare(lambda: job.state == awa.JobState.Available)
        obs["state_eq_str"] = _compare(lambda: job.state == "available")
        obs["shape"] = shape(job)
        obs["run_at_rfc3339"] = _compare(lambda: dt.datetime.fromisoformat(str(job.run_at)).tzinfo is not None)
    return obs


def _compare(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return {"raises": type(exc).__name__}


@probe("insert.kind")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, kind="custom_kind")


@probe("insert.queue")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, queue="other_q")


@probe("insert.priority_1")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, priority=1)


@probe("insert.priority_4")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, priority=4)


@probe("insert.max_attempts_3")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, max_attempts=3)


@probe("insert.tags")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, tags=["a", "b"])


@probe("insert.metadata")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, metadata={"m": 1})


@probe("insert.run_at_datetime_future")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, run_at=FUTURE)


@probe("insert.run_at_datetime_past")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, run_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))


@probe("insert.run_at_rfc3339_string")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, run_at="2099-01-01T00:00:00Z")


@probe("insert.run_at_naive_datetime")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, run_at=dt.datetime(2099, 1, 1))


@probe("insert.run_at_bad_string")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, run_at="not a date")


@probe("insert.ordering_key_bytes")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, ordering_key=b"customer-42")


@probe("insert.ordering_key_str")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, ordering_key="customer-42")


@probe("insert.ordering_key_int")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, ordering_key=42)


@probe("insert.unique_opts_empty")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, UniqueArgs(key="empty-opts"), unique_opts={})


@probe("insert.dict_args_with_kind")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, {"x": 1}, kind="dict_kind")


@probe("insert.dict_args_no_kind")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, {"x": 1})


@probe("insert.pydantic_args")
async def _(ctx: Ctx) -> Any:
    try:
        import pydantic
    except ImportError as exc:
        return describe_error(exc)

    class PydArgs(pydantic.BaseModel):
        to: str
        n: int = 0

    return await insert_probe(ctx, PydArgs(to="a@b.c"))


@probe("insert.bad_priority_0")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, priority=0)


@probe("insert.bad_priority_5")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, priority=5)


@probe("insert.bad_max_attempts_0")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, max_attempts=0)


@probe("insert.bad_max_attempts_huge")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, max_attempts=100000)


@probe("insert.bad_kind_empty")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, kind="")


@probe("insert.bad_kind_type")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, kind=123)


@probe("insert.bad_queue_empty")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, queue="")


@probe("insert.bad_args_int")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, 42)


@probe("insert.bad_args_null_byte")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, {"s": "a\x00b"}, kind="nul")


@probe("insert.bad_tags_type")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, tags="notalist")


@probe("insert.bad_unknown_keyword")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, bogus=1)


@probe("insert.bad_unique_opts_key")
async def _(ctx: Ctx) -> Any:
    return await insert_probe(ctx, UniqueArgs(key="bad-opts"), unique_opts={"bogus": True})


@probe("insert.unique_conflict")
async def _(ctx: Ctx) -> Any:
    first = await insert_probe(ctx, UniqueArgs(key="dup"), unique_opts={"by_args": True})
    second = await insert_probe(ctx, UniqueArgs(key="dup"), unique_opts={"by_args": True})
    return {"first": first.get("returns", first.get("raises")), "second": second}


@probe("insert.unique_period")
async def _(ctx: Ctx) -> Any:
    first = await insert_probe(ctx, UniqueArgs(key="per"), unique_opts={"by_period": 3600})
    second = await insert_probe(ctx, UniqueArgs(key="per"), unique_opts={"by_period": 3600})
    return {"first": first.get("returns", first.get("raises")), "second": second.get("raises", second.get("returns"))}


async def _row(ctx: Ctx, sql: str, *args: Any) -> tuple[dict[str, Any], Any]:
    """One row through the package's own transaction API."""
    tx = await ctx.client.transaction()
    try:
        return await call(tx.fetch_one, sql, *args)
    finally:
        await call(tx.rollback)


@probe("unique.key_bytes")
async def _(ctx: Ctx) -> Any:
    """The stored unique key for fixed inputs (issue 13 item 6: both must compute the same bytes)."""
    out: dict[str, Any] = {}
    cases: list[tuple[str, dict[str, Any], Any]] = [
        ("by_args", {"by_args": True}, None),
        ("by_queue_args", {"by_queue": True, "by_args": True}, None),
        ("kind_only", {}, None),
        # A fixed run_at makes the period bucket deterministic: 4070908800 // 3600 = 1130808.
        ("by_period_no_args", {"by_args": False, "by_period": 3600}, FUTURE),
    ]
    for label, opts, run_at in cases:
        o, job = await call(ctx.client.insert, UniqueArgs(key=f"kb-{label}"), queue="uq", unique_opts=opts,
                            run_at=run_at)
        if job is None:
            out[label] = o
            continue
        o, row = await _row(ctx, "SELECT encode(unique_key, 'hex') AS k FROM awa.jobs WHERE id = $1", job.id)
        out[label] = row.get("k") if isinstance(row, dict) else o
    return out


@probe("client.get_job")
async def _(ctx: Ctx) -> Any:
    ctx.need("plain")
    obs, job = await call(ctx.client.get_job, ctx.jobs["plain"].id)
    if job is not None:
        obs.update(job_fields(job))
    return obs


@probe("client.get_job_missing")
async def _(ctx: Ctx) -> Any:
    obs, _job = await call(ctx.client.get_job, 987654321)
    return obs


@probe("client.list_jobs")
async def _(ctx: Ctx) -> Any:
    obs, jobs = await call(ctx.client.list_jobs, state="available", limit=5)
    if jobs is not None:
        obs["shape"] = {"type": tname(jobs), "item": tname(jobs[0]) if jobs else None,
                        "states": sorted({state_name(j.state) for j in jobs})}
    return obs


@probe("client.list_jobs_bad_state")
async def _(ctx: Ctx) -> Any:
    obs, _v = await call(ctx.client.list_jobs, state="nope")
    return obs


@probe("client.cancel_by_unique_key")
async def _(ctx: Ctx) -> Any:
    obs, job = await call(ctx.client.insert, UniqueArgs(key="cbuk"), queue="default", unique_opts={"by_args": True})
    if job is None:
        return {"insert": obs}
    # The key was computed by_args only, so passing queue= computes a different key (no match).
    c0, j0 = await call(ctx.client.cancel_by_unique_key, "unique_args", queue="default", args={"key": "cbuk"})
    c1, j1 = await call(ctx.client.cancel_by_unique_key, "unique_args", args={"key": "cbuk"}, period_bucket=None)
    return {"insert": obs["returns"], "with_queue": {**c0, **({"state": state_name(j0.state)} if j0 is not None else {})},
            "awa_pg_form": {**c1, **({"state": state_name(j1.state)} if j1 is not None else {})}}


@probe("client.cancel_by_unique_key_no_match")
async def _(ctx: Ctx) -> Any:
    obs, _v = await call(ctx.client.cancel_by_unique_key, "unique_args", args={"key": "never"})
    return obs


# --------------------------------------------------------------------------------------------
# Probes: transactions
# --------------------------------------------------------------------------------------------


@probe("transaction.await_then_methods")
async def _(ctx: Ctx) -> Any:
    obs, tx = await call(ctx.client.transaction)
    if tx is None:
        return obs
    out: dict[str, Any] = {"transaction": obs, "type": tname(tx)}
    out["execute"], v = await call(tx.execute, "SELECT 1")
    out["execute_value_type"] = tname(v)
    out["fetch_one"], row = await call(tx.fetch_one, "SELECT 1::int AS x, 'a'::text AS y")
    out["fetch_one_shape"] = shape(row)
    out["fetch_one_no_row"], _v = await call(tx.fetch_one, "SELECT 1 WHERE false")
    out["fetch_optional_none"], _v = await call(tx.fetch_optional, "SELECT 1 WHERE false")
    out["fetch_all"], rows = await call(tx.fetch_all, "SELECT generate_series(1, 3) AS n")
    out["fetch_all_shape"] = shape(rows)
    out["params"], row = await call(tx.fetch_one, "SELECT $1::int + $2::int AS s", 2, 3)
    out["params_value"] = _plain(row)
    out["insert"], job = await call(tx.insert, PlainArgs(n=7), queue="txq")
    out["insert_many"], jobs = await call(tx.insert_many, [PlainArgs(n=8), PlainArgs(n=9)], queue="txq")
    out["insert_many_len"] = len(jobs) if isinstance(jobs, list) else None
    out["commit"], _v = await call(tx.commit)
    if job is not None:
        got, _j = await call(ctx.client.get_job, job.id)
        out["visible_after_commit"] = got
    return out


@probe("transaction.rollback")
async def _(ctx: Ctx) -> Any:
    tx = await ctx.client.transaction()
    _o, job = await call(tx.insert, PlainArgs(n=10))
    rb, _v = await call(tx.rollback)
    got = (await call(ctx.client.get_job, job.id))[0] if job is not None else "insert failed"
    return {"rollback": rb, "get_after_rollback": got}


@probe("transaction.async_with_await")
async def _(ctx: Ctx) -> Any:
    try:
        async with await ctx.client.transaction() as tx:
            job = await tx.insert(PlainArgs(n=11))
        return {"ok": True, "tx_type": tname(tx), "visible": (await call(ctx.client.get_job, job.id))[0]}
    except Exception as exc:
        return describe_error(exc)


@probe("transaction.async_with_no_await")
async def _(ctx: Ctx) -> Any:
    try:
        async with ctx.client.transaction() as tx:
            await tx.insert(PlainArgs(n=12))
        return {"ok": True}
    except Exception as exc:
        return describe_error(exc)


@probe("transaction.exception_rolls_back")
async def _(ctx: Ctx) -> Any:
    holder: dict[str, Any] = {}
    try:
        async with await ctx.client.transaction() as tx:
            holder["job"] = await tx.insert(PlainArgs(n=13))
            raise KeyError("boom")
    except KeyError:
        pass
    except Exception as exc:
        return describe_error(exc)
    return {"get_after": (await call(ctx.client.get_job, holder["job"].id))[0]}


@probe("client.insert_many_copy")
async def _(ctx: Ctx) -> Any:
    obs, jobs = await call(ctx.client.insert_many_copy, [PlainArgs(n=1), PlainArgs(n=2)], queue="copyq",
                           opts=[None, {"queue": "copyq2"}])
    if isinstance(jobs, list):
        obs["len"] = len(jobs)
        obs["queues"] = [j.queue for j in jobs]
    return obs


@probe("client.enqueue_many_copy")
async def _(ctx: Ctx) -> Any:
    obs, n = await call(ctx.client.enqueue_many_copy, [PlainArgs(n=1), PlainArgs(n=2)], queue="copyq")
    obs["value"] = n if isinstance(n, int) else None
    return obs


@probe("client.insert_many")
async def _(ctx: Ctx) -> Any:
    fn = getattr(ctx.client, "insert_many", None)
    if fn is None:
        return {"raises": "AttributeError"}
    obs, _jobs = await call(fn, [PlainArgs(n=1)])
    return obs


# --------------------------------------------------------------------------------------------
# Probes: admin (queues, stats, health, retry/cancel)
# --------------------------------------------------------------------------------------------


@probe("admin.flush_admin_metadata")
async def _(ctx: Ctx) -> Any:
    fn = getattr(ctx.client, "flush_admin_metadata", None)
    if fn is None:
        return {"raises": "AttributeError"}
    return (await call(fn))[0]


@probe("admin.queue_stats")
async def _(ctx: Ctx) -> Any:
    obs, stats = await call(ctx.client.queue_stats)
    if isinstance(stats, list) and stats:
        first = stats[0]
        obs["item_type"] = tname(first)
        obs["item_shape"] = shape(first)
        obs["stat.available"] = _compare(lambda: tname(first.available))
        obs["stat.queue"] = _compare(lambda: tname(first.queue))
        obs["stat.paused"] = _compare(lambda: tname(first.paused))
        obs["stat['available']"] = _compare(lambda: tname(first["available"]))
        default = [s for s in stats if _compare(lambda s=s: s.queue) == "default"]
        obs["default_available_gt0"] = _compare(lambda: default[0].available > 0) if default else "no default row"
    return obs


@probe("admin.health_check_idle")
async def _(ctx: Ctx) -> Any:
    obs, health = await call(ctx.client.health_check)
    if health is not None:
        obs["shape"] = shape(health)
        obs["health.healthy"] = _compare(lambda: health.healthy)
        obs["health.postgres_connected"] = _compare(lambda: health.postgres_connected)
    return obs


@probe("admin.pause_resume_queue")
async def _(ctx: Ctx) -> Any:
    c = ctx.client
    out: dict[str, Any] = {}
    out["pause(queue)"], _v = await call(c.pause_queue, "pq")
    out["pause(queue, paused_by)"], _v = await call(c.pause_queue, "pq", "ops@example")
    out["pause(queue=, paused_by=)"], _v = await call(c.pause_queue, queue="pq", paused_by="ops")
    stats = (await call(c.queue_stats))[1] or []
    out["paused_in_stats"] = [_compare(lambda s=s: s.paused) for s in stats if _compare(lambda s=s: s.queue) == "pq"]
    out["resume"], _v = await call(c.resume_queue, "pq")
    out["pause_empty_name"], _v = await call(c.pause_queue, "")
    return out


@probe("admin.drain_queue")
async def _(ctx: Ctx) -> Any:
    await ctx.client.insert(PlainArgs(n=1), queue="drainq")
    await ctx.client.insert(PlainArgs(n=2), queue="drainq")
    obs, n = await call(ctx.client.drain_queue, "drainq")
    obs["value"] = n if isinstance(n, int) else _plain(n)
    return obs


@probe("admin.cancel_retry")
async def _(ctx: Ctx) -> Any:
    c = ctx.client
    job = await c.insert(PlainArgs(n=99), queue="crq")
    out: dict[str, Any] = {}
    o, j = await call(c.cancel, job.id)
    out["cancel_available"] = {**o, "state": state_name(getattr(j, "state", None))}
    o, j = await call(c.cancel, job.id)
    out["cancel_again"] = {**o, "state": state_name(getattr(j, "state", None))}
    o, j = await call(c.retry, job.id)
    out["retry_cancelled"] = {**o, "state": state_name(getattr(j, "state", None))}
    o, j = await call(c.retry, job.id)
    out["retry_available"] = {**o, "state": state_name(getattr(j, "state", None))}
    out["cancel_missing"] = (await call(c.cancel, 987654321))[0]
    out["retry_missing"] = (await call(c.retry, 987654321))[0]
    return out


@probe("admin.dump_job")
async def _(ctx: Ctx) -> Any:
    ctx.need("plain")
    fn = getattr(ctx.client, "dump_job", None)
    if fn is None:
        return {"raises": "AttributeError"}
    obs, text = await call(fn, ctx.jobs["plain"].id)
    if isinstance(text, str):
        obs["json_keys"] = sorted(json.loads(text))
    return obs


@probe("admin.dump_run")
async def _(ctx: Ctx) -> Any:
    ctx.need("plain")
    fn = getattr(ctx.client, "dump_run", None)
    if fn is None:
        return {"raises": "AttributeError"}
    obs, _text = await call(fn, ctx.jobs["plain"].id)
    return obs


@probe("admin.periodic_register")
async def _(ctx: Ctx) -> Any:
    fn = getattr(ctx.client, "periodic", None)
    if fn is None:
        return {"raises": "AttributeError"}
    obs, _v = await call(fn, "probe_nightly", "0 3 * * *", PlainArgs, PlainArgs(n=1), timezone="UTC")
    obs["bad_cron"] = (await call(fn, "probe_bad", "not cron", PlainArgs, PlainArgs(n=1)))[0]
    return obs


@probe("admin.list_cron_jobs")
async def _(ctx: Ctx) -> Any:
    fn = getattr(ctx.client, "list_cron_jobs", None)
    if fn is None:
        return {"raises": "AttributeError"}
    obs, _v = await call(fn)
    return obs


@probe("client.worker_deprecated_alias")
async def _(ctx: Ctx) -> Any:
    fn = getattr(ctx.client, "worker", None)
    if fn is None:
        return {"raises": "AttributeError"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obs, _deco = await call(fn, PlainArgs, kind="alias_kind", queue="aliasq")
    obs["warnings"] = [w.category.__name__ for w in caught]
    return obs


# --------------------------------------------------------------------------------------------
# Probes: the worker (outcomes, callbacks, failed jobs) - one started runtime
# --------------------------------------------------------------------------------------------


def _register_handlers(ctx: Ctx, client: Any) -> None:
    task = client.task

    @task(OkJob, queue="probe")
    async def ok(job: Any) -> Any:
        return None

    @task(RetryJob, queue="probe")
    async def retry(job: Any) -> Any:
        return awa.RetryAfter(3600)

    @task(SnoozeJob, queue="probe")
    async def snooze(job: Any) -> Any:
        return awa.Snooze(3600)

    @task(CancelJob, queue="probe")
    async def cancel(job: Any) -> Any:
        return awa.Cancel("by handler")

    @task(ErrorJob, queue="probe")
    async def error(job: Any) -> Any:
        raise ValueError("boom")

    @task(TerminalJob, queue="probe")
    async def terminal(job: Any) -> Any:
        raise awa.TerminalError("fatal")

    @task(FailJob, queue="probe")
    async def fail(job: Any) -> Any:
        raise awa.TerminalError("to the dlq")

    @task(InspectJob, queue="probe")
    async def inspect_job(job: Any) -> Any:
        seen: dict[str, Any] = {"job_type": tname(job), "args_type": tname(job.args),
                                "state": state_name(job.state), "state_type": tname(job.state),
                                "deadline_type": tname(job.deadline), "run_at_type": tname(job.run_at),
                                "has_flush_progress_sync": hasattr(job, "flush_progress_sync")}
        seen["set_progress"] = (await call(job.set_progress, 50, "half"))[0]
        seen["update_metadata"] = (await call(job.update_metadata, {"cursor": 3}))[0]
        seen["flush_progress"] = (await call(job.flush_progress))[0]
        if hasattr(job, "flush_progress_sync"):
            seen["flush_progress_sync"] = (await in_thread(job.flush_progress_sync))[0]
        seen["progress_shape"] = shape(job.progress)
        seen["is_cancelled"] = _compare(job.is_cancelled)
        seen["register_callback_negative"] = (await call(job.register_callback, timeout_seconds=-1))[0]
        seen["register_callback_nan"] = (await call(job.register_callback, timeout_seconds=math.nan))[0]
        ctx.seen["inspect"] = seen
        return None

    @task(CallbackJob, queue="probe")
    async def callback(job: Any) -> Any:
        obs, token = await call(job.register_callback, timeout_seconds=120)
        ctx.seen[f"register:{job.args.name}"] = {**obs, "token_type": tname(token),
                                                 "token.id": _compare(lambda: tname(token.id))}
        if token is None:
            raise awa.TerminalError("register_callback failed")
        ctx.tokens[job.args.name] = token
        wfc, result = await call(awa.WaitForCallback, token)
        ctx.seen[f"wfc:{job.args.name}"] = {**wfc, "callback_id": _compare(lambda: tname(result.callback_id))}
        return result

    @task(CelJob, queue="probe")
    async def cel(job: Any) -> Any:
        obs, token = await call(job.register_callback, timeout_seconds=120,
                                filter='payload.status != ""', on_complete='payload.status == "ok"',
                                on_fail='payload.status == "bad"', transform=None)
        ctx.seen[f"register_cel:{job.args.name}"] = {**obs, "token_type": tname(token)}
        if token is None:
            _obs2, token = await call(job.register_callback, timeout_seconds=120)
            if token is None:
                raise awa.TerminalError("register_callback failed")
        ctx.tokens[job.args.name] = token
        return awa.WaitForCallback(token)

    @task(SequentialJob, queue="probe")
    async def sequential(job: Any) -> Any:
        token = await job.register_callback(timeout_seconds=120)
        ctx.tokens[job.args.name] = token
        obs, payload = await call(job.wait_for_callback, token)
        ctx.seen[f"sequential:{job.args.name}"] = {**obs, "payload": _plain(payload)}
        return None


def _token_id(token: Any) -> str:
    return token if isinstance(token, str) else token.id


async def _wait_token(ctx: Ctx, name: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if name in ctx.tokens:
            return ctx.tokens[name]
        await asyncio.sleep(0.05)
    raise RuntimeError(f"no callback token for {name}")


@probe("worker.start_errors", timeout=30)
async def _(ctx: Ctx) -> Any:
    out: dict[str, Any] = {}
    c = awa.AsyncClient(ctx.url)
    out["start_without_tasks"], _v = await call(c.start, [("probe", 1)])
    if _v is None and "returns" in out["start_without_tasks"]:
        await call(c.shutdown)
    c2 = awa.AsyncClient(ctx.url)

    @c2.task(OkJob, queue="declared_q")
    async def handler(job: Any) -> Any:
        return None

    out["start_missing_task_queue"], _v = await call(c2.start, [("other_q", 1)])
    if "returns" in out["start_missing_task_queue"]:
        await call(c2.shutdown)
    out["start_unknown_queue_key"], _v = await call(c2.start, [{"name": "declared_q", "max_workers": 1, "bogus": 1}])
    if "returns" in out["start_unknown_queue_key"]:
        await call(c2.shutdown)
    out["start_unknown_keyword"], _v = await call(c2.start, [("declared_q", 1)], bogus_keyword=1)
    if "returns" in out["start_unknown_keyword"]:
        await call(c2.shutdown)
    out["start_zero_workers"], _v = await call(c2.start, [("declared_q", 0)])
    if "returns" in out["start_zero_workers"]:
        await call(c2.shutdown)
    for cl in (c, c2):
        await call(cl.close)
    return out


_START_VARIANTS: list[tuple[str, Any, dict[str, Any]]] = [
    ("tuples", [("cfgq", 2)], {}),
    ("none_queues", None, {}),
    ("dict_max_workers", [{"name": "cfgq", "max_workers": 2}], {}),
    ("dict_weighted", [{"name": "cfgq", "min_workers": 1, "weight": 2}], {"global_max_workers": 4}),
    ("dict_rate_limit", [{"name": "cfgq", "max_workers": 2, "rate_limit": (10.0, 5)}], {}),
    ("dict_claimers", [{"name": "cfgq", "max_workers": 2, "claimers": 2, "claim_batch_size": 4}], {}),
    ("dict_deadline", [{"name": "cfgq", "max_workers": 2, "deadline_duration_ms": 60000}], {}),
    ("dict_priority_aging", [{"name": "cfgq", "max_workers": 2, "priority_aging_interval_ms": 1000}], {}),
    ("global_max_workers", [("cfgq", 2)], {"global_max_workers": 8}),
    ("retention_and_intervals", [("cfgq", 2)], {
        "completed_retention_hours": 1.0, "failed_retention_hours": 2.0, "cleanup_batch_size": 100,
        "leader_election_interval_ms": 1000, "heartbeat_interval_ms": 1000, "promote_interval_ms": 500,
        "heartbeat_rescue_interval_ms": 5000, "heartbeat_staleness_ms": 30000,
        "deadline_rescue_interval_ms": 5000, "callback_rescue_interval_ms": 5000,
    }),
    ("descriptor_and_rollup", [("cfgq", 2)], {"descriptor_retention_days": 1.0,
                                              "terminal_count_rollup_interval_ms": 1000}),
]


def _start_variant(name: str, queues: Any, kwargs: dict[str, Any]) -> Probe:
    async def run(ctx: Ctx) -> Any:
        c = awa.AsyncClient(ctx.url)

        @c.task(OkJob, queue="cfgq")
        async def handler(job: Any) -> Any:
            return None

        obs, _v = await call(c.start, queues, **kwargs)
        if "returns" in obs:
            obs["shutdown"] = (await call(c.shutdown, 1000))[0]
        await call(c.close)
        return obs
    return run


for _name, _queues, _kwargs in _START_VARIANTS:
    PROBES.append((f"worker.start_{_name}", 30.0, _start_variant(_name, _queues, _kwargs)))


@probe("worker.start", timeout=30)
async def _(ctx: Ctx) -> Any:
    client = awa.AsyncClient(ctx.url)
    ctx.worker = client  # type: ignore[attr-defined]
    _register_handlers(ctx, client)
    obs, _v = await call(client.start, [("probe", 8)], poll_interval_ms=50)
    return obs


@probe("worker.runtime_instances", timeout=20)
async def _(ctx: Ctx) -> Any:
    """Issue 13 item 7: a running client keeps a row in awa.runtime_instances."""
    o, row = await _row(ctx, "SELECT * FROM awa.runtime_instances LIMIT 1")
    if isinstance(row, dict):
        return {"columns": sorted(row)}
    return o


@probe("worker.health_check_running", timeout=20)
async def _(ctx: Ctx) -> Any:
    w = getattr(ctx, "worker", None)
    obs, health = await call(w.health_check)
    if health is not None:
        obs["shape"] = shape(health)
        obs["health.healthy"] = _compare(lambda: health.healthy)
        obs["health.leader_type"] = _compare(lambda: tname(health.leader))
        obs["health.queues"] = _compare(lambda: sorted(health.queues))
    return obs


_OUTCOMES = [("ok", OkJob, {"completed"}), ("retry_after", RetryJob, {"retryable", "scheduled"}),
             ("snooze", SnoozeJob, {"scheduled", "available"}), ("cancel", CancelJob, {"cancelled"}),
             ("raise_exception", ErrorJob, {"retryable", "failed"}), ("raise_terminal", TerminalJob, {"failed"}),
             ("inspect", InspectJob, {"completed", "failed", "retryable"})]
_END = {"completed", "retryable", "scheduled", "cancelled", "failed", "waiting_external"}


def _outcome_probe(label: str, cls: type, targets: set[str]) -> Probe:
    async def run(ctx: Ctx) -> Any:
        job = await ctx.client.insert(cls(n=1), queue="probe")
        final = await wait_state(ctx.client, job.id, _END)
        got = await ctx.client.get_job(job.id)
        out: dict[str, Any] = {"state": final, "attempt": got.attempt}
        if final in ("retryable", "failed", "cancelled"):
            out["errors_len"] = len(got.errors or [])
            if got.errors:
                out["error_keys"] = sorted(got.errors[-1]) if isinstance(got.errors[-1], dict) else tname(got.errors[-1])
        if label == "inspect":
            out["seen_in_handler"] = ctx.seen.get("inspect")
            out["progress_after"] = shape(got.progress)
        return out
    return run


for _label, _cls, _targets in _OUTCOMES:
    PROBES.append((f"worker.outcome_{_label}", 30.0, _outcome_probe(_label, _cls, _targets)))


async def _callback_job(ctx: Ctx, name: str, cls: type = CallbackJob) -> tuple[Any, Any]:
    job = await ctx.client.insert(cls(name=name), queue="probe")
    token = await _wait_token(ctx, name)
    state = await wait_state(ctx.client, job.id, {"waiting_external"}, timeout=15)
    return job, (token, state)


@probe("callback.register_and_wait", timeout=30)
async def _(ctx: Ctx) -> Any:
    _job, (token, state) = await _callback_job(ctx, "cb_complete")
    out: dict[str, Any] = {"state": state, "register": ctx.seen.get("register:cb_complete"),
                           "wait_for_callback": ctx.seen.get("wfc:cb_complete")}
    o, j = await call(ctx.client.complete_external, _token_id(token), {"ok": True})
    out["complete_external"] = {**o, **({"state": state_name(j.state)} if j is not None else {})}
    o, _j = await call(ctx.client.complete_external, _token_id(token), {"ok": True})
    out["complete_twice"] = o
    return out


@probe("callback.fail_external", timeout=30)
async def _(ctx: Ctx) -> Any:
    _job, (token, _state) = await _callback_job(ctx, "cb_fail")
    o, j = await call(ctx.client.fail_external, _token_id(token), "upstream said no")
    return {**o, **({"state": state_name(j.state)} if j is not None else {})}


@probe("callback.retry_external", timeout=30)
async def _(ctx: Ctx) -> Any:
    _job, (token, _state) = await _callback_job(ctx, "cb_retry")
    o, j = await call(ctx.client.retry_external, _token_id(token))
    return {**o, **({"state": state_name(j.state)} if j is not None else {})}


@probe("callback.heartbeat_callback", timeout=30)
async def _(ctx: Ctx) -> Any:
    _job, (token, _state) = await _callback_job(ctx, "cb_heartbeat")
    o, j = await call(ctx.client.heartbeat_callback, _token_id(token), 600.0)
    out = {**o, **({"state": state_name(j.state)} if j is not None else {})}
    await call(ctx.client.complete_external, _token_id(token), None)
    return out


@probe("callback.resume_external_sequential", timeout=40)
async def _(ctx: Ctx) -> Any:
    job = await ctx.client.insert(SequentialJob(name="cb_seq"), queue="probe")
    token = await _wait_token(ctx, "cb_seq")
    await asyncio.sleep(0.3)  # let the handler park in wait_for_callback (observation only)
    o, j = await call(ctx.client.resume_external, _token_id(token), {"step": 2})
    out: dict[str, Any] = {**o}
    if j is not None:
        out["returned_state"] = state_name(j.state)
        out["metadata_keys"] = sorted((j.metadata or {}).keys())
    out["final_state"] = await wait_state(ctx.client, job.id, {"completed", "failed", "retryable"}, timeout=15)
    out["handler_saw"] = ctx.seen.get("sequential:cb_seq")
    return out


@probe("callback.resolve_cel_complete", timeout=30)
async def _(ctx: Ctx) -> Any:
    _job, (token, state) = await _callback_job(ctx, "cel_ok", CelJob)
    out: dict[str, Any] = {"register": ctx.seen.get("register_cel:cel_ok"), "state": state}
    fn = getattr(ctx.client, "resolve_callback", None)
    if fn is None:
        out["resolve"] = {"raises": "AttributeError"}
        return out
    o, r = await call(fn, _token_id(token), {"status": "ok"}, default_action="ignore")
    out["resolve"] = o
    if r is not None:
        out["shape"] = shape(r)
        out["is_completed"] = _compare(r.is_completed)
        out["outcome"] = _compare(lambda: r.outcome)
    return out


@probe("callback.resolve_cel_fail", timeout=30)
async def _(ctx: Ctx) -> Any:
    _job, (token, _state) = await _callback_job(ctx, "cel_bad", CelJob)
    fn = getattr(ctx.client, "resolve_callback", None)
    if fn is None:
        return {"raises": "AttributeError"}
    o, r = await call(fn, _token_id(token), {"status": "bad"})
    if r is not None:
        o["is_failed"] = _compare(r.is_failed)
        o["job_state"] = _compare(lambda: state_name(r.job.state))
    return o


@probe("callback.resolve_cel_ignore", timeout=30)
async def _(ctx: Ctx) -> Any:
    job, (token, _state) = await _callback_job(ctx, "cel_ignore", CelJob)
    fn = getattr(ctx.client, "resolve_callback", None)
    if fn is None:
        return {"raises": "AttributeError"}
    o, r = await call(fn, _token_id(token), {"status": "pending"}, default_action="ignore")
    if r is not None:
        o["is_ignored"] = _compare(r.is_ignored)
        o["job_state_after"] = await wait_state(ctx.client, job.id, {"waiting_external"}, timeout=2)
    await call(ctx.client.complete_external, _token_id(token), None)
    return o


@probe("callback.bad_ids")
async def _(ctx: Ctx) -> Any:
    c = ctx.client
    out: dict[str, Any] = {}
    out["complete_malformed_id"] = (await call(c.complete_external, "not-a-uuid", None))[0]
    out["complete_unknown_uuid"] = (await call(c.complete_external, str(uuid.uuid4()), None))[0]
    out["resume_unknown_uuid"] = (await call(c.resume_external, str(uuid.uuid4()), None))[0]
    out["heartbeat_negative_timeout"] = (await call(c.heartbeat_callback, str(uuid.uuid4()), -1.0))[0]
    fn = getattr(c, "resolve_callback", None)
    out["resolve_malformed_id"] = (await call(fn, "not-a-uuid", None))[0] if fn else {"raises": "AttributeError"}
    return out


@probe("callback.wait_for_callback_ctor")
async def _(ctx: Ctx) -> Any:
    out: dict[str, Any] = {}
    out["from_str"] = (await call(awa.WaitForCallback, str(uuid.uuid4())))[0]
    out["no_args"] = (await call(awa.WaitForCallback))[0]
    out["CallbackToken_exported"] = hasattr(awa, "CallbackToken")
    return out


@probe("failed.make_failed_jobs", timeout=40)
async def _(ctx: Ctx) -> Any:
    ids = []
    for i in range(6):
        job = await ctx.client.insert(FailJob(n=i), queue="probe", tags=["dlq-probe"])
        ids.append(job.id)
    ctx.jobs["failed_ids"] = ids
    states = []
    for i in ids:
        try:
            states.append(await wait_state(ctx.client, i, {"failed"}))
        except Exception as exc:  # e.g. the job left the jobs table for a dead-letter table
            states.append(describe_error(exc)["raises"])
    return {"states": states}


@probe("worker.shutdown", timeout=30)
async def _(ctx: Ctx) -> Any:
    w = getattr(ctx, "worker", None)
    obs, _v = await call(w.shutdown, 2000)
    obs["health_after_shutdown"] = (await call(w.health_check))[0]
    return obs


@probe("failed.retry_failed_by_kind")
async def _(ctx: Ctx) -> Any:
    obs, res = await call(ctx.client.retry_failed, kind="terminal_job")
    obs["shape"] = shape(res)
    if res is not None and not isinstance(res, int):
        obs["jobs_len"] = _compare(lambda: len(res.jobs))
        obs["matched"] = _compare(lambda: res.matched)
    elif isinstance(res, int):
        obs["value"] = res
    return obs


@probe("dlq.move_failed_to_dlq")
async def _(ctx: Ctx) -> Any:
    ctx.need("failed_ids")
    fn = getattr(ctx.client, "move_failed_to_dlq", None)
    if fn is None:
        return {"raises": "AttributeError"}
    obs, entry = await call(fn, ctx.jobs["failed_ids"][0], "probe reason")
    obs["shape"] = shape(entry)
    return obs


@probe("dlq.bulk_move_failed_to_dlq")
async def _(ctx: Ctx) -> Any:
    fn = getattr(ctx.client, "bulk_move_failed_to_dlq", None)
    if fn is None:
        return {"raises": "AttributeError"}
    out: dict[str, Any] = {}
    out["no_filter"] = (await call(fn))[0]
    obs, n = await call(fn, kind="fail_job", reason="bulk")
    out["by_kind"] = {**obs, "value": n if isinstance(n, int) else None}
    return out


@probe("dlq.list_dlq")
async def _(ctx: Ctx) -> Any:
    out: dict[str, Any] = {}
    obs, entries = await call(ctx.client.list_dlq, limit=10)
    out["plain"] = {**obs, "len": len(entries) if isinstance(entries, list) else None,
                    "item_shape": shape(entries[0]) if entries else None}
    for label, kw in (("kind", {"kind": "fail_job"}), ("queue", {"queue": "probe"}), ("tag", {"tag": "dlq-probe"}),
                      ("page", {"before_id": 2 ** 40, "before_dlq_at": dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1),
                                "limit": 2})):
        o, es = await call(ctx.client.list_dlq, **kw)
        out[label] = {**o, "len": len(es) if isinstance(es, list) else None}
    if entries:
        first = entries[0]
        if isinstance(first, dict):
            ctx.jobs["dlq_id"] = first.get("id", first.get("job_id", (first.get("job") or {}).get("id")))
        else:
            ctx.jobs["dlq_id"] = _compare(lambda: first.job.id)
    return out


@probe("dlq.get_dlq_job")
async def _(ctx: Ctx) -> Any:
    out: dict[str, Any] = {}
    if "dlq_id" in ctx.jobs:
        o, e = await call(ctx.client.get_dlq_job, ctx.jobs["dlq_id"])
        out["present"] = {**o, "shape": shape(e)}
    out["missing"] = (await call(ctx.client.get_dlq_job, 987654321))[0]
    return out


@probe("dlq.dlq_depth")
async def _(ctx: Ctx) -> Any:
    out: dict[str, Any] = {}
    o, n = await call(ctx.client.dlq_depth)
    out["all"] = {**o, "value": n if isinstance(n, int) else None}
    o, n = await call(ctx.client.dlq_depth, queue="probe")
    out["queue_kw"] = {**o, "value": n if isinstance(n, int) else None}
    fn = getattr(ctx.client, "dlq_depth_by_queue", None)
    if fn is None:
        out["by_queue"] = {"raises": "AttributeError"}
    else:
        o, v = await call(fn)
        out["by_queue"] = {**o, "shape": shape(v)}
    return out


@probe("dlq.retry_from_dlq_overrides")
async def _(ctx: Ctx) -> Any:
    ctx.need("dlq_id")
    out: dict[str, Any] = {}
    o, j = await call(ctx.client.retry_from_dlq, ctx.jobs["dlq_id"], priority=1, queue="revived", run_at=FUTURE)
    out["with_overrides"] = {**o, **({"state": state_name(j.state), "queue": j.queue, "priority": j.priority} if j is not None else {})}
    out["missing"] = (await call(ctx.client.retry_from_dlq, 987654321))[0]
    return out


@probe("dlq.bulk_retry_from_dlq")
async def _(ctx: Ctx) -> Any:
    fn = getattr(ctx.client, "bulk_retry_from_dlq", None)
    if fn is None:
        return {"raises": "AttributeError"}
    out: dict[str, Any] = {"no_filter": (await call(fn))[0]}
    o, n = await call(fn, kind="fail_job")
    out["by_kind"] = {**o, "value": n if isinstance(n, int) else None}
    return out


@probe("dlq.purge")
async def _(ctx: Ctx) -> Any:
    out: dict[str, Any] = {}
    # Put one failed job back into the DLQ to have something to purge.
    ids = ctx.jobs.get("failed_ids", [])
    fn_job = getattr(ctx.client, "purge_dlq_job", None)
    out["purge_dlq_job_missing"] = (await call(fn_job, 987654321))[0] if fn_job else {"raises": "AttributeError"}
    out["purge_dlq_no_filter"] = (await call(ctx.client.purge_dlq))[0]
    o, n = await call(ctx.client.purge_dlq, queue="probe")
    out["purge_dlq_queue"] = {**o, "value_type": tname(n)}
    o, n = await call(ctx.client.purge_dlq, allow_all=True)
    out["purge_dlq_allow_all"] = {**o, "value_type": tname(n)}
    out["ids_known"] = bool(ids)
    return out


@probe("failed.discard_failed_positional")
async def _(ctx: Ctx) -> Any:
    obs, n = await call(ctx.client.discard_failed, "terminal_job")
    obs["value"] = n if isinstance(n, int) else None
    return obs


@probe("failed.discard_failed_bare")
async def _(ctx: Ctx) -> Any:
    # Last of the failed-job probes: a bare discard_failed() may delete every failed job.
    obs, n = await call(ctx.client.discard_failed)
    obs["value"] = n if isinstance(n, int) else None
    return obs



# --------------------------------------------------------------------------------------------
# Probes: the blocking client
# --------------------------------------------------------------------------------------------


@probe("sync.client", timeout=40)
async def _(ctx: Ctx) -> Any:
    out: dict[str, Any] = {}
    obs, c = await in_thread(awa.Client, ctx.url)
    out["construct"] = obs
    if c is None:
        return out
    out["migrate"] = (await in_thread(c.migrate))[0]
    o, job = await in_thread(c.insert, PlainArgs(n=5), queue="syncq")
    out["insert"] = {**o, **(job_fields(job) if job is not None else {})}
    if job is not None:
        o, j = await in_thread(c.get_job, job.id)
        out["get_job"] = {**o, "state": state_name(getattr(j, "state", None))}
    out["get_job_missing"] = (await in_thread(c.get_job, 987654321))[0]
    o, stats = await in_thread(c.queue_stats)
    out["queue_stats"] = {**o, "item": tname(stats[0]) if stats else None}
    o, h = await in_thread(c.health_check)
    out["health_check"] = {**o, "type": tname(h)}
    out["pause_queue(queue, paused_by)"] = (await in_thread(c.pause_queue, "syncq", "me"))[0]
    out["resume_queue"] = (await in_thread(c.resume_queue, "syncq"))[0]
    o, n = await in_thread(c.drain_queue, "syncq")
    out["drain_queue"] = {**o, "value": n if isinstance(n, int) else None}
    out["has_start"] = hasattr(c, "start")
    out["has_task"] = hasattr(c, "task")

    def tx_flow() -> dict[str, Any]:
        res: dict[str, Any] = {}
        tx = c.transaction()
        res["type"] = tname(tx)
        with tx as t:
            res["fetch_one"] = shape(t.fetch_one("SELECT 1::int AS x"))
            res["insert"] = tname(t.insert(PlainArgs(n=6)))
        return res
    try:
        out["transaction"] = await asyncio.to_thread(tx_flow)
    except Exception as exc:
        out["transaction"] = describe_error(exc)
    out["close"] = (await in_thread(c.close))[0]
    out["insert_after_close"] = (await in_thread(c.insert, PlainArgs(n=7)))[0]
    return out


@probe("client.use_after_close")
async def _(ctx: Ctx) -> Any:
    c = awa.AsyncClient(ctx.url)
    await call(c.insert, PlainArgs(n=1))
    out = {"close": (await call(c.close))[0]}
    out["insert_after_close"] = (await call(c.insert, PlainArgs(n=2)))[0]
    return out


@probe("client.async_with")
async def _(ctx: Ctx) -> Any:
    try:
        async with awa.AsyncClient(ctx.url) as c:
            job = await c.insert(PlainArgs(n=3))
        return {"ok": True, "job": tname(job)}
    except Exception as exc:
        return describe_error(exc)


# --------------------------------------------------------------------------------------------
# Probes: awa.testing, awa.bridge, callback_contract
# --------------------------------------------------------------------------------------------


def _import(name: str) -> Any:
    return importlib.import_module(name)


@probe("testing.import")
async def _(ctx: Ctx) -> Any:
    try:
        mod = _import("awa.testing")
    except Exception as exc:
        return describe_error(exc)
    return {"names": module_names(mod)}


@probe("testing.nojob")
async def _(ctx: Ctx) -> Any:
    mod = _import("awa.testing")
    nojob = getattr(mod, "NoJob", None)
    if nojob is None and not hasattr(mod, "NoJob"):
        return {"raises": "AttributeError"}
    return {"bool": bool(nojob), "repr": repr(nojob)}


@probe("testing.handler_job_awa_pg_fields")
async def _(ctx: Ctx) -> Any:
    mod = _import("awa.testing")
    hj = mod.HandlerJob
    out: dict[str, Any] = {}
    o, job = await call(hj, PlainArgs(n=1), id=1, attempt=1, max_attempts=25, queue="default", priority=2,
                        deadline=None, metadata={}, tags=[])
    out["keywords"] = o
    out["positional"] = (await call(hj, PlainArgs(n=1), 1, 1, 25, "default", 2, None, {}, []))[0]
    out["args_only"] = (await call(hj, PlainArgs(n=1)))[0]
    if job is not None:
        out["is_cancelled"] = _compare(job.is_cancelled)
        out["attrs"] = sorted(n for n in dir(job) if not n.startswith("_"))
    return out


@probe("testing.jobrow")
async def _(ctx: Ctx) -> Any:
    mod = _import("awa.testing")
    jr = getattr(mod, "JobRow", None)
    if jr is None:
        return {"raises": "AttributeError"}
    o, _row = await call(jr, id=1, kind="k", queue="q", args={}, attempt=1, max_attempts=25, priority=2, tags=[])
    o["fields"] = [f.name for f in dataclasses.fields(jr)] if dataclasses.is_dataclass(jr) else None
    return o


@probe("testing.awa_pg_fixture_pattern")
async def _(ctx: Ctx) -> Any:
    """awa-pg's ``awa_client`` fixture wraps the *sync* ``awa.Client`` and awaits its calls."""
    mod = _import("awa.testing")
    o, c = await in_thread(awa.Client, ctx.url)
    if c is None:
        return {"construct": o}
    o, tc = await call(mod.AwaTestClient, c)
    out: dict[str, Any] = {"wrap_sync_client": o}
    if tc is not None:
        out["migrate"] = (await call(tc.migrate))[0]
    await in_thread(c.close)
    return out


@probe("testing.work_one", timeout=30)
async def _(ctx: Ctx) -> Any:
    mod = _import("awa.testing")
    c = awa.AsyncClient(ctx.url)
    tc = mod.AwaTestClient(c)
    out: dict[str, Any] = {"client_attribute": tname(getattr(tc, "client", None))}
    out["insert"] = (await call(tc.insert, TestArgs(n=1), queue="testq"))[0]

    async def handler(job: Any) -> Any:
        return None

    o, res = await call(tc.work_one, TestArgs, handler, queue="testq")
    out["work_one"] = {**o, **({"outcome": _compare(lambda: res.outcome), "job_type": _compare(lambda: tname(res.job)),
                               "is_completed": _compare(res.is_completed)} if res is not None else {})}
    o, res = await call(tc.work_one, TestArgs, handler, queue="testq")
    out["work_one_empty"] = {**o, **({"outcome": _compare(lambda: res.outcome), "job": _compare(lambda: repr(res.job)),
                                     "job_bool": _compare(lambda: bool(res.job))} if res is not None else {})}

    async def failing(job: Any) -> Any:
        raise awa.TerminalError("no")

    await call(tc.insert, TestArgs(n=2), queue="testq")
    o, res = await call(tc.work_one, TestArgs, failing, queue="testq")
    out["work_one_terminal"] = {**o, **({"outcome": _compare(lambda: res.outcome)} if res is not None else {})}
    out["clean"] = (await call(tc.clean))[0]
    await call(c.close)
    return out


@probe("testing.pytest_plugin")
async def _(ctx: Ctx) -> Any:
    eps = md.entry_points(group="pytest11")
    return {"pytest11": sorted(ep.name for ep in eps if "awa" in ep.value or "awa" in ep.name),
            "awa_client_fixture": hasattr(_import("awa.testing"), "awa_client")}


@probe("bridge.import")
async def _(ctx: Ctx) -> Any:
    try:
        mod = _import("awa.bridge")
    except Exception as exc:
        return describe_error(exc)
    return {"names": module_names(mod)}


@probe("bridge.psycopg_sync", timeout=20)
async def _(ctx: Ctx) -> Any:
    try:
        bridge = _import("awa.bridge")
        import psycopg
    except Exception as exc:
        return describe_error(exc)

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        with psycopg.Connection.connect(ctx.url) as conn:
            with conn.transaction():
                o, row = _sync_call(bridge.insert_job_sync, conn, PlainArgs(n=1), queue="bridgeq", tags=["t"],
                                    run_at="2099-01-01T00:00:00Z", ordering_key="k")
                out["insert_job_sync"] = {**o, "keys": sorted(row) if isinstance(row, dict) else None}
                out["row_state"] = str(row.get("state")) if isinstance(row, dict) else None
            with conn.transaction():
                out["bad_priority"] = _sync_call(bridge.insert_job_sync, conn, PlainArgs(n=1), priority=9)[0]
            with conn.transaction():
                out["unique_opts"] = _sync_call(bridge.insert_job_sync, conn, UniqueArgs(key="b"),
                                                unique_opts={"by_args": True})[0]
        return out
    out = await asyncio.to_thread(run)
    return out


def _sync_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return describe_error(exc), None
    return {"returns": returned(value)}, value


@probe("bridge.asyncpg", timeout=20)
async def _(ctx: Ctx) -> Any:
    try:
        bridge = _import("awa.bridge")
        import asyncpg
    except Exception as exc:
        return describe_error(exc)
    conn = await asyncpg.connect(ctx.url)
    out: dict[str, Any] = {}
    try:
        async with conn.transaction():
            o, row = await call(bridge.insert_job, conn, PlainArgs(n=2), queue="bridgeq")
            out["insert_job"] = {**o, "keys": sorted(row) if isinstance(row, dict) else None}
        if isinstance(row, dict):
            out["visible_to_client"] = (await call(ctx.client.get_job, row["id"]))[0]
        out["sync_conn_to_async_fn"] = "n/a"
    finally:
        await conn.close()
    return out


@probe("callback_contract.sign_verify")
async def _(ctx: Ctx) -> Any:
    try:
        cc = _import("awa.callback_contract")
    except Exception as exc:
        return describe_error(exc)
    secret = bytes(range(32))
    out: dict[str, Any] = {"short_secret": (await call(cc.sign, b"short", "abc"))[0]}
    sig = cc.sign(secret, "abc")
    out.update({"sign": tname(sig), "verify": cc.verify(secret, "abc", sig),
                "verify_wrong": cc.verify(secret, "abd", sig), "header": cc.SIGNATURE_HEADER})
    out["build_callback_url"] = (await call(cc.build_callback_url, "https://h", cc.DEFAULT_PATH_PREFIX, "abc", "complete"))[0]
    return out


# --------------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------------


def _db_url(base: str, name: str) -> str:
    head, _sep, _db = base.rpartition("/")
    return f"{head}/{name}"


def _admin(base: str, sql: str) -> None:
    import psycopg
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql)


async def run_list(ctx: Ctx, probes: list[tuple[str, float, Probe]], only: list[str] | None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, timeout, fn in probes:
        if only and not any(name.startswith(o) for o in only):
            continue
        start = time.monotonic()
        try:
            value = await asyncio.wait_for(fn(ctx), timeout)
            entry: dict[str, Any] = {"outcome": value}
        except asyncio.TimeoutError:
            entry = {"outcome": {"raises": "Timeout", "after_s": timeout}}
        except Exception as exc:
            entry = {"outcome": describe_error(exc), "probe_error": traceback.format_exc(limit=3)[-600:]}
        entry["elapsed_s"] = round(time.monotonic() - start, 2)
        results[name] = entry
        print(f"  {name:<45} {entry['elapsed_s']:>6}s", file=sys.stderr, flush=True)
    return results


async def run_probes(url: str, only: list[str] | None) -> dict[str, Any]:
    return await run_list(Ctx(url), PROBES, only)


# The failed-job and DLQ probes again, on a second fresh database where the package's queue
# storage backend is installed when it has one: awa-pg 0.6.9's DLQ calls refuse to run on its
# canonical engine ("DLQ APIs currently require an active queue_storage backend"), so this pass
# is the only place its DLQ results (DlqEntry, counts, filters) can be observed.
_QS_REPEATED = ("failed.make_failed_jobs", "worker.shutdown", "failed.retry_failed_by_kind", "dlq.",
                "failed.discard_failed")


async def _qs_setup(ctx: Ctx) -> Any:
    client = awa.AsyncClient(ctx.url)
    ctx.client = client
    out: dict[str, Any] = {"migrate": (await call(client.migrate))[0]}
    install = getattr(client, "install_queue_storage", None)
    out["install_queue_storage"] = (await call(install))[0] if install else {"raises": "AttributeError"}
    worker = awa.AsyncClient(ctx.url)
    ctx.worker = worker  # type: ignore[attr-defined]

    @worker.task(FailJob, queue="probe")
    async def fail(job: Any) -> Any:
        raise awa.TerminalError("to the dlq")

    # Without a separate storage engine, ask for the package's own dead-lettering instead (our
    # queue option "dlq"), so that the DLQ reads below have rows to return.
    queues: Any = [("probe", 4)] if install else [{"name": "probe", "max_workers": 4, "dlq": True}]
    out["start"] = (await call(worker.start, queues, poll_interval_ms=50))[0]
    return out


async def run_qs_pass(url: str, only: list[str] | None) -> dict[str, Any]:
    probes: list[tuple[str, float, Probe]] = [("qs.setup", 30.0, _qs_setup)]
    probes += [(f"qs.{name}", timeout, fn) for name, timeout, fn in PROBES if name.startswith(_QS_REPEATED)]
    return await run_list(Ctx(url), probes, only)


async def foreign_schema(url: str) -> dict[str, Any]:
    """On a database another package migrated: does migrate refuse, and what does insert do?"""
    out: dict[str, Any] = {}
    o, c = await in_thread(awa.AsyncClient, url)
    if c is None:
        return {"construct": o}
    out["migrate"] = (await call(c.migrate))[0]
    o, _job = await call(c.insert, PlainArgs(n=1))
    out["insert"] = o
    out["queue_stats"] = (await call(c.queue_stats))[0]
    return out


def package_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "awa_file": os.path.basename(os.path.dirname(awa.__file__))}
    for dist in ("awa-pg", "awa-queue"):
        try:
            info[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--out", required=True)
    parser.add_argument("--reference", help="the other package's probe JSON (for instance lookups)")
    parser.add_argument("--only", nargs="*", help="run only probes whose name starts with one of these")
    parser.add_argument("--foreign-schema-url", help="only probe migrate/insert on this existing database")
    ns = parser.parse_args()

    if ns.foreign_schema_url:
        result = {"package": package_info(), "foreign_schema": asyncio.run(foreign_schema(ns.foreign_schema_url))}
        _write(ns.out, result)
        return

    db = f"awa_compat_{os.getpid()}"
    url = _db_url(ns.database_url, db)
    _admin(ns.database_url, f'CREATE DATABASE "{db}"')
    result: dict[str, Any] = {"package": package_info()}
    try:
        result["surface"] = surface()
        if ns.reference:
            with open(ns.reference) as fh:
                result["instance_members"] = instance_members(url, json.load(fh))
        result["probes"] = asyncio.run(run_probes(url, ns.only))
        _admin(ns.database_url, f'CREATE DATABASE "{db}_qs"')
        result["probes"].update(asyncio.run(run_qs_pass(_db_url(ns.database_url, f"{db}_qs"), ns.only)))
    finally:
        for name in (db, f"{db}_qs"):
            try:
                _admin(ns.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:  # reported, never fatal: the results are already collected
                result["drop_database_error"] = describe_error(exc)
        _write(ns.out, result)


def _write(path: str, result: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True, default=str)
        fh.write("\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without running finalizers: a probe that timed out may still hold a native thread
    # (or a blocked executor thread) that would keep the interpreter from exiting.
    os._exit(0)


if __name__ == "__main__":
    main()
