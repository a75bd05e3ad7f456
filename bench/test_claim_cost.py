"""Tests of the claim-cost bench's bookkeeping (bench/claim_cost.py; no database): the claim's
latency is read from pgbench's per-statement report whatever variables the script sets, medians
and ratios are over canonical's, failed runs are left out, and the committed report (when there
is one) is what its JSON renders to.

Run with ``python -m pytest bench/test_claim_cost.py``.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import claim_cost

COMMITTED = os.path.join(claim_cost.orchestrate.DOCS, "claim-cost.json")

PGBENCH_R = """\
latency average = 1.375 ms
tps = 727.115 (without initial connection time)
statement latencies in milliseconds and failures:
         0.002           0  \\set lo 12
         0.001           0  \\set hi 12
         0.611           0  SELECT * FROM awa.qs_enqueue(ARRAY['k'], ...);
         0.493           0  WITH l AS (SELECT cursor FROM awa.lanes ...) \\gset
         0.500           0  SELECT * FROM awa.qs_complete(ARRAY[:id]::bigint[], ...);
"""


def test_the_claim_is_the_second_sql_statement_whatever_the_variables() -> None:
    assert claim_cost.claim_latency_ms(PGBENCH_R) == pytest.approx(0.493)
    without_sets = "\n".join(x for x in PGBENCH_R.splitlines() if "\\set" not in x)
    assert claim_cost.claim_latency_ms(without_sets) == pytest.approx(0.493)


def test_output_without_latencies_is_an_error() -> None:
    with pytest.raises(ValueError):
        claim_cost.claim_latency_ms("latency average = 1.0 ms\n")
    with pytest.raises(ValueError):
        claim_cost.claim_latency_ms(PGBENCH_R.split("         0.493")[0])


def test_medians_and_ratios_over_canonical_leave_failed_runs_out() -> None:
    runs = [{"claim": "canonical", "round": 1, "ok": True, "claim_ms": 0.4},
            {"claim": "canonical", "round": 2, "ok": True, "claim_ms": 0.6},
            {"claim": "queue_storage", "round": 1, "ok": True, "claim_ms": 1.0},
            {"claim": "queue_storage", "round": 2, "ok": False, "error": "boom"},
            {"claim": "one_statement", "round": 1, "ok": True, "claim_ms": 0.45}]
    s = claim_cost.summarize(runs)
    assert s["claims"]["canonical"]["median"] == pytest.approx(0.5)
    assert s["claims"]["queue_storage"]["n"] == 1
    assert s["ratios"]["queue_storage"] == pytest.approx(2.0)
    assert s["ratios"]["one_statement"] == pytest.approx(0.9)


@pytest.mark.skipif(not os.path.exists(COMMITTED), reason="no committed claim-cost run")
def test_the_committed_report_is_what_its_json_renders_to() -> None:
    with open(COMMITTED) as f:
        data = json.load(f)
    with open(os.path.splitext(COMMITTED)[0] + ".md") as f:
        have = f.read()
    assert have == claim_cost.render(data) + "\n![claim cost chart](claim-cost.png)\n"
