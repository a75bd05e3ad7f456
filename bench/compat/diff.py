"""Compare two ``probe.py`` results: the reference package (awa-pg) against ours.

    python diff.py awa-pg.json awa.json [--markdown report.md]

Prints (or writes as Markdown) three sections:

1. **Names** - every public name of the reference (module level, each class's members, the
   ``awa.testing`` / ``awa.bridge`` / ``awa.callback_contract`` submodules): missing in ours, a
   different kind (property vs method ...), or a signature a reference caller would trip on.
2. **Counts** - how many reference names we have with a call-compatible signature.
3. **Behaviour** - every probe observation that differs, side by side.

A signature is *call-compatible* when every call the reference signature allows is accepted by
ours with the same meaning: each positional parameter at the same position (and, if the
reference lets it be passed by keyword, under the same name), each keyword-only parameter by name,
nothing optional in the reference required in ours, no extra required parameter. Parameters ours
only takes through ``**kwargs`` count as compatible-unchecked (the strict count excludes them).
Our blocking ``Client`` forwards methods through ``__getattr__``; those are resolved to the
``AsyncClient`` method they call (likewise ``SyncTransaction`` to ``Transaction``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Iterable
from typing import Any

#: Reference names not counted: the raw native client is awa-pg's private layer (the issue
#: scopes the count to the public API "its raw native class aside").
EXCLUDED = {"RawClient"}
#: Our forwarding classes and the class whose methods they forward to.
MIRRORS = {"Client": "AsyncClient", "SyncTransaction": "Transaction"}
POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")

# Observation differences that are deliberate, with the reason (matched on the leaf values).
DELIBERATE = [
    (("tuple:empty",), ("None",),
     "awa-pg's native coroutines resolve to () for a unit result; ours resolve to None (the documented `-> None`)"),
]

# Deliberate differences by where they show: (probe name glob, observation key glob, reason),
# or with a fourth element, the awa-pg value the entry requires (e.g. "<absent>" for an
# addition of ours). Issue 13, items 1, 3 and 9 (branch `types`):
ADDITION = "an addition of ours (awa-pg has no such attribute or value); nothing awa-pg code uses changes"
OUR_MESSAGE = "same exception class; our message names the value and the expected form"
DELIBERATE_KEYS: list[tuple[str, ...]] = [
    # Extra attributes on Job, HealthCheck, QueueStat, HandlerJob and testing.
    ("*", "*shape.attrs.*", "<absent>", ADDITION),
    ("*", "item_shape.attrs.*", "<absent>", ADDITION),
    ("testing.handler_job_awa_pg_fields", "attrs", ADDITION + ": HandlerJob is a full awa.Job stand-in"),
    ("testing.handler_job_awa_pg_fields", "args_only*",
     "HandlerJob(args) works: every field after args has a default here (awa-pg requires all nine)"),
    ("testing.import", "names", ADDITION + " (StagedRequest, for HandlerJob.staged)"),
    ("testing.work_one", "work_one.job_type",
     "WorkResult.job is a full awa.Job (every JobRow attribute and more); awa-pg builds a JobRow"),
    ("testing.pytest_plugin", "pytest11",
     "ours registers awa_client as a pytest plugin; awa-pg's fixture must be imported (and is broken)"),
    # JobState: a str Enum (GAPS.md item 1's suggestion).
    ("jobstate.members", "names", "the upper-case names are kept as aliases of awa-pg's members"),
    ("jobstate.members", "*.eq_str", "JobState members are also str: equal to their value"),
    ("insert.defaults", "state_eq_str", "JobState members are also str: equal to their value"),
    ("types.misc", "JobState('available')*", "JobState(value) looks a member up by value (an Enum)"),
    ("types.misc", "hash(JobState.Available)*", "JobState members are hashable (awa-pg's are not)"),
    # Outcome types.
    ("types.misc", "RetryAfter('x').raises",
     "DelayTypeError is a TypeError (what awa-pg raises) and a ValidationError"),
    ("types.misc", "RetryAfter(1) == RetryAfter(1)", "outcome values compare by value (frozen dataclasses)"),
    ("types.misc", "Snooze(-1)*", "a negative delay is refused (awa.ValidationError); awa-pg accepts it"),
    ("types.misc", "exception_module", "exceptions live in module awa (picklable), not _awa"),
    ("types.misc", "pickle(ValidationError)*", "exceptions live in module awa (picklable), not _awa"),
    # Callbacks.
    ("callback.*", "*.message", OUR_MESSAGE),
    ("callback.wait_for_callback_ctor", "from_str.*",
     "WaitForCallback also takes the callback id as a str (an addition)"),
    ("callback.wait_for_callback_ctor", "no_args.message", OUR_MESSAGE),
    ("worker.outcome_inspect", "seen_in_handler.register_callback_*.message", OUR_MESSAGE),
    ("worker.outcome_inspect", "seen_in_handler.register_callback_*.raises",
     "a bad timeout raises a ValidationError that is also the ValueError awa-pg raises"),
    ("worker.outcome_inspect", "seen_in_handler.register_callback_*.mro",
     "a bad timeout raises a ValidationError that is also the ValueError awa-pg raises"),
    # Module functions and health.
    ("module.migrate_function", "*", "awa.migrate(url) migrates; awa-pg 0.6.9's timed out in the probe"),
    ("worker.shutdown", "health_after_shutdown.*", "health_check() after shutdown returns a HealthCheck"),
]

# Deliberate differences the probe does not observe, shown in the report as they are.
DELIBERATE_UNPROBED: list[tuple[str, str]] = [
    ("`awa.RawClient` is not exported",
     "awa-pg's raw native client (101 members, a `_sync` twin of each) mirrors its own engine; ours has "
     "a different private native layer, and `AsyncClient`/`Client` are the public API in both"),
    ("`JobState.Available == 1` is False (`int(JobState.Available) == 1` holds)",
     "the members are `str` (equal to their value) and hashable; one object cannot equal both 1 and "
     "\"available\" and keep a consistent hash"),
    ("a handler waiting in `wait_for_callback` stays `running` (awa-pg: `waiting_external`)",
     "its heartbeat, lease and staged follow-ups stay alive across the wait; `resume_external` returns the "
     "job `running` with `metadata[\"_awa_callback_result\"]`, as ADR-021 says"),
    ("`resume_external` on a job parked by returning `WaitForCallback` makes it `available`",
     "no handler is waiting for it, so it runs again (same attempt count) and finds the payload in "
     "`metadata[\"_awa_callback_result\"]`; awa-pg sets it `running` (ADR-021) with no handler left to continue it"),
    ("`PartitionedQueue.queue_for_key` may pick another partition than awa-pg's",
     "awa-pg routes keys with a native hash its package does not document (none of BLAKE3, BLAKE2b, "
     "SHA-256, xxHash, FNV-1a, MurmurHash3, SipHash matched); ours is BLAKE2b-64 modulo the partition count, "
     "pinned by a test. Names, queue configs and errors match"),
    ("`HandlerJob.register_callback` / `wait_for_callback` raise `AwaError`",
     "a database-free stand-in has no callback to register; awa-pg's HandlerJob has no such methods"),
]


# Whole observations that differ on purpose, matched on ``<probe>.<observation>`` with
# ``fnmatch`` patterns (first match wins), each with its reason. Used where a difference is not
# one pair of values (a message, a shape) but a decision about a call's behaviour.
_VALIDATED = ("ours validates before the database and raises awa.ValidationError (also a ValueError) naming "
              "the field and its limit; awa-pg surfaces its database CHECK, a PyO3 extraction TypeError or an "
              "OverflowError (team rule: bad input is a clear typed error, nothing sent)")
_KEEP_OURS = "ours refuses what awa-pg accepts by accident (see GAPS.md item 2, 'Keep ours'): nothing is stored"
_DLQ_CANONICAL = ("awa-pg's DLQ calls need queue storage on its default engine; ours work on the canonical "
                  "engine (addition). The qs.dlq.* probes compare the real contract")
DELIBERATE_PROBES: list[tuple[str, str]] = [
    # Session 10: the rest of the probe diff, decided.
    ("worker.start_errors.start_unknown_queue_key.*", "issue 13 item 4: an unknown queue key is a ConfigError "
     "naming it and the known keys, never silently ignored (awa-pg ignores it; docs/workers.md)"),
    ("worker.start_errors.start_zero_workers.*", "a queue with max_workers=0 would never run: refused with a "
     "ConfigError (awa-pg accepts it; docs/workers.md)"),
    ("worker.runtime_instances.columns", "ours has the columns issue 13 item 7 names (instance_id, hostname, pid, "
     "version, queues, leader, started_at, last_seen_at, snapshot_interval_ms), under awa-pg's names; awa-pg's "
     "row also copies its health flags (healthy, *_alive, shutting_down, postgres_connected), which "
     "health_check() reads live here, and its queue-storage columns (issue 18)"),
    ("client.construct_unreachable.*", "issue 13 item 10: ours fails fast (a bounded connect timeout) with a "
     "DatabaseError naming host, port and cause; awa-pg waits for its pool's timeout and names neither"),
    ("worker.outcome_raise_*.error_keys", "an errors[] entry also carries the handler's traceback (an addition)"),
    ("qs.dlq.*.errors.list", "an errors[] entry also carries the handler's traceback (an addition)"),
    ("transaction.async_with_no_await.*", "`async with client.transaction()` also works without `await` "
     "(an addition); awa-pg raises TypeError"),
    ("transaction.*.message", OUR_MESSAGE),
    ("admin.periodic_register.bad_cron.message", OUR_MESSAGE),
    ("unique.key_bytes.by_period_no_args", "awa-pg 0.6.9 hashes the period length, not the job's time bucket, "
     "so its by_period keys never roll over (docs/unique-keys.md); ours hash floor(run_at / period), the "
     "documented layout: keys agree for every job without by_period"),
    # Item 2: bad input (GAPS.md, the bad-input table).
    ("insert.bad_priority_*", _VALIDATED),
    ("insert.bad_max_attempts_*", _VALIDATED),
    ("insert.bad_args_null_byte.*", _VALIDATED),
    ("insert.bad_kind_type.*", _VALIDATED),
    ("insert.bad_tags_type.*", _VALIDATED + "; a str for tags was stored split into characters before"),
    ("insert.bad_args_int.message", "same class (ValidationError); ours names the type given"),
    ("insert.ordering_key_int.message", "same class (ValidationError); ours names the type given"),
    ("insert.run_at_bad_string.message", "same class (ValidationError); ours names the field and the format"),
    ("insert.bad_kind_empty.*", _KEEP_OURS),
    ("insert.bad_queue_empty.*", _KEEP_OURS),
    ("insert.bad_unique_opts_key.*", _KEEP_OURS + " (an unknown unique option is a typo, not a no-op)"),
    ("insert.dict_args_no_kind.*", _KEEP_OURS + " (awa-pg files every such job under kind 'dict')"),
    ("insert.run_at_datetime_past.state", "a run_at in the past is due: ours inserts it available, awa-pg "
     "scheduled (then promoted); claiming order and outcome are the same"),
    ("insert.unique_conflict.second.message", "same class (UniqueConflict); ours names the kind instead of "
     "the raw constraint error"),
    ("client.list_jobs_bad_state.*", "ours raises awa.ValidationError, which is also a ValueError: "
     "`except ValueError` written for awa-pg still catches it"),
    ("admin.cancel_retry.*", "ours raises JobNotFound (a subclass of AwaError) for a missing id, returns the "
     "job for a repeated cancel and explains a bad retry; awa-pg says 'job not found' for existing jobs"),
    ("client.get_job_missing.*", "JobNotFound is a subclass of AwaError: `except AwaError` still catches it"),
    ("sync.client.get_job_missing.*", "JobNotFound is a subclass of AwaError: `except AwaError` still catches it"),
    ("client.use_after_close.insert_after_close.message", "same class (DatabaseError); ours prefixes "
     "'database error:'"),
    ("sync.client.insert_after_close.message", "same class (DatabaseError); the blocking client says it is "
     "closed before reaching the pool"),
    ("client.worker_deprecated_alias.returns", "the decorator is a Python function in ours, a native one in "
     "awa-pg; both register the handler and warn once"),
    ("client.insert_many.*", "AsyncClient.insert_many is ours only (addition)"),
    ("client.enqueue_many_copy.*", "ours works on the canonical engine (addition)"),
    ("sync.client.has_start", "ours runs workers from the blocking client too (addition)"),
    ("sync.client.has_task", "ours runs workers from the blocking client too (addition)"),
    # Item 2: the dead-letter queue.
    ("dlq.*", _DLQ_CANONICAL),
    ("failed.*", "ours on the canonical engine; same contract as qs.failed.*"),
    # Item 5: awa.bridge.
    ("bridge.psycopg_sync.bad_priority.*", "validated by the native module as insert does (ValidationError, "
     "nothing sent); awa-pg lets the CHECK violation surface as the driver's error"),
    ("bridge.psycopg_sync.unique_opts.*", "ours takes unique_opts and computes the key as insert does "
     "(issue 13 item 5); awa-pg's bridge has no unique_opts"),
]


def _only_value_error_added(a: Any, b: Any) -> bool:
    """Our class chain is awa-pg's with ValueError added (ValidationError is also a ValueError)."""
    return (isinstance(a, list) and isinstance(b, list) and "ValueError" in b and "ValueError" not in a
            and [x for x in b if x != "ValueError"] == a)


