"""What one idle claim costs on each engine, next to what a claim on queue storage's tables could
cost at best (issue 18's idle pickup target; docs/queue-storage-design.md, "What an idle claim
costs, and what it could cost").

    bash bench/run.sh --claim-cost              # 7 rounds (~3 min warm)
    bash bench/run.sh --claim-cost --rounds 1   # a smoke run

Each run is ``pgbench`` with one client on a fresh database, looping: insert one job, claim it,
complete it. The figure is the claim statement's latency as the client sees it (``pgbench -r``:
the round trip, the execution and the commit with its WAL flush), which is what an idle pickup
waits for. Three claims, each round in a rotating order:

- ``canonical``: the runtime's claim statement (awa-core ``storage/claim.rs``) on canonical storage;
- ``queue_storage``: ``qs_claim_queue``, called as the runtime calls it;
- ``one_statement``: the lane's row lock, the pick from the current slot, the lease and the cursor
  move in one statement on queue storage's tables. **Not a correct claim** (no stable point, no
  claimed-entry check, one priority lane, the slot given): the least a claim that writes what
  queue storage's claim writes can cost, so the gap between it and ``queue_storage`` is what the
  claim's protocol costs.

Outputs: ``docs/claim-cost.{json,md,png}`` for a run of 5 or more rounds, otherwise
``bench/results/claim-cost.{json,md,png}`` (git-ignored). Re-render: ``--render FILE.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import orchestrate  # noqa: E402  (databases, the run's metadata)

BENCH = orchestrate.BENCH
RESULTS = os.path.join(BENCH, "results")
FULL_ROUNDS = 5
CLAIMS = ["canonical", "queue_storage", "one_statement"]
QUEUE = "pb"

# A job inserted through each engine's own insert path (one row, priority 2, due now).
QS_INSERT = (
    f"SELECT * FROM awa.qs_enqueue(ARRAY['k'], ARRAY['{QUEUE}'], ARRAY['{{}}'::jsonb], "
    "ARRAY[2::smallint], ARRAY[25], ARRAY[NULL::timestamptz], ARRAY[NULL::jsonb], "
    "ARRAY[NULL::jsonb], ARRAY[NULL::bytea], ARRAY[NULL::smallint], ARRAY[NULL::text], false);"
)
QS_COMPLETE = "SELECT * FROM awa.qs_complete(ARRAY[:id]::bigint[], ARRAY[:run_lease]::bigint[]);"

SCRIPTS = {
    "canonical": "\n".join([
        f"INSERT INTO awa.canonical_jobs (kind, queue) VALUES ('k', '{QUEUE}');",
        # storage/claim.rs's statement for one queue, no kind, no aging.
        "WITH picked AS (SELECT id FROM awa.canonical_jobs WHERE state = 'available' "
        f"AND queue = '{QUEUE}' AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m "
        f"WHERE m.queue = '{QUEUE}' AND m.paused) ORDER BY priority, run_at, id LIMIT 32 "
        "FOR UPDATE SKIP LOCKED) UPDATE awa.canonical_jobs j SET state = 'running', "
        "attempt = j.attempt + 1, run_lease = j.run_lease + 1, attempted_at = now(), "
        "heartbeat_at = now(), deadline_at = now() + interval '300 s', callback_id = NULL, "
        "callback_timeout_at = NULL, callback_result = NULL, cancel_requested_at = NULL "
        "FROM picked WHERE j.id = picked.id RETURNING j.id, j.run_lease \\gset",
        "UPDATE awa.canonical_jobs SET state = 'completed', finalized_at = now(), "
        "heartbeat_at = NULL, deadline_at = NULL WHERE id = :id AND run_lease = :run_lease "
        "AND state = 'running';",
    ]),
    "queue_storage": "\n".join([
        QS_INSERT,
        f"SELECT id, run_lease FROM awa.qs_claim_queue('{QUEUE}', 32, interval '300 s') \\gset",
        QS_COMPLETE,
    ]),
    # The slot bounds are variables (:lo, :hi, set by the runner), so that the plan is generic
    # over every queue slot and prunes at executor start, as the real claim's plans do.
    "one_statement": "\n".join([
        QS_INSERT,
        f"WITH l AS (SELECT cursor FROM awa.lanes WHERE queue = '{QUEUE}' AND priority = 2 "
        "FOR UPDATE), p AS (SELECT e.* FROM awa.ready_entries e WHERE e.slot BETWEEN :lo AND :hi "
        f"AND e.queue = '{QUEUE}' AND e.priority = 2 AND e.seq >= (SELECT cursor FROM l) "
        "ORDER BY e.seq LIMIT 32), ins AS (INSERT INTO awa.leases (lease_slot, id, run_lease, "
        "queue, priority, slot, generation, seq, attempt, heartbeat_at, deadline_at, "
        "attempted_at) SELECT (SELECT current FROM awa.lease_ring_state), p.id, "
        f"p.run_lease + 1, '{QUEUE}', 2, p.slot, p.generation, p.seq, p.attempt + 1, now(), "
        "now() + interval '300 s', now() FROM p), upd AS (UPDATE awa.lanes SET cursor = "
        f"(SELECT max(seq) + 1 FROM p) WHERE queue = '{QUEUE}' AND priority = 2 "
        "AND EXISTS (SELECT 1 FROM p)) SELECT p.id, p.run_lease + 1 AS run_lease FROM p \\gset",
        QS_COMPLETE,
    ]),
}


def claim_latency_ms(pgbench_out: str) -> float:
    """The claim's average latency (ms) from ``pgbench -r`` output: the second statement of
    the script (insert, claim, complete)."""
    lines = pgbench_out.splitlines()
    try:
        start = next(i for i, x in enumerate(lines) if "statement latencies" in x)
    except StopIteration:
        raise ValueError("no per-statement latencies in pgbench's output") from None
    stmts = [x for x in lines[start + 1:] if re.match(r"\s+[0-9.]+\s+\d+\s+\S", x)]
    stmts = [x for x in stmts if not x.split(None, 2)[2].startswith("\\set")]
    if len(stmts) < 2:
        raise ValueError("fewer than two statements in pgbench's per-statement latencies")
    return float(stmts[1].split()[0])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"claims": {}, "ratios": {}}
    for c in CLAIMS:
        ms = [r["claim_ms"] for r in runs if r["ok"] and r["claim"] == c]
        if ms:
            out["claims"][c] = {"median": statistics.median(ms), "min": min(ms), "max": max(ms),
                                "n": len(ms)}
    base = out["claims"].get("canonical", {}).get("median")
    if base:
        for c, s in out["claims"].items():
            out["ratios"][c] = s["median"] / base
    return out


def render(data: dict[str, Any]) -> str:
    s = data["summary"]
    p = data["params"]
    meta = data["meta"]
    lines = [
        "# What one idle claim costs",
        "",
        f"Generated by `{data['command']}` on {data['started']}, "
        f"{orchestrate.commit_note(meta['git'])}; {meta['machine']}. "
        f"{p['rounds']} round(s) of {p['loops']:,} loops (insert one job, claim it, complete it) "
        "per claim, `pgbench` with one client, each claim on a fresh database, the order rotating "
        "by round. The figure is the claim statement's latency as the client sees it (round trip, "
        "execution, commit); medians (min-max) of the rounds' averages; the ratio is over "
        "canonical's.",
        "",
        "| claim | ms per claim | ratio |",
        "| --- | --- | --- |",
    ]
    names = {"canonical": "canonical (storage/claim.rs)",
             "queue_storage": "queue storage (`qs_claim_queue`)",
             "one_statement": "one statement on queue storage's tables (not a correct claim: "
                              "the least one can cost)"}
    for c in CLAIMS:
        if c in s["claims"]:
            v = s["claims"][c]
            ratio = s["ratios"].get(c)
            lines.append(f"| {names[c]} | {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f}) | "
                         f"{'' if ratio is None else f'{ratio:.2f}x'} |")
    lines += ["", f"Server: autovacuum {data['autovacuum']}.", ""]
    return "\n".join(lines)


def plot(json_path: str, png_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        data = json.load(f)
    claims = data["summary"]["claims"]
    cs = [c for c in CLAIMS if c in claims]
    med = [claims[c]["median"] for c in cs]
    lo = [claims[c]["median"] - claims[c]["min"] for c in cs]
    hi = [claims[c]["max"] - claims[c]["median"] for c in cs]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(range(len(cs)), med, yerr=[lo, hi], capsize=3,
           color=["#1f77b4", "#17becf", "#bbbbbb"][: len(cs)])
    ax.set_xticks(range(len(cs)))
    ax.set_xticklabels(cs, fontsize=8)
    ax.set_ylabel("ms per claim (client side)", fontsize=8)
    ax.set_title("one idle claim: insert, claim, complete in a loop", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


def write(data: dict[str, Any], json_path: str) -> None:
    orchestrate.write_report(data, json_path,
                             lambda png: render(data) + f"\n![claim cost chart]({png})\n", __file__)


def prepare(rust_bin: str, url: str, claim: str) -> dict[str, str]:
    """Migrate (and install queue storage) with the bench binary's engine drain of no jobs;
    returns the pgbench variables the claim's script needs."""
    engine = "canonical" if claim == "canonical" else "queue_storage"
    out = subprocess.run([rust_bin, "engine_drain", "--engine", engine, "--url", url, "--jobs", "0",
                          "--pickups", "0"], capture_output=True, text=True, timeout=300,
                         check=False)
    if out.returncode != 0 or "BENCH_RESULT" not in out.stdout:
        raise RuntimeError(f"set-up failed: {(out.stderr or out.stdout).strip()[-300:]}")
    if claim == "canonical":
        return {}
    # The lane exists and stands past every seq drawn, as after an idle claim.
    orchestrate.psql(url, f"INSERT INTO awa.lanes (queue, priority) VALUES ('{QUEUE}', 2) "
                          "ON CONFLICT DO NOTHING; "
                          "UPDATE awa.lanes SET cursor = awa.qs_last_seq() + 1, "
                          "stable_seq = awa.qs_last_seq(), cand_seq = awa.qs_last_seq() "
                          f"WHERE queue = '{QUEUE}'")
    slot = orchestrate.psql(url, "SELECT current FROM awa.queue_ring_state")
    return {"lo": slot, "hi": slot}


