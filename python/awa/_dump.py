"""``dump_job`` / ``dump_run``: a job's lifecycle as pretty JSON, in awa-pg 0.6.9's shape.

Built from the job row alone (its timestamps and ``errors`` history): everything Awa records
about a job is on its row, so there is nothing else to join. The CLI (issue 16) prints these.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Optional

from . import _awa
from ._job import parse_timestamp

__all__ = ["dump_job_text", "dump_run_text"]

_FINISHED = ("completed", "failed", "cancelled")
# What admin.rs accepts: retry() of failed, cancelled, retryable or scheduled jobs; cancel()
# of anything not finished.
_RETRYABLE = ("failed", "cancelled", "retryable", "scheduled")


def _event(timestamp: Optional[str], label: str, *, state: Optional[str] = None,
           detail: Optional[str] = None, is_error: bool = False) -> dict[str, Any]:
    return {"timestamp": timestamp, "label": label, "state": state, "detail": detail, "is_error": is_error}


def _timeline(row: dict[str, Any]) -> list[dict[str, Any]]:
    events = [_event(row["created_at"], "Created")]
    for entry in row.get("errors") or []:
        events.append(_event(entry.get("at"), f"Attempt {entry.get('attempt')} failed",
                             detail=entry.get("error"), is_error=True))
    if row.get("attempted_at") and row["attempt"] > 0:
        events.append(_event(row["attempted_at"], f"Attempt {row['attempt']} started", state="running"))
    if row["state"] == "waiting_external" and row.get("callback_id"):
        events.append(_event(row.get("attempted_at"), "Waiting for callback", state="waiting_external",
                             detail=row["callback_id"]))
    if row["state"] in _FINISHED and row.get("finalized_at"):
        events.append(_event(row["finalized_at"], row["state"].capitalize(), state=row["state"],
                             is_error=row["state"] == "failed"))
    # By instant (the texts may differ in precision); stable, so equal instants keep the
    # order above (created, errors, start, finish). An event without a time sorts last.
    far = _dt.datetime.max.replace(tzinfo=_dt.timezone.utc)

    def instant(event: dict[str, Any]) -> _dt.datetime:
        return parse_timestamp(event["timestamp"]) or far

    return sorted(events, key=instant)


def dump_job_text(row: dict[str, Any]) -> str:
    """``{"job": <row>, "summary": {...}, "timeline": [...]}`` as indented JSON."""
    errors = row.get("errors") or []
    summary = {
        # Awa does not age priorities, so the stored one is the original.
        "original_priority": row["priority"],
        "can_retry": row["state"] in _RETRYABLE,
        "can_cancel": row["state"] not in _FINISHED,
        "error_count": len(errors),
        "latest_error": errors[-1].get("error") if errors else None,
    }
    return json.dumps({"job": row, "summary": summary, "timeline": _timeline(row)}, indent=2)


def dump_run_text(row: dict[str, Any], attempt: Optional[int]) -> str:
    """One attempt of the job (the current one by default) as indented JSON. An attempt that
    is neither the current one nor in the error history raises ``awa.ValidationError``."""
    current = row["attempt"]
    selected = current if attempt is None else attempt
    if isinstance(selected, bool) or not isinstance(selected, int):
        raise _awa.ValidationError(f"attempt must be an int, not {type(selected).__name__}")
    history = [e for e in row.get("errors") or [] if e.get("attempt") == selected]
    notes: list[str] = []
    if selected == current:
        entry = history[-1] if history else None
        started = row.get("attempted_at") if current > 0 else None
        finished = row.get("finalized_at") if row["state"] in _FINISHED else (entry or {}).get("at")
        if current == 0:
            notes.append("Job has not been claimed yet; attempt 0 is the pre-run snapshot.")
        run = {
            "source": "current_job_row",
            "state": row["state"],
            "selected_run_lease": row["run_lease"],
            "started_at": started,
            "finished_at": finished,
            "terminal": (row["state"] in _FINISHED) if current > 0 else None,
            "progress": row.get("progress"),
            "callback": (
                {"callback_id": row["callback_id"], "timeout_at": row.get("callback_timeout_at")}
                if row.get("callback_id") else None
            ),
        }
    elif history:
        entry = history[-1]
        notes.append("Reconstructed from the job's error history; only the failure is recorded.")
        run = {
            "source": "error_history",
            "state": "failed" if entry.get("terminal") else "retryable",
            "selected_run_lease": None,
            "started_at": None,
            "finished_at": entry.get("at"),
            "terminal": bool(entry.get("terminal", False)),
            "progress": None,
            "callback": None,
        }
    else:
        raise _awa.ValidationError(
            f"attempt {selected} is not present in the recorded error history for job {row['id']}"
        )
    out = {
        "job_id": row["id"],
        "kind": row["kind"],
        "queue": row["queue"],
        "selected_attempt": selected,
        "current_attempt": current,
        "current_run_lease": row["run_lease"],
        "selected_run_lease": run["selected_run_lease"],
        "source": run["source"],
        "state": run["state"],
        "started_at": run["started_at"],
        "finished_at": run["finished_at"],
        "error": entry.get("error") if entry else None,
        "terminal": run["terminal"],
        "progress": run["progress"],
        "metadata": row.get("metadata") or {},
        "callback": run["callback"],
        "raw_error_entry": entry,
        "notes": notes,
    }
    return json.dumps(out, indent=2)
