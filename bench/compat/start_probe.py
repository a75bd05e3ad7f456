"""start() configuration probe (issue 13, item 4): the same good and bad start() calls under
awa-pg 0.6.9 and under Awa, printing what each call did (``ok`` or ``ExceptionClass: message``).

    python bench/compat/start_probe.py DATABASE_URL [skip,cases] > out.txt

Run it on a migrated database of the package under test. Under awa-pg skip ``rate_limit_nan``:
awa-pg 0.6.9 accepts a NaN rate and stores it in its runtime snapshot, after which every later
start() on that database fails to decode it. ``start-awa-pg.txt`` and ``start-awa.txt`` are
the two outputs; docs/workers.md lists the deliberate differences.
"""
from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any

import awa

@dataclasses.dataclass
class OkJob:
    x: int = 0

CASES: list[tuple[str, Any, Any, dict[str, Any]]] = [
    ("no_tasks", None, [("q", 1)], {}),
    ("missing_task_queue", "declared_q", [("other_q", 1)], {}),
    ("tuple_with_global", "q", [("q", 1)], {"global_max_workers": 4}),
    ("global_with_none_queues", "q", None, {"global_max_workers": 4}),
    ("dict_no_name", "q", [{"max_workers": 1}], {}),
    ("dict_no_max_workers", "q", [{"name": "q"}], {}),
    ("dict_min_workers_no_global", "q", [{"name": "q", "min_workers": 1}], {}),
    ("dict_max_workers_with_global", "q", [{"name": "q", "max_workers": 1}], {"global_max_workers": 4}),
    ("dict_both", "q", [{"name": "q", "max_workers": 1, "min_workers": 1}], {"global_max_workers": 4}),
    ("dict_both_noglobal", "q", [{"name": "q", "max_workers": 1, "min_workers": 1}], {}),
    ("sum_min_exceeds", "q", [{"name": "q", "min_workers": 3}, {"name": "r", "min_workers": 3}], {"global_max_workers": 4}),
    ("weight_zero", "q", [{"name": "q", "min_workers": 1, "weight": 0}], {"global_max_workers": 4}),
    ("weight_neg", "q", [{"name": "q", "min_workers": 1, "weight": -1}], {"global_max_workers": 4}),
    ("weight_float", "q", [{"name": "q", "min_workers": 1, "weight": 1.5}], {"global_max_workers": 4}),
    ("min_workers_zero", "q", [{"name": "q", "min_workers": 0}], {"global_max_workers": 4}),
    ("global_zero", "q", [{"name": "q", "min_workers": 0}], {"global_max_workers": 0}),
    ("global_neg", "q", [{"name": "q", "min_workers": 0}], {"global_max_workers": -1}),
    ("rate_limit_bad_form", "q", [{"name": "q", "max_workers": 1, "rate_limit": 5}], {}),
    ("rate_limit_list", "q", [{"name": "q", "max_workers": 1, "rate_limit": [5.0, 2]}], {}),
    ("rate_limit_zero_rate", "q", [{"name": "q", "max_workers": 1, "rate_limit": (0.0, 2)}], {}),
    ("rate_limit_zero_burst", "q", [{"name": "q", "max_workers": 1, "rate_limit": (1.0, 0)}], {}),
    ("rate_limit_nan", "q", [{"name": "q", "max_workers": 1, "rate_limit": (float("nan"), 1)}], {}),
    ("rate_limit_none", "q", [{"name": "q", "max_workers": 1, "rate_limit": None}], {}),
    ("rate_limit_int_rate", "q", [{"name": "q", "max_workers": 1, "rate_limit": (5, 2)}], {}),
    ("claimers_zero", "q", [{"name": "q", "max_workers": 1, "claimers": 0}], {}),
    ("claim_batch_size_zero", "q", [{"name": "q", "max_workers": 1, "claim_batch_size": 0}], {}),
    ("deadline_zero", "q", [{"name": "q", "max_workers": 1, "deadline_duration_ms": 0}], {}),
    ("deadline_neg", "q", [{"name": "q", "max_workers": 1, "deadline_duration_ms": -5}], {}),
    ("aging_zero", "q", [{"name": "q", "max_workers": 1, "priority_aging_interval_ms": 0}], {}),
    ("max_workers_zero_dict", "q", [{"name": "q", "max_workers": 0}], {}),
    ("max_workers_neg_dict", "q", [{"name": "q", "max_workers": -1}], {}),
    ("tuple_zero", "q", [("q", 0)], {}),
    ("tuple_neg", "q", [("q", -1)], {}),
    ("queue_string", "q", ["q"], {}),
    ("queue_3tuple", "q", [("q", 1, 2)], {}),
    ("empty_list", "q", [], {}),
    ("unknown_dict_key", "q", [{"name": "q", "max_workers": 1, "bogus": 1}], {}),
    ("cleanup_zero", "q", [("q", 1)], {"cleanup_batch_size": 0}),
    ("rollup_zero", "q", [("q", 1)], {"terminal_count_rollup_interval_ms": 0}),
    ("completed_neg", "q", [("q", 1)], {"completed_retention_hours": -1.0}),
    ("completed_nan", "q", [("q", 1)], {"completed_retention_hours": float("nan")}),
    ("descriptor_neg", "q", [("q", 1)], {"descriptor_retention_days": -1.0}),
    ("descriptor_zero", "q", [("q", 1)], {"descriptor_retention_days": 0.0}),
    ("poll_zero", "q", [("q", 1)], {"poll_interval_ms": 0}),
    ("heartbeat_zero", "q", [("q", 1)], {"heartbeat_interval_ms": 0}),
    ("staleness_zero", "q", [("q", 1)], {"heartbeat_staleness_ms": 0}),
    ("leader_zero", "q", [("q", 1)], {"leader_election_interval_ms": 0}),
    ("promote_neg", "q", [("q", 1)], {"promote_interval_ms": -1}),
    ("dup_queue", "q", [("q", 1), ("q", 2)], {}),
    ("name_empty", "q", [{"name": "", "max_workers": 1}], {}),
    ("name_int", "q", [{"name": 5, "max_workers": 1}], {}),
    ("max_workers_str", "q", [{"name": "q", "max_workers": "2"}], {}),
    ("max_workers_float", "q", [{"name": "q", "max_workers": 2.5}], {}),
    ("ok_weighted", "q", [{"name": "q", "min_workers": 1, "weight": 2}], {"global_max_workers": 4}),
    ("ok_weighted_no_weight", "q", [{"name": "q", "min_workers": 1}], {"global_max_workers": 4}),
    ("ok_weighted_no_min", "q", [{"name": "q", "weight": 2}], {"global_max_workers": 4}),
    ("ok_all", "q", [{"name": "q", "max_workers": 2, "rate_limit": (10.0, 5), "claimers": 2, "claim_batch_size": 4, "deadline_duration_ms": 60000, "priority_aging_interval_ms": 1000}], {"completed_retention_hours": 1.0, "cleanup_batch_size": 100, "descriptor_retention_days": 1.0, "terminal_count_rollup_interval_ms": 100}),
    ("twice", "q", [("q", 1)], {"__twice": True}),
]

async def main(url: str, skip: set[str]) -> None:
    out: dict[str, str] = {}
    for name, task_q, queues, kwargs in CASES:
        if name in skip:
            continue
        kw: dict[str, Any] = dict(kwargs)
        twice = kw.pop("__twice", False)
        c = awa.AsyncClient(url)
        if task_q is not None:
            deco = getattr(c, "worker", None) or c.task

            @deco(OkJob, queue=task_q)
            async def h(job: Any) -> None:
                return None

        try:
            await c.start(queues, **kw)
            if twice:
                await c.start(queues, **kw)
            out[name] = "ok"
        except BaseException as e:  # noqa: BLE001 - the probe records whatever is raised
            # The classes awa-pg code catches: is it one of them?
            also = [k.__name__ for k in (ValueError, TypeError, awa.AwaError) if isinstance(e, k)]
            out[name] = f"{type(e).__name__}[{','.join(also)}]: {e}"
        try:
            await c.shutdown()
        except BaseException:  # noqa: BLE001
            pass
        try:
            await c.close()
        except BaseException:  # noqa: BLE001
            pass
    for k, v in out.items():
        print(f"{k:30} {v}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], set(sys.argv[2].split(",")) if len(sys.argv) > 2 else set()))
