"""How fast ``awa serve``'s API answers on a big table (issue 16, item 6): fills a fresh
database with ``--jobs`` rows (default one million) spread over states, queues, kinds, tags
and a week of finalization times, plus DLQ rows, then times each route over real HTTP,
sequentially, and prints p50 / p95 / max per route. The target: ``/api/stats`` and
``/api/jobs`` under 100 ms p95.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/operate.py [--jobs 1000000] [--requests 40] [--json out.json]

Run it with the project's virtualenv (the wheel installed). The database it creates
(``awa_bench_operate``) is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request

import awa
from awa._serve import ServeConfig, Server

ROUTES = [
    # (label, path, part of the 100 ms target)
    ("stats", "/api/stats", True),
    ("jobs", "/api/jobs", True),
    ("jobs state=failed", "/api/jobs?state=failed", True),
    ("jobs state=available queue", "/api/jobs?state=available&queue=q3", True),
    ("jobs kind", "/api/jobs?kind=kind_7", True),
    ("jobs tag", "/api/jobs?tag=tenant-3", True),
    ("jobs page deep", "/api/jobs?before_id={mid}", True),
    ("jobs state=failed page deep", "/api/jobs?state=failed&before_id={mid}", True),
    ("job detail", "/api/jobs/{mid}", False),
    ("kinds", "/api/kinds", False),
    ("dlq", "/api/dlq", False),
    ("dlq depth", "/api/dlq/depth", False),
    ("timeseries 60 min", "/api/stats/timeseries?minutes=60", False),
    ("queues", "/api/queues", False),
    ("metrics", "/metrics", False),
]

FILL = """
INSERT INTO awa.jobs (kind, queue, args, state, attempt, run_at, created_at, finalized_at, attempted_at, tags, errors)
SELECT 'kind_' || (i % 20), 'q' || (i % 8), jsonb_build_object('n', i),
       s.state,
       CASE WHEN s.state IN ('completed', 'failed', 'cancelled', 'retryable', 'running') THEN 1 ELSE 0 END,
       CASE WHEN s.state = 'scheduled' THEN now() + interval '1 hour' ELSE t.at END,
       t.at,
       CASE WHEN s.state IN ('completed', 'failed', 'cancelled') THEN t.at ELSE NULL END,
       CASE WHEN s.state IN ('completed', 'failed', 'cancelled', 'retryable', 'running') THEN t.at ELSE NULL END,
       ARRAY['tenant-' || (i % 50)],
       CASE WHEN s.state IN ('failed', 'retryable')
            THEN jsonb_build_array(jsonb_build_object('attempt', 1, 'at', t.at, 'error', 'boom')) ELSE '[]'::jsonb END
FROM generate_series(1, $1::bigint) AS i
CROSS JOIN LATERAL (SELECT CASE
        WHEN r < 0.90 THEN 'completed' WHEN r < 0.92 THEN 'failed' WHEN r < 0.93 THEN 'cancelled'
        WHEN r < 0.98 THEN 'available' WHEN r < 0.99 THEN 'scheduled' WHEN r < 0.995 THEN 'retryable'
        ELSE 'running' END AS state FROM (SELECT random() AS r, i) x) s
CROSS JOIN LATERAL (SELECT now() - (($1::bigint - i)::float8 / $1::bigint) * interval '7 days' AS at) t
"""

DLQ_FILL = """
INSERT INTO awa.jobs_dlq (id, kind, queue, args, priority, attempt, max_attempts, created_at, errors, metadata, tags,
                          reason, original_run_lease)
SELECT $1::bigint + i, 'kind_' || (i % 20), 'q' || (i % 8), '{}', 2, 25, 25, now(), '[]', '{}', '{}', 'exhausted', 1
FROM generate_series(1, $2::bigint) AS i
"""


def admin(url: str, sql: str) -> None:
    with awa.Client(url, max_connections=1) as c:
        c._run(c._async._execute(sql))


def with_db(url: str, name: str) -> str:
    return urllib.parse.urlunparse(urllib.parse.urlparse(url)._replace(path="/" + name))


def timed(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status}")
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--dlq", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=40, help="timed requests per route (after 3 warm-ups)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the database a --keep run left (same --jobs), without filling it again")
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = "awa_bench_operate"
    url = with_db(base, name)
    if not args.reuse:
        admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin(base, f'CREATE DATABASE "{name}"')
    try:
        t0 = time.perf_counter()
        if not args.reuse:
            with awa.Client(url, max_connections=2) as c:
                c.migrate()
                c._run(c._async._execute(FILL, args.jobs))
                c._run(c._async._execute(DLQ_FILL, args.jobs * 2, args.dlq))
                c._run(c._async._execute("VACUUM (ANALYZE) awa.canonical_jobs"))
                c._run(c._async._execute("VACUUM (ANALYZE) awa.jobs_dlq"))
        fill_s = time.perf_counter() - t0
        print(f"filled {args.jobs} jobs and {args.dlq} DLQ rows in {fill_s:.0f} s", file=sys.stderr)
        server = Server(ServeConfig(url, port=0))
        thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
        thread.start()
        results = []
        try:
            for label, path, target in ROUTES:
                full = server.url + path.format(mid=args.jobs // 2)
                for _ in range(3):
                    timed(full)
                samples = sorted(timed(full) for _ in range(args.requests))
                p95 = samples[max(0, int(round(0.95 * len(samples))) - 1)]
                results.append({"route": label, "path": path, "target": target, "p50_ms": round(statistics.median(samples), 1),
                                "p95_ms": round(p95, 1), "max_ms": round(samples[-1], 1)})
                r = results[-1]
                print(f"{label:30} p50 {r['p50_ms']:8.1f} ms  p95 {r['p95_ms']:8.1f} ms  max {r['max_ms']:8.1f} ms"
                      f"{'  (target < 100 ms)' if target else ''}")
        finally:
            server.httpd.shutdown()
            server.close()
        report = {"jobs": args.jobs, "dlq": args.dlq, "requests": args.requests, "fill_seconds": round(fill_s),
                  "load_average": os.getloadavg()[0], "results": results}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
        missed = [r["route"] for r in results if r["target"] and r["p95_ms"] >= 100]
        print("target met" if not missed else f"target missed: {', '.join(missed)}", file=sys.stderr)
        return 0
    finally:
        if not args.keep and not args.reuse:
            admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
