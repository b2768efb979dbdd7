"""Figures of the bench runs (matplotlib, Agg backend: no display needed), as PNG files.

    .venv/bin/python bench/plots.py history bench/results/mixed_stats_history.csv -o bench/results/mixed-latency.png
    .venv/bin/python bench/plots.py steps bench/results/soak-steps.json -o bench/results/soak-steps.png
    .venv/bin/python bench/plots.py soak bench/results/soak.csv -o bench/results/soak.png
    .venv/bin/python bench/plots.py bench-http /tmp/single.json -o bench/results/checks-http.png

* ``history``: latency percentiles over time (p50, p95, p99 of locust's last 10 s, ms, log
  scale) and requests/s, from locust's ``--csv`` history (``<prefix>_stats_history.csv``, its
  ``Aggregated`` rows, one a second). Run locust with ``--csv-full-history``: without it the
  history's percentiles are the whole run's so far, not the last 10 s.
* ``steps``: throughput against simulated users (closed loop: users are connections) with p50,
  p95 and p99 at each step, from ``bench/soak.py``'s ``soak-steps.json`` (``{"steps": [{"users",
  "rps", "p50_ms", "p95_ms", "p99_ms"}]}``), or ``--locust PREFIX,...`` step runs' CSVs.
* ``soak``: the soak over time from ``bench/soak.py``'s ``soak.csv``: the server's RSS (MiB),
  p50 and p99 (ms), requests/s, and the CPU in cores of the server, locust, PostgreSQL and the
  rest of the machine.
* ``bench-http``: throughput against connections and p50/p99 from ``bench/bench_http.py
  --json`` (its ``levels``).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import ticker

DPI = 90  # small PNGs: these are committed


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _save(fig: Any, out: Path) -> Path:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out


def history_figure(history_csv: Path, out: Path, title: str | None = None) -> Path:
    with open(history_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Name"] == "Aggregated"]
    rows = [r for r in rows if _num(r["Requests/s"]) > 0]
    if not rows:
        raise ValueError(f"{history_csv}: no Aggregated rows with requests")
    t0 = _num(rows[0]["Timestamp"])
    t = [_num(r["Timestamp"]) - t0 for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for col, style in (("50%", "-"), ("95%", "--"), ("99%", ":")):
        ax1.plot(t, [_num(r[col]) for r in rows], style, label=f"p{col[:-1]}")
    ax1.set_yscale("log")
    ax1.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax1.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax1.set_ylabel("latency, ms (last 10 s)")
    ax1.legend(loc="upper left")
    ax1.grid(True, which="both", alpha=0.3)
    ax2.plot(t, [_num(r["Requests/s"]) for r in rows], color="tab:green", label="requests/s")
    fails = [_num(r["Failures/s"]) for r in rows]
    if any(f > 0 for f in fails):
        ax2.plot(t, fails, color="tab:red", label="failures/s")
    ax2.set_ylabel("requests/s")
    ax2.set_xlabel("seconds")
    ax2.legend(loc="lower right")
    ax2.grid(True, alpha=0.3)
    fig.suptitle(title or f"{history_csv.name}: latency and throughput over time")
    return _save(fig, out)


def _steps_plot(steps: list[dict[str, Any]], out: Path, title: str, xlabel: str) -> Path:
    steps = sorted(steps, key=lambda s: s["users"])
    x = [s["users"] for s in steps]
    fig, ax1 = plt.subplots(figsize=(7, 4.5))
    ax1.plot(x, [s["rps"] for s in steps], "o-", color="tab:green", label="requests/s")
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(x, [str(v) for v in x])
    ax1.set_xlabel(xlabel)
    ax1.set_ylabel("requests/s", color="tab:green")
    ax1.set_ylim(bottom=0)
    ax1.grid(True, alpha=0.3)
    ax2 = ax1.twinx()
    for key, style in (("p50_ms", "s--"), ("p95_ms", "^--"), ("p99_ms", "v:")):
        if any(s.get(key) is not None for s in steps):
            ax2.plot(x, [_num(s.get(key)) for s in steps], style, label=key[:3])
    ax2.set_ylabel("latency, ms")
    ax2.set_ylim(bottom=0)
    lines = ax1.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax1.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    fig.suptitle(title)
    return _save(fig, out)


def steps_figure(steps_json: Path, out: Path, title: str | None = None) -> Path:
    doc = json.loads(steps_json.read_text())
    return _steps_plot(doc["steps"], out, title or "Mixed profile: throughput against users "
                       "(closed loop)", "simulated users (connections)")


def locust_steps(prefixes: list[str]) -> list[dict[str, Any]]:
    """One step per locust run (``--csv PREFIX``): users from its history, requests/s and the
    percentiles of its whole run from ``<prefix>_stats.csv``."""
    steps = []
    for prefix in prefixes:
        with open(f"{prefix}_stats.csv", newline="") as f:
            total = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
        with open(f"{prefix}_stats_history.csv", newline="") as f:
            users = max(int(_num(r["User Count"])) for r in csv.DictReader(f))
        steps.append({"users": users, "rps": _num(total["Requests/s"]),
                      "p50_ms": _num(total["50%"]), "p95_ms": _num(total["95%"]),
                      "p99_ms": _num(total["99%"])})
    return steps


def soak_figure(soak_csv: Path, out: Path, verdict: dict[str, Any] | None = None) -> Path:
    with open(soak_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    t = [_num(r["t_s"]) / 60 for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    ax = axes[0]
    ax.plot(t, [_num(r["rss_mib"]) for r in rows], color="tab:purple")
    ax.set_ylabel("server RSS, MiB")
    ax.set_ylim(bottom=0)
    if verdict:
        m = verdict["memory"]
        ax.axvline(_num(m["mark_s"]) / 60, color="grey", ls=":", lw=1)
        ax.set_title(f"memory {m['growth']:+.1%} from the {_num(m['mark_s']) / 60:.3g}-minute "
                     f"mark; failures {verdict['errors']['failures']}; p99 late/early "
                     f"{verdict['p99']['ratio']:.2f}", fontsize=9)
    ax = axes[1]
    ax.plot(t, [_num(r["p50_ms"]) for r in rows], label="p50")
    ax.plot(t, [_num(r["p99_ms"]) for r in rows], label="p99")
    ax.set_ylabel("latency, ms")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    ax = axes[2]
    ax.plot(t, [_num(r["rps"]) for r in rows], color="tab:green")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax = axes[3]
    for col, label in (("server_cores", "server"), ("locust_cores", "locust"),
                       ("postgres_cores", "PostgreSQL (bench db)"), ("other_cores", "other")):
        ax.plot(t, [_num(r[col]) for r in rows], label=label)
    ax.set_ylabel("CPU, cores")
    ax.set_xlabel("minutes")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8, ncol=4)
    for a in axes:
        a.grid(True, alpha=0.3)
    fig.suptitle("Soak: mixed profile at half capacity")
    return _save(fig, out)


def bench_http_figure(result_json: Path, out: Path) -> Path:
    doc = json.loads(result_json.read_text())
    steps = [{"users": lv["concurrency"], "rps": lv["requests_per_s"],
              "p50_ms": lv["latency_ms"].get("p50"), "p99_ms": lv["latency_ms"].get("p99")}
             for lv in doc["levels"]]
    return _steps_plot(steps, out, f"bench_http.py ({doc.get('mode', '')}): throughput "
                       "against connections", "connections")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("history", "steps", "soak", "bench-http"))
    ap.add_argument("source", nargs="?", type=Path, help="the input file")
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--locust", default=None, help="steps: locust --csv prefixes, comma-separated")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    if args.kind == "history":
        history_figure(args.source, args.out, args.title)
    elif args.kind == "steps" and args.locust:
        _steps_plot(locust_steps(args.locust.split(",")), args.out,
                    args.title or "throughput against users", "simulated users")
    elif args.kind == "steps":
        steps_figure(args.source, args.out, args.title)
    elif args.kind == "soak":
        soak_figure(args.source, args.out)
    else:
        bench_http_figure(args.source, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