def run_one(rust_bin: str, admin_url: str, claim: str, rnd: int, loops: int, log) -> dict[str, Any]:
    name = f"awa_claim_cost_{claim}"
    url = orchestrate.fresh_db(admin_url, name)
    try:
        variables = prepare(rust_bin, url, claim)
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
            f.write("".join(f"\\set {k} {v}\n" for k, v in variables.items()))
            f.write(SCRIPTS[claim] + "\n")
            script = f.name
        try:
            env = dict(os.environ)
            if claim == "one_statement":
                # Planned once and kept, as the real claim's statements are (their function
                # sets the same): left to choose, the planner keeps planning it for every call.
                env["PGOPTIONS"] = (env.get("PGOPTIONS", "") + " -c plan_cache_mode=force_generic_plan").strip()
            out = subprocess.run(["pgbench", "-n", "-M", "prepared", "-r", "-t", str(loops),
                                  "-f", script, "-d", url], capture_output=True, text=True,
                                 timeout=1200, check=False, env=env)
        finally:
            os.unlink(script)
        log.write(out.stdout + out.stderr)
        if out.returncode != 0:
            return {"claim": claim, "round": rnd, "ok": False,
                    "error": (out.stderr.strip() or "pgbench failed")[-300:]}
        return {"claim": claim, "round": rnd, "ok": True, "claim_ms": claim_latency_ms(out.stdout)}
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        return {"claim": claim, "round": rnd, "ok": False, "error": str(e)[-300:]}
    finally:
        orchestrate.drop_db(admin_url, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--loops", type=int, default=2000)
    p.add_argument("--rust-bin", default="")
    p.add_argument("--command", default="python3 bench/claim_cost.py")
    args = orchestrate.report_args(p, plot, write)
    if args is None:
        return
    if not args.rust_bin:
        p.error("--rust-bin is required (bash bench/run.sh --claim-cost builds and passes it)")
    admin_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    os.makedirs(RESULTS, exist_ok=True)
    data = orchestrate.run_record(args.command, admin_url,
                                  {"rounds": args.rounds, "loops": args.loops})
    with open(os.path.join(RESULTS, "claim-cost.log"), "w") as log:
        for rnd in range(1, args.rounds + 1):
            k = (rnd - 1) % len(CLAIMS)
            for claim in CLAIMS[k:] + CLAIMS[:k]:
                rec = run_one(args.rust_bin, admin_url, claim, rnd, args.loops, log)
                data["runs"].append(rec)
                if rec["ok"]:
                    print(f"round {rnd} {claim}: {rec['claim_ms']:.3f} ms per claim", flush=True)
                else:
                    print(f"round {rnd} {claim}: FAILED {rec['error']}", flush=True)
    data["summary"] = summarize(data["runs"])
    folder = orchestrate.DOCS if args.rounds >= FULL_ROUNDS else RESULTS
    write(data, os.path.join(folder, "claim-cost.json"))


if __name__ == "__main__":
    main()
