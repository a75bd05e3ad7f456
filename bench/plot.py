"""Draw the benchmark chart: ``python plot.py results.json out.png`` (run with the bench-only
plotting virtualenv, which has matplotlib). Bars are medians, whiskers span min to max."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

COLOURS = {
    "awa": "#1f77b4",
    "awa-rust": "#17becf",
    "awa-pg": "#7f7f7f",
    "awa-pg-qs": "#bcbcbc",
    "pgqueuer": "#ff7f0e",
    "procrastinate": "#2ca02c",
    "floor": "#9467bd",
}


def panel(ax, data, key, title, unit, log=False, extra=None):
    per = dict(data["summary"].get(key, {}))
    if extra:
        per.update(data["summary"].get(extra, {}))
    systems = [s for s in data["systems"] if s in per]
    if not systems:
        ax.set_visible(False)
        return
    meds = [per[s]["median"] for s in systems]
    lo = [per[s]["median"] - per[s]["min"] for s in systems]
    hi = [per[s]["max"] - per[s]["median"] for s in systems]
    xs = range(len(systems))
    ax.bar(xs, meds, yerr=[lo, hi], capsize=3, color=[COLOURS.get(s, "#333333") for s in systems])
    ax.set_xticks(list(xs))
    ax.set_xticklabels(systems, rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(unit, fontsize=8)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        # Label the minor ticks only when the bars span less than a decade (else they pile up).
        spans_decade = min(meds) > 0 and max(meds) / min(meds) > 10
        ax.yaxis.set_minor_formatter(
            matplotlib.ticker.NullFormatter() if spans_decade else matplotlib.ticker.FormatStrFormatter("%g"))
    for x, m in zip(xs, meds):
        label = f"{m:,.0f}" if m >= 100 else f"{m:.2f}" if m < 10 else f"{m:.1f}"
        ax.annotate(label, (x, m), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        data = json.load(f)
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    panel(axes[0][0], data, "drain.jobs_per_s", "Drain: no-op jobs, 32 workers (and the floor)", "jobs/s",
          extra="floor.jobs_per_s")
    panel(axes[0][1], data, "staging.jobs_per_s", "Drain: each job stages one follow-up", "jobs/s")
    panel(axes[0][2], data, "latency.p50_ms", "Idle pickup latency p50", "ms")
    panel(axes[1][0], data, "enqueue_single.jobs_per_s", "Single inserts (one commit each)", "jobs/s")
    panel(axes[1][1], data, "enqueue_bulk_count.jobs_per_s", "Bulk insert returning a count (COPY)", "jobs/s")
    panel(axes[1][2], data, "enqueue_bulk_jobs.jobs_per_s", "Bulk insert returning the jobs (or ids)", "jobs/s")
    panel(axes[0][3], data, "drain.db.commits_per_job", "Commits per completed job (drain)", "commits/job", log=True)
    panel(axes[1][3], data, "staging.db.commits_per_job", "Commits per job (staging drain)", "commits/job", log=True)
    meta = data["meta"]
    git = meta.get("git", {})
    commit = (git.get("commit") or "unknown")[:12] + (" + uncommitted changes" if git.get("dirty") else "")
    fig.suptitle(
        ("QUICK RUN (smoke sizes) — " if meta.get("quick") else "")
        + f"Awa benchmark, commit {commit}; {meta['rounds']} round(s); bars: median, whiskers: min–max\n"
        f"{meta['machine']}; PostgreSQL {meta['postgres']['version'].split()[0]}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main()
