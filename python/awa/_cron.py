"""Periodic (cron) jobs: the registration ``client.periodic(...)`` keeps until ``start()``, and
the schedule operations. See ``docs/periodic.md``.

The schedules live in the database (``awa.cron_jobs``); whichever client is the maintenance
leader enqueues each fire exactly once. ``AsyncClient`` and ``Client`` delegate here.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

from . import _awa
from ._convert import build_request, derive_kind
from ._job import Job, job_from_json

__all__ = ["MISSED_FIRE_POLICIES", "registration"]

MISSED_FIRE_POLICIES = ("coalesce", "catch_up")


def registration(
    name: str,
    cron_expr: str,
    args_type: Any,
    args: Any,
    *,
    timezone: str,
    queue: str,
    priority: int,
    max_attempts: int,
    tags: Optional[Sequence[str]],
    metadata: Optional[Mapping[str, Any]],
    missed_fire_policy: str,
) -> str:
    """Check a ``periodic()`` registration and return it as the JSON the engine upserts.

    Raises ``awa.ValidationError`` naming the schedule for a bad expression, zone, policy or
    job option, so mistakes surface at registration, not at the first fire.
    """
    if not isinstance(args_type, type) or args_type is dict:
        raise _awa.ValidationError(
            f"periodic job {name!r}: args_type must be a class (its name gives the job kind)"
        )
    request = build_request(
        args, kind=derive_kind(args_type.__name__), queue=queue, priority=priority,
        max_attempts=max_attempts, tags=tags, metadata=metadata,
    )
    text = json.dumps({
        "name": name, "cron_expr": cron_expr, "timezone": timezone,
        "missed_fire_policy": missed_fire_policy, "request": request,
    })
    _awa.cron_check(text)
    return text


async def upsert(native: Any, registrations: Mapping[str, str]) -> None:
    """Write the registrations to ``awa.cron_jobs`` (called by ``start()``)."""
    if registrations:
        await _awa.cron_upsert(native, list(registrations.values()))


async def list_cron_jobs(native: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(await _awa.cron_list(native))
    return rows


def list_cron_jobs_sync(native: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(_awa.cron_list(native, blocking=True))
    return rows


async def delete_cron_job(native: Any, name: str) -> bool:
    return bool(await _awa.cron_delete(native, name))


def delete_cron_job_sync(native: Any, name: str) -> bool:
    return bool(_awa.cron_delete(native, name, blocking=True))


async def set_paused(native: Any, name: str, paused: bool) -> bool:
    return bool(await _awa.cron_set_paused(native, name, paused))


def set_paused_sync(native: Any, name: str, paused: bool) -> bool:
    return bool(_awa.cron_set_paused(native, name, paused, blocking=True))


def _job(text: Optional[str]) -> Optional[Job]:
    return None if text is None else job_from_json(text)


async def trigger(native: Any, name: str) -> Optional[Job]:
    return _job(await _awa.cron_trigger(native, name))


def trigger_sync(native: Any, name: str) -> Optional[Job]:
    return _job(_awa.cron_trigger(native, name, blocking=True))
