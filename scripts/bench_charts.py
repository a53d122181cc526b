#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draw the benchmark's charts (SVG) from a run's own figures.

Usage: bench_charts.py OUT_DIR [--results build/bench-results.json]
                               [--vllm build/bench/vllm.json]
Reads the JSON lines scripts/bench.sh (shmb-bench, shmb-queue-bench,
bench_python.py) and tests/bench/bench_vllm.py write, and writes into OUT_DIR:
  objects-throughput.svg  bytes/s against object size, one line per peer
                          (shmbroker put+read, put+get, Redis SET+GET, memcpy),
                          1 client and 16 clients
  python-throughput.svg   the same from Python (bench_python.py), objects/s
  queue-throughput.svg    broadcast messages/s against size, 1 and 4 readers
  queue-latency.svg       one-way latency at p50, p99 and p99.9 of each queue
  queue-cpu.svg           reader CPU per message, paced, and idle CPU
  vllm.svg                ours/vLLM per measure (median of the rounds' ratios,
                          the bar from the lowest to the highest round)
A chart whose figures the files lack is left out (and named on stderr).
Needs matplotlib (Debian's python3-matplotlib: scripts/install-deps.sh bench).
"""

import argparse
import collections
import json
import os
import sys

PEERS = [  # (label in the JSON, name on the chart)
    ("nowait", "shmbroker put_nowait+read"),
    ("new", "shmbroker put+read"),
    ("shmb", "shmbroker put+get"),
    ("redis", "Redis SET+GET"),
    ("memcpy", "memcpy"),
]


def load(path):
    rows = []
    if path and os.path.exists(path):
        # Lines that are not JSON objects (a table, bytes that are not UTF-8,
        # a line cut short) are not figures: skipped.
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(row, dict):
                        rows.append(row)
    return rows


def size_label(n):
    for unit, m in (("MiB", 1 << 20), ("KiB", 1024)):
        if n >= m and n % m == 0:
            return "%d %s" % (n // m, unit)
    return "%d B" % n


def objects_series(rows, clients):
    """peer -> {size: bytes/s} for one client count, from shmb-bench's lines."""
    out = collections.defaultdict(dict)
    for r in rows:
        if r.get("clients") != clients or "ops_per_s" not in r or r.get("mode") == "python":
            continue
        mode, label, size = r.get("mode"), r.get("label", ""), r.get("size")
        bps = r["ops_per_s"] * size
        if mode == "putread" and label.startswith("new-"):
            out["new"][size] = bps
        elif mode == "putread-nowait":
            out["nowait"][size] = bps
        elif mode == "putget" and not label.startswith("old-"):
            out["shmb"][size] = bps
        elif mode == "redis" and not label.startswith("new-"):
            out["redis"][size] = bps
        elif mode == "memcpy":
            out["memcpy"][size] = r["gb_per_s"] * 1e9
    return out


def log_size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(s) for s in sizes])
    ax.grid(True, which="major", alpha=0.3)