SUBCLASS = ("ours raises a subclass of awa-pg's class (e.g. ConfigError is a ValidationError): every "
            "`except` written for awa-pg still catches it")


def _subclass(key: str, a: Any, b: Any, ours: dict[str, Any]) -> str | None:
    """Ours raised a subclass of what awa-pg raised: the `raises` leaf names a class in our
    chain, or the `mro` leaf contains all of awa-pg's chain."""
    if key.endswith("raises") and isinstance(a, str):
        our_mro = ours.get(key[: -len("raises")] + "mro")
        if isinstance(our_mro, list) and a in our_mro:
            return SUBCLASS
    if key.endswith("mro") and isinstance(a, list) and isinstance(b, list) and a and set(a) <= set(b):
        return SUBCLASS
    return None


def load(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


# ----------------------------------------------------------------------------------------------
# Signatures
# ----------------------------------------------------------------------------------------------


def params(entry: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    return None if not entry else entry.get("signature")


def has_kind(sig: list[dict[str, Any]], kind: str) -> bool:
    return any(p["kind"] == kind for p in sig)


def only_forwarding(sig: list[dict[str, Any]] | None) -> bool:
    return sig is not None and [p["kind"] for p in sig] == ["VAR_POSITIONAL", "VAR_KEYWORD"]


def compare_signatures(ref: list[dict[str, Any]] | None, ours: list[dict[str, Any]] | None) -> tuple[str, list[str]]:
    """``(status, problems)``; status is compatible / via-kwargs / incompatible / unknown."""
    if ref is None:
        return "compatible", []  # nothing to check against (e.g. a property)
    if ours is None:
        return "unknown", ["our signature cannot be introspected"]
    problems: list[str] = []
    unchecked: list[str] = []
    by_name = {p["name"]: p for p in ours}
    ours_pos = [p for p in ours if p["kind"] in POSITIONAL]
    ours_varpos = has_kind(ours, "VAR_POSITIONAL")
    ours_varkw = has_kind(ours, "VAR_KEYWORD")
    ref_pos = [p for p in ref if p["kind"] in POSITIONAL]
    for rp in ref:
        name, kind, optional = rp["name"], rp["kind"], rp["default"] != "<required>"
        target = None
        if kind == "VAR_POSITIONAL":
            if not ours_varpos:
                problems.append(f"*{name} not accepted")
            continue
        if kind == "VAR_KEYWORD":
            if not ours_varkw:
                problems.append(f"**{name} not accepted")
            continue
        if kind in POSITIONAL:
            i = ref_pos.index(rp)
            if i < len(ours_pos):
                target = ours_pos[i]
                if kind == "POSITIONAL_OR_KEYWORD" and target["name"] != name:
                    problems.append(f"positional #{i + 1} is `{target['name']}` in ours, `{name}` in awa-pg")
            elif ours_varpos:
                unchecked.append(name)
            else:
                op = by_name.get(name)
                if op is not None and op["kind"] == "KEYWORD_ONLY":
                    problems.append(f"`{name}` is keyword-only in ours, positional in awa-pg")
                    target = op
                else:
                    problems.append(f"`{name}` (positional #{i + 1}) not accepted")
                continue
        else:  # KEYWORD_ONLY
            target = by_name.get(name)
            if target is None or target["kind"] in ("POSITIONAL_ONLY", "VAR_POSITIONAL", "VAR_KEYWORD"):
                target = None
                if ours_varkw:
                    unchecked.append(name)
                else:
                    problems.append(f"keyword `{name}` not accepted")
                continue
        if target is not None and optional and target["default"] == "<required>":
            problems.append(f"`{name}` is optional in awa-pg, required in ours")
    ref_names = {p["name"] for p in ref}
    for i, op in enumerate(ours):
        if op["default"] != "<required>" or op["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            continue
        if op["name"] not in ref_names and not (op["kind"] in POSITIONAL and i < len(ref_pos)):
            problems.append(f"ours requires `{op['name']}`, which awa-pg does not have")
    if problems:
        return "incompatible", problems
    if unchecked:
        return "via-kwargs", [f"accepted only through **kwargs/*args: {', '.join(unchecked)}"]
    return "compatible", []


def default_notes(ref: list[dict[str, Any]] | None, ours: list[dict[str, Any]] | None) -> list[str]:
    if not ref or not ours:
        return []
    by_name = {p["name"]: p for p in ours}
    notes = []
    for rp in ref:
        op = by_name.get(rp["name"])
        if op is None or "<native default>" in (rp["default"], op["default"]) or "<required>" in (rp["default"], op["default"]):
            continue
        if rp["default"] != op["default"] and not {rp["default"], op["default"]} <= {"3600", "3600.0"}:
            notes.append(f"default of `{rp['name']}`: awa-pg {rp['default']}, ours {op['default']}")
    return notes


# ----------------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------------

KIND_OK = {
    "property": {"property", "field", "attribute"},
    "attribute": {"property", "field", "attribute"},
    "field": {"property", "field", "attribute"},
    "method": {"method", "staticmethod", "classmethod"},
    "classmethod": {"classmethod", "staticmethod"},
    "staticmethod": {"classmethod", "staticmethod"},
    "enum_member": {"enum_member"},
}


class Row:
    """One reference name and how ours matches it."""

    def __init__(self, path: str, status: str, detail: str = "", ref_sig: str = "", ours_sig: str = "") -> None:
        self.path, self.status, self.detail, self.ref_sig, self.ours_sig = path, status, detail, ref_sig, ours_sig


def sig_text(entry: dict[str, Any] | None) -> str:
    if not entry:
        return ""
    text = entry.get("text") or ""
    return text.replace("(self, /, ", "(").replace("(self, ", "(").replace("(self)", "()").replace("(self, /)", "()")


def resolve_ours_member(ours_names: dict[str, Any], instance: dict[str, Any], cls: str, member: str) -> tuple[dict[str, Any] | None, str]:
    """Our entry for ``cls.member``: the class's own, else an instance lookup; a forwarding
    signature is replaced by the mirrored class's method."""
    entry = ours_names.get(cls, {}).get("members", {}).get(member)
    note = ""
    if entry is None and member in instance.get(cls, {}):
        entry = {"kind": "method", **instance[cls][member]}
        note = "found on an instance (forwarded through __getattr__)"
    mirror = MIRRORS.get(cls)
    if entry is not None and mirror is not None:
        sig = params(entry)
        mirrored = ours_names.get(mirror, {}).get("members", {}).get(member)
        if sig is not None and (only_forwarding(sig) or has_kind(sig, "VAR_KEYWORD")) and params(mirrored) is not None \
                and not has_kind(params(mirrored) or [], "VAR_KEYWORD"):
            entry = {**entry, "signature": mirrored["signature"], "text": mirrored.get("text", "")}
            note = (note + "; " if note else "") + f"signature read from {mirror}.{member}, which it forwards to"
    return entry, note


def compare_entry(path: str, ref: dict[str, Any], ours: dict[str, Any] | None, note: str = "") -> Row:
    if ours is None or ours.get("kind") == "missing-but-in-__all__":
        return Row(path, "missing", "", sig_text(ref))
    rk, ok = ref.get("kind"), ours.get("kind")
    if rk in ("class", "exception", "typeddict") or ok in ("class", "exception", "typeddict"):
        if rk != ok and not ({rk, ok} <= {"class", "exception"}):
            return Row(path, "incompatible", f"awa-pg: {rk}, ours: {ok}")
        if rk == "exception":
            ref_mro, our_mro = ref.get("mro", []), ours.get("mro", [])
            if ref_mro != our_mro and _only_value_error_added(ref_mro, our_mro):
                # Every `except` that catches awa-pg's class catches ours: compatible.
                return Row(path, "compatible", "also a ValueError in ours (an addition: `except ValueError` "
                           "catches bad input)")
            if ref_mro != our_mro:
                return Row(path, "incompatible", f"hierarchy: awa-pg {' > '.join(ref_mro)}; ours {' > '.join(our_mro)}")
        if rk == "typeddict" and ref.get("keys") != ours.get("keys"):
            return Row(path, "incompatible", f"keys differ: awa-pg {ref.get('keys')}, ours {ours.get('keys')}")
        status, problems = compare_signatures(params(ref.get("constructor")), params(ours.get("constructor")))
        if status == "incompatible" and ref.get("constructor", {}).get("signature") == []:
            status, problems = "compatible", []  # awa-pg's native classes are not constructible
        return Row(path, status, "; ".join(problems), sig_text(ref.get("constructor")), sig_text(ours.get("constructor")))
    if rk in KIND_OK and ok not in KIND_OK[rk]:
        return Row(path, "incompatible", f"a {ok} in ours, a {rk} in awa-pg", sig_text(ref), sig_text(ours))
    if rk == "function" and ok not in ("function", "method", "class"):
        return Row(path, "incompatible", f"a {ok} in ours, a function in awa-pg", sig_text(ref), sig_text(ours))
    if rk == "module" and ok != "module":
        return Row(path, "incompatible", f"a {ok} in ours, a module in awa-pg")
    status, problems = compare_signatures(params(ref), params(ours))
    notes = problems + default_notes(params(ref), params(ours)) + ([note] if note else [])
    return Row(path, status, "; ".join(notes), sig_text(ref), sig_text(ours))


def compare_names(ref: dict[str, Any], ours: dict[str, Any]) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    ref_s, our_s = ref["surface"], ours["surface"]
    instance = ours.get("instance_members", {})
    ref_top, our_top = ref_s["awa"]["names"], our_s["awa"]["names"]
    exported = [n for n in ref_s["awa"]["__all__"] if n not in EXCLUDED]
    for name in exported:
        rentry = ref_top.get(name, {})
        rows.append(compare_entry(f"awa.{name}", rentry, our_top.get(name)))
        for member, mentry in rentry.get("members", {}).items():
            oentry, note = resolve_ours_member(our_top, instance, name, member)
            if name not in our_top:
                oentry, note = None, ""
            rows.append(compare_entry(f"awa.{name}.{member}", mentry, oentry, note))
    for sub in ("awa.testing", "awa.bridge", "awa.callback_contract"):
        rsub, osub = ref_s.get(sub, {}), our_s.get(sub, {})
        onames = osub.get("names", {}) if osub.get("import") == "ok" else {}
        for name, rentry in rsub.get("names", {}).items():
            rows.append(compare_entry(f"{sub}.{name}", rentry, onames.get(name)))
            for member, mentry in rentry.get("members", {}).items():
                oentry = onames.get(name, {}).get("members", {}).get(member) if name in onames else None
                rows.append(compare_entry(f"{sub}.{name}.{member}", mentry, oentry))
    extras = sorted(f"awa.{n}" for n in our_s["awa"]["__all__"] if n not in ref_top)
    for name in our_s["awa"]["__all__"]:
        if name in ref_top:
            for member in our_top.get(name, {}).get("members", {}):
                if member not in ref_top[name].get("members", {}):
                    extras.append(f"awa.{name}.{member}")
    return rows, extras


# ----------------------------------------------------------------------------------------------
# Behaviour
# ----------------------------------------------------------------------------------------------


def leaves(value: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            yield from leaves(value[key], f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text.replace("|", "\\|").replace("\n", " ")[:160]


def deliberate(a: Any, b: Any, probe: str = "", key: str = "") -> str | None:
    where = f"{probe}.{key}" if key else probe
    if _only_value_error_added(a, b):
        return "awa.ValidationError is also a ValueError in ours (addition: `except ValueError` catches bad input)"
    for pattern, reason in DELIBERATE_PROBES:
        if fnmatch.fnmatchcase(where, pattern):
            return reason
    for ref_values, our_values, reason in DELIBERATE:
        if a in ref_values and b in our_values:
            return reason
    for entry in DELIBERATE_KEYS:
        probe_glob, key_glob = entry[0], entry[1]
        required, reason = (entry[2], entry[3]) if len(entry) == 4 else (None, entry[2])
        if required is not None and a != required:
            continue
        if fnmatch.fnmatchcase(probe, probe_glob) and fnmatch.fnmatchcase(key, key_glob):
            return reason
    return None


def compare_probes(ref: dict[str, Any], ours: dict[str, Any]) -> tuple[list[tuple[str, list[tuple[str, Any, Any, str, str]]]], int]:
    out = []
    same = 0
    rp, op = ref.get("probes", {}), ours.get("probes", {})
    for name in list(rp) + [n for n in op if n not in rp]:
        a = dict(leaves(rp.get(name, {}).get("outcome", "<not run>")))
        b = dict(leaves(op.get(name, {}).get("outcome", "<not run>")))
        diffs = []
        for key in list(a) + [k for k in b if k not in a]:
            va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
            if va == vb:
                continue
            what = "message" if key.endswith("message") else "type/value"
            diffs.append((key, va, vb, what, deliberate(va, vb, name, key) or _subclass(key, va, vb, b) or ""))
        if diffs:
            out.append((name, diffs))
        else:
            same += 1
    return out, same


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


# awa-pg names that belong to another issue, by glob on the name, with the reason shown in the
# report; the counts still count them as missing or incompatible. None now: the last ones, the
# queue-storage engine's (issue 18), landed in session 15.
OUT_OF_SCOPE: list[tuple[str, str]] = []


def out_of_scope(row: Row) -> str | None:
    if row.status not in ("missing", "incompatible"):
        return None
    if row.path == "awa.AsyncClient.start" and any("storage" not in p for p in row.detail.split("; ") if p):
        return None  # only the queue_storage_* keywords are excused
    return next((why for pattern, why in OUT_OF_SCOPE if fnmatch.fnmatchcase(row.path, pattern)), None)


def counts(rows: list[Row], prefix_filter: Any) -> dict[str, int]:
    sel = [r for r in rows if prefix_filter(r.path)]
    c = {"total": len(sel)}
    for status in ("compatible", "via-kwargs", "incompatible", "missing", "unknown"):
        c[status] = sum(1 for r in sel if r.status == status)
    return c


def render(ref: dict[str, Any], ours: dict[str, Any]) -> str:
    rows, extras = compare_names(ref, ours)
    probe_diffs, same = compare_probes(ref, ours)
    core = counts(rows, lambda p: not p.startswith(("awa.testing", "awa.bridge", "awa.callback_contract")))
    subs = counts(rows, lambda p: p.startswith(("awa.testing", "awa.bridge", "awa.callback_contract")))
    lines = ["# awa-pg 0.6.9 vs ours: compatibility probe report", "",
             "Generated by `bench/compat/run.sh` (`probe.py` run under each package, compared by `diff.py`).",
             (f"Reference: awa-pg {ref['package'].get('awa-pg', '?')}; ours: awa-queue {ours['package'].get('awa-queue', '?')}; "
              f"Python {ours['package'].get('python')}."), "", "## Counts", "",
             ("Public names of awa-pg: `awa.__all__` (its raw native class `RawClient` aside) plus every public member "
              "of those classes; then, separately, `awa.testing`, `awa.bridge` and `awa.callback_contract`."), "",
             "| scope | names | compatible | compatible via **kwargs | incompatible | missing | unknown |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, c in (("`awa` (members included)", core), ("submodules", subs)):
        lines.append(f"| {label} | {c['total']} | {c['compatible']} | {c['via-kwargs']} | {c['incompatible']} | {c['missing']} | {c['unknown']} |")
    both = {k: core[k] + subs[k] for k in core}
    lines.append(f"| all | {both['total']} | {both['compatible']} | {both['via-kwargs']} | {both['incompatible']} | {both['missing']} | {both['unknown']} |")
    total = len(set(ref.get("probes", {})) | set(ours.get("probes", {})))
    lines += ["", f"Behaviour probes: {same} identical, {len(probe_diffs)} with differences (of {total}).", ""]

    lines += ["## Names: missing or incompatible", "",
              "| name | status | detail | awa-pg signature | our signature |", "|---|---|---|---|---|"]
    excused = [r for r in rows if out_of_scope(r)]
    if excused:
        lines[-3:-3] = [f"Of the missing or incompatible names, {len(excused)} belong to the queue-storage engine "
                        "(issue 18, named out of issue 13's scope); each says so below.", ""]
    for r in rows:
        if r.status in ("missing", "incompatible", "unknown", "via-kwargs") or (r.detail and r.status == "compatible"):
            why = out_of_scope(r)
            detail = fmt(r.detail) if r.detail else ""
            if why:
                detail = f"{why}" + (f" ({detail})" if detail else "")
            lines.append(f"| `{r.path}` | {r.status} | {detail} | `{fmt(r.ref_sig)}` | "
                         f"{'`' + fmt(r.ours_sig) + '`' if r.ours_sig else ''} |")
    lines += ["", "## Names: compatible", "", ", ".join(f"`{r.path}`" for r in rows if r.status == "compatible" and not r.detail), ""]
    lines += ["## Our additions (not in awa-pg; fine to keep)", "", ", ".join(f"`{e}`" for e in extras) or "none", ""]

    lines += ["## Behaviour differences", "",
              ("Each row is one observation (a leaf of the probe's result) that differs. `—` means the value is null; "
               "`<absent>` means that side did not record it (an earlier step raised). A reason in the last column marks "
               "a difference as deliberate."), ""]
    for name, diffs in probe_diffs:
        lines += [f"### `{name}`", "", "| observation | awa-pg | ours | differs in | deliberate |", "|---|---|---|---|---|"]
        for key, a, b, what, why in diffs:
            lines.append(f"| `{key or '(value)'}` | {fmt(a)} | {fmt(b)} | {what} | {why} |")
        lines.append("")
    lines += ["## Deliberate differences the probe does not observe", "", "| difference | reason |", "|---|---|"]
    lines += [f"| {what} | {why} |" for what, why in DELIBERATE_UNPROBED]
    lines.append("")
    fa, fb = ref.get("foreign_schema"), ours.get("foreign_schema")
    if fa or fb:
        lines += ["## Foreign schema", "", "```json", json.dumps({"awa-pg": fa, "ours": fb}, indent=1), "```", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="compare two probe.py results")
    parser.add_argument("reference")
    parser.add_argument("ours")
    parser.add_argument("--markdown", help="write the report here instead of stdout")
    parser.add_argument("--foreign", nargs="*", default=[], help="foreign-schema results: ours-on-awa-pg [awa-pg-on-ours]")
    ns = parser.parse_args()
    ref, ours = load(ns.reference), load(ns.ours)
    if ns.foreign:
        ours["foreign_schema"] = load(ns.foreign[0]).get("foreign_schema")
        if len(ns.foreign) > 1:
            ref["foreign_schema"] = load(ns.foreign[1]).get("foreign_schema")
    text = render(ref, ours)
    if ns.markdown:
        with open(ns.markdown, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
