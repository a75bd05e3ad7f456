"""Regenerate the unique-key known-answer vectors from awa-pg 0.6.9 itself.

Each case inserts one unique job with awa-pg's own ``AsyncClient.insert`` on a scratch
database that awa-pg's ``migrate`` created, reads the ``unique_key`` awa-pg stored, and writes
``awa-core/src/model/unique_key_vectors.json``: the inputs (kind, queue, the args as JSON,
the unique options) and the key awa-pg produced. ``awa-core``'s unit test
(``model::unique_key::tests::matches_awa_pg_vectors``) recomputes every key and compares
bytes, so the equality with awa-pg is proven without awa-pg at test time.

The script also records two facts the design depends on (``facts`` in the JSON):

* whether ``unique_opts["states"]`` changes the key (it does not in awa-pg 0.6.9: the states
  are stored beside the key);
* what awa-pg 0.6.9 hashes for ``by_period``: the period length itself, not the bucket
  ``floor(run_at / period)`` (see docs/unique-keys.md, "Differences from awa-pg").

Run it with the awa-pg virtualenv (any server; it creates and drops its own database)::

    python3 -m venv bench/.venvs/awa_pg_keys
    bench/.venvs/awa_pg_keys/bin/pip install awa-pg==0.6.9 'psycopg[binary]'
    bench/.venvs/awa_pg_keys/bin/python bench/compat/unique_key_vectors.py \
        --database-url postgres://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as md
import json
import pathlib
import uuid
from typing import Any

import awa
import psycopg

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "awa-core" / "src" / "model" / "unique_key_vectors.json"

# (name, kind, queue, args, unique_opts). Each case has its own kind, so no two conflict.
CASES: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]] = [
    ("kind_only", "kv_kind_only", "default", {"x": 1}, {"by_args": False}),
    ("kind_only_other_queue", "kv_kind_only_q", "elsewhere", {"x": 1}, {"by_args": False}),
    ("by_queue", "kv_by_queue", "emails", {"x": 1}, {"by_args": False, "by_queue": True}),
    ("by_queue_unicode", "kv_by_queue_u", "files-été", {}, {"by_args": False, "by_queue": True}),
    ("by_args_default_opts", "kv_args_default", "default", {"to": "a@b.com"}, {}),
    ("by_args_empty", "kv_args_empty", "default", {}, {"by_args": True}),
    (
        "by_args_key_order",
        "kv_args_order",
        "default",
        {"zeta": 1, "alpha": 2, "Mid": 3, "_u": 4, "a1": 5, "a": 6},
        {"by_args": True},
    ),
    (
        "by_args_nested",
        "kv_args_nested",
        "default",
        {"b": {"y": [3, {"q": None, "p": True}], "x": {"d": 1, "c": "two"}}, "a": [[], {}]},
        {"by_args": True},
    ),
    (
        "by_args_unicode",
        "kv_args_unicode",
        "default",
        {"emoji": "🎉", "cjk": "日本語", "é": "ü", "quote": 'say "hi"\n\t\\', "ctl": "\u0001\u007f"},
        {"by_args": True},
    ),
    (
        "by_args_large_ints",
        "kv_args_ints",
        "default",
        {"max_i64": 2**63 - 1, "min_i64": -(2**63), "zero": 0, "neg": -7},
        {"by_args": True},
    ),
    # Past 2**64 both packages hash a float (JSON cannot carry the int exactly to serde_json).
    ("by_args_beyond_u64", "kv_args_beyond_u64", "default", {"big": 2**70}, {"by_args": True}),
    # awa-pg converts an int above 2**63 - 1 to a float (and stores the float); we keep the
    # exact integer, so this key differs by design (DIFFERS below).
    (
        "by_args_floats",
        "kv_args_floats",
        "default",
        {"half": 1.5, "one": 1.0, "big": 1e20, "tiny": 1e-7,
         "tenth": 0.1, "neg": -2.5, "negzero": -0.0, "third": 1 / 3},
        {"by_args": True},
    ),
    ("by_args_u64_above_i64", "kv_args_u64", "default", {"u": 2**64 - 1}, {"by_args": True}),
    ("by_period_3600", "kv_period_3600", "default", {"x": 1}, {"by_args": False, "by_period": 3600}),
    ("by_period_bucket_like", "kv_period_bucket", "default", {"x": 1},
     {"by_args": False, "by_period": 493_520}),
    (
        "all_parts",
        "kv_all_parts",
        "jobs",
        {"user": 42, "tags": ["a", "b"]},
        {"by_queue": True, "by_args": True, "by_period": 86_400},
    ),
    ("queue_and_args", "kv_queue_args", "q1", {"k": "v"}, {"by_queue": True, "by_args": True}),
    ("states_only_differ_a", "kv_states", "default", {"x": 1},
     {"by_args": False, "states": 6}),
]


#: Cases whose key differs from awa-pg's on purpose, with the reason (docs/unique-keys.md).
DIFFERS = {
    "by_args_u64_above_i64": "awa-pg turns an int above 2**63 - 1 into a float before hashing "
    "and storing it; awa keeps and hashes the exact integer",
}


async def insert_case(client: Any, case: tuple[str, str, str, dict[str, Any], dict[str, Any]]) -> Any:
    """Insert with awa-pg; returns the args as awa-pg stored them."""
    _name, kind, queue, args, opts = case
    job = await client.insert(args, kind=kind, queue=queue, unique_opts=opts)
    return job.args


def read_keys(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT kind, encode(unique_key, 'hex') FROM awa.jobs").fetchall()
    return {kind: key for kind, key in rows}


async def states_fact(client: Any, url: str) -> dict[str, Any]:
    """Insert the ``states`` case's kind again with other states: a conflict (same key) or not.
    Cancel the first row to let the second in, then compare the stored keys."""
    first = read_keys(url)["kv_states"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE awa.jobs SET state = 'cancelled', finalized_at = now() WHERE kind = 'kv_states'")
    await client.insert({"x": 1}, kind="kv_states", unique_opts={"by_args": False, "states": 2})
    with psycopg.connect(url) as conn:
        keys = {r[0] for r in conn.execute(
            "SELECT encode(unique_key, 'hex') FROM awa.jobs WHERE kind = 'kv_states'").fetchall()}
    return {"states_change_key": keys != {first}, "key": first}


async def period_fact(client: Any) -> dict[str, Any]:
    """awa-pg's own cancel_by_unique_key finds a by_period=3600 job with period_bucket=3600:
    the hashed value is the period length."""
    job = await client.cancel_by_unique_key("kv_period_3600", period_bucket=3600)
    return {"cancel_by_unique_key_period_bucket_3600_finds_by_period_3600_job": job is not None}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--out", default=str(OUT))
    ns = parser.parse_args()
    base = ns.database_url
    db = f"awa_keys_{uuid.uuid4().hex[:12]}"
    url = base.rsplit("/", 1)[0] + "/" + db
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    try:
        await awa.migrate(url)
        client = awa.AsyncClient(url)
        stored = {case[0]: await insert_case(client, case) for case in CASES}
        keys = read_keys(url)
        vectors = []
        for name, kind, queue, args, opts in CASES:
            vectors.append({
                "name": name,
                "kind": kind,
                "queue": queue,
                "args": json.dumps(args, ensure_ascii=False),
                "by_queue": bool(opts.get("by_queue", False)),
                "by_args": bool(opts.get("by_args", True)),
                "by_period": opts.get("by_period"),
                "awa_pg_args": json.dumps(stored[name], ensure_ascii=False),
                "awa_pg_key": keys[kind],
                "differs": DIFFERS.get(name),
            })
        facts = {**await states_fact(client, url), **await period_fact(client)}
        await client.close()
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    doc = {
        "generated_by": "bench/compat/unique_key_vectors.py",
        "awa_pg_version": md.version("awa-pg"),
        "facts": facts,
        "vectors": vectors,
    }
    pathlib.Path(ns.out).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(facts))


if __name__ == "__main__":
    asyncio.run(main())