def chart_objects(plt, rows, out):
    series = {n: objects_series(rows, n) for n in (1, 16)}
    if not any(series.values()):
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, (n, s) in zip(axes, series.items()):
        sizes = set()
        for key, name in PEERS:
            pts = sorted(s.get(key, {}).items())
            if pts:
                sizes.update(p[0] for p in pts)
                ax.plot([p[0] for p in pts], [p[1] / 1e9 for p in pts], marker="o", label=name)
        if sizes:
            log_size_axis(ax, sorted(sizes))
        ax.set_yscale("log")
        ax.set_title("%d client%s" % (n, "s" if n > 1 else ""))
        ax.set_xlabel("object size")
    axes[0].set_ylabel("GB/s written and read (log)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Objects: bytes per second against size (higher is better)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "objects-throughput.svg"))
    return True


def chart_python(plt, rows, out):
    data = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        if r.get("mode") == "python":
            data[r["system"]][r["size"]].append(r["ops_per_s"])
    if not data:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = set()
    for system, by_size in sorted(data.items()):
        pts = sorted((s, sorted(v)[len(v) // 2]) for s, v in by_size.items())
        sizes.update(p[0] for p in pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
    log_size_axis(ax, sorted(sizes))
    ax.set_yscale("log")
    ax.set_xlabel("object size")
    ax.set_ylabel("objects/s, writer to reader (log)")
    ax.set_title("Python: objects per second against size (median of rounds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "python-throughput.svg"))
    return True


def queue_rows(rows, run, **match):
    for r in rows:
        if r.get("mode") == "queue" and r.get("run") == run and \
                all(r.get(k) == v for k, v in match.items()):
            yield r


def chart_queue_throughput(plt, rows, out):
    tput = list(queue_rows(rows, "throughput"))
    if not tput:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, n in zip(axes, (1, 4)):
        by_impl = collections.defaultdict(dict)
        for r in tput:
            if r["readers"] == n:
                by_impl[r["impl"]][r["size"]] = r["msgs_per_s"]
        sizes = set()
        for impl, pts in sorted(by_impl.items()):
            pts = sorted(pts.items())
            sizes.update(p[0] for p in pts)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        if sizes:
            log_size_axis(ax, sorted(sizes))
        ax.set_yscale("log")
        ax.set_title("%d reader%s" % (n, "s" if n > 1 else ""))
        ax.set_xlabel("message size")
    axes[0].set_ylabel("messages/s to every reader (log)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Broadcast queues: messages per second back to back (higher is better)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "queue-throughput.svg"))
    return True


def chart_queue_latency(plt, rows, out):
    paced = [r for r in queue_rows(rows, "latency") if r.get("period_us", 0) > 0
             and not r.get("spin_us")]
    if not paced:
        return False
    cells = [(64, 1), (4096, 1), (64, 4), (4096, 4)]
    fig, axes = plt.subplots(1, len(cells), figsize=(13, 4.2), sharey=True)
    qs = [50, 99, 99.9]
    for ax, (size, n) in zip(axes, cells):
        for r in paced:
            if r["size"] == size and r["readers"] == n:
                ax.plot(range(len(qs)), [r["p50_us"], r["p99_us"], r["p999_us"]], marker="o",
                        label=r["impl"])
        ax.set_xticks(range(len(qs)))
        ax.set_xticklabels(["p%g" % q for q in qs])
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.set_title("%s, %d reader%s" % (size_label(size), n, "s" if n > 1 else ""))
    axes[0].set_ylabel("one-way latency, us (log)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Broadcast queues: latency distribution, paced (lower is better)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "queue-latency.svg"))
    return True


def chart_queue_cpu(plt, rows, out):
    paced = [r for r in queue_rows(rows, "latency") if r.get("period_us", 0) > 0
             and not r.get("spin_us") and r.get("msgs")]
    idle = list(queue_rows(rows, "idle"))
    if not paced and not idle:
        return False
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    impls = sorted({r["impl"] for r in paced})
    cells = sorted({(r["readers"], r["size"]) for r in paced})
    width = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        ys = []
        for n, size in cells:
            m = [r for r in paced if r["impl"] == impl and r["readers"] == n and r["size"] == size]
            ys.append(m[0]["cpu_s_per_reader"] / m[0]["msgs"] * 1e6 if m else 0)
        ax.bar([c + i * width for c in range(len(cells))], ys, width, label=impl)
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cells))])
    ax.set_xticklabels(["%s x%d" % (size_label(s), n) for n, s in cells], rotation=30,
                       fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("reader CPU us per message (log)")
    ax.set_title("paced messages")
    ax.legend(fontsize=8)
    names = sorted({r["impl"] for r in idle})
    for i, n in enumerate((1, 4)):
        # An idle run sends nothing until its end: its "seconds" measure no
        # messages; the CPU is per reader over the whole wait.
        ys = [next((r["cpu_s_per_reader"] for r in idle
                    if r["impl"] == impl and r["readers"] == n and r.get("spin_us", 0) == 0), 0)
              for impl in names]
        ax2.bar([k + i * 0.4 for k in range(len(names))], ys, 0.4,
                label="%d reader%s" % (n, "s" if n > 1 else ""))
    ax2.set_xticks([k + 0.2 for k in range(len(names))])
    ax2.set_xticklabels(names)
    ax2.set_ylabel("CPU-seconds per reader over the idle run")
    ax2.set_title("idle, waiting for a message")
    ax2.legend(fontsize=8)
    fig.suptitle("Broadcast queues: reader CPU (lower is better)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "queue-cpu.svg"))
    return True


def chart_vllm(plt, rows, out):
    # Every measure but the first laps (a table of their own) and the
    # fallocate and memcpy references; a ratio of 0 (ours used no CPU) has no place on a
    # log scale and stays in the table.
    rows = [r for r in rows if r.get("mode") == "vllm" and r.get("ratio")
            and "first:" not in r["key"] and "fallocate" not in r["key"]
            and "memcpy_us" not in r["key"] and "timer_late_us" not in r["key"]]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.5))
    ys = range(len(rows))
    # Each bar says how many times better ours is: the ratio, or its inverse
    # where lower is better (latency, CPU, open time).
    better = [r["ratio"] if r["higher_is_better"] else 1 / r["ratio"] for r in rows]
    lo = [(r["lo"] if r["higher_is_better"] else 1 / r["hi"]) for r in rows]
    hi = [(r["hi"] if r["higher_is_better"] else 1 / r["lo"]) for r in rows]
    ax.barh(list(ys), better, color=["tab:green" if b >= 1 else "tab:red" for b in better])
    ax.errorbar(better, list(ys), xerr=[[b - l for b, l in zip(better, lo)],
                                        [h - b for b, h in zip(better, hi)]],
                fmt="none", ecolor="black", capsize=2)
    ax.axvline(1, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r["key"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("how many times better shmbroker is than vLLM's own (log; right of 1: better)")
    ax.set_title("shmbroker's drop-ins against vLLM's classes (median of rounds, bar = spread)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "vllm.svg"))
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--results")
    ap.add_argument("--vllm")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("svg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_charts: matplotlib is missing: install Debian's python3-matplotlib "
              "(sh scripts/install-deps.sh bench); no charts drawn.", file=sys.stderr)
        return 2
    matplotlib.rcParams["svg.hashsalt"] = "shmbroker"  # the same figures give the same file
    # Text stays text: smaller files, and a page can be searched.
    matplotlib.rcParams["svg.fonttype"] = "none"
    os.makedirs(args.out, exist_ok=True)
    rows = load(args.results)
    vrows = load(args.vllm)
    if not rows and not vrows:
        print("bench_charts: no figures in %s or %s: run make bench (or make bench-vllm) first."
              % (args.results, args.vllm), file=sys.stderr)
        return 1
    drawn = []
    for name, fn, src in (("objects-throughput", chart_objects, rows),
                          ("python-throughput", chart_python, rows),
                          ("queue-throughput", chart_queue_throughput, rows),
                          ("queue-latency", chart_queue_latency, rows),
                          ("queue-cpu", chart_queue_cpu, rows),
                          ("vllm", chart_vllm, vrows)):
        if not src:
            continue
        try:
            ok = fn(plt, src, args.out)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            # A row without a field its chart needs: that chart is left out.
            print("bench_charts: %s.svg not drawn: a figure it needs is missing or not a "
                  "number (%s: %s)" % (name, type(e).__name__, e), file=sys.stderr)
            ok = None
        if ok:
            drawn.append(os.path.join(args.out, name + ".svg"))
        elif ok is not None:
            print("bench_charts: no figures for %s.svg in this run" % name, file=sys.stderr)
        plt.close("all")
    for path in drawn:
        print("chart: %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
