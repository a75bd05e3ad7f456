"""Draw the benchmark chart: ``python plot.py results.json out.png`` (run with the bench-only
plotting virtualenv, which has matplotlib). Bars are medians, whiskers span min to max."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

COLOURS = {
    "awa": "#1f77b4",
    "awa-rust": "#17becf",
    "awa-pg": "#7f7f7f",
    "awa-pg-qs": "#bcbcbc",
    "pgqueuer": "#ff7f0e",
    "procrastinate": "#2ca02c",
    "floor": "#9467bd",
    "floor-64": "#c5b0d5",
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
    for x, m in zip(xs, meds):
        label = f"{m:,.0f}" if m >= 100 else f"{m:.2f}" if m < 10 else f"{m:.1f}"
        ax.annotate(label, (x, m), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        data = json.load(f)
    fig, axes = plt.subplots(2, 3, figsize=(14, 8))
    panel(axes[0][0], data, "drain.jobs_per_s", "Drain: no-op jobs, 32 workers (and the floor)", "jobs/s",
          extra="floor.jobs_per_s")
    panel(axes[0][1], data, "staging.jobs_per_s", "Drain: each job stages one follow-up", "jobs/s")
    panel(axes[0][2], data, "latency.p50_ms", "Idle pickup latency p50", "ms")
    panel(axes[1][0], data, "enqueue_single.jobs_per_s", "Single inserts (one commit each)", "jobs/s")
    panel(axes[1][1], data, "enqueue_bulk.jobs_per_s", "Bulk insert", "jobs/s")
    panel(axes[1][2], data, "drain.db.commits_per_job", "Commits per completed job (drain)", "commits/job", log=True)
    meta = data["meta"]
    fig.suptitle(
        f"Awa benchmark — {meta['machine']}; PostgreSQL {meta['postgres']['version']}; "
        f"{meta['rounds']} round(s); bars: median, whiskers: min–max",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main()
