#!/usr/bin/env python3
"""Runs trellis-bench several times and prints each figure's median ratio and its spread.

    scripts/bench_runs.py [--runs N] [--bench PATH] [-- BENCH-ARGS...]

One run of trellis-bench measures each figure once against a baseline measured once in the same
run, and both move by 10-25 % between runs on a shared two-core machine (docs/BENCHMARKS.md).
This runs it N times (default 5) with `--json` and, for every figure that has a baseline, prints
the median of its N ratios with the lowest and highest, and how many runs met its goal when the
figure has one below. Figures without a baseline print their median value. Only loopback traffic:
the bench itself never leaves the machine.
"""

import json
import statistics
import subprocess
import sys

# Goals of the speed issue (issue 11): figure -> (comparison, bound) on its ratio.
GOALS = {
    "local_upserts_batched_per_s": (">=", 0.5),
    "local_upserts_single_per_s": (">=", 0.2),
    "remote_merges_per_s": (">=", 0.5),
    "find_indexed_equality_per_s": (">=", 0.5),
    "stored_bytes_per_doc": ("<=", 1.3),
    "contacts_content_enum_per_s": (">=", 0.5),
    "two_node_replication_per_s": (">=", 0.4),
    "import_per_s": (">=", 0.5),
    "import_peak_rss_bytes_4x": ("<=", 1.1),
    "link_bulk_vs_aead_mb_per_s": (">=", 0.8),
}


def main(argv):
    runs, bench, extra = 5, ".build/release/trellis-bench", []
    i = 0
    while i < len(argv):
        if argv[i] == "--runs":
            runs = int(argv[i + 1])
            i += 2
        elif argv[i] == "--bench":
            bench = argv[i + 1]
            i += 2
        elif argv[i] == "--":
            extra = argv[i + 1:]
            break
        else:
            sys.exit(f"bench_runs.py: unknown argument {argv[i]!r} (usage: --runs N --bench PATH -- ARGS)")
    figures = {}
    order = []
    for run in range(runs):
        out = subprocess.run([bench, "--json", *extra], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            figure = json.loads(line)
            name = figure["name"]
            if name not in figures:
                figures[name] = []
                order.append(name)
            figures[name].append(figure)
        print(f"run {run + 1} of {runs} done", file=sys.stderr)
    print(f"{'figure':48} {'median':>14} {'ratio median':>12} {'ratios min-max':>16} {'goal':>8} {'met':>6}")
    for name in order:
        values = [f["value"] for f in figures[name]]
        ratios = [f["ratio"] for f in figures[name] if "ratio" in f]
        line = f"{name:48} {statistics.median(values):14.3f}"
        if ratios:
            line += f" {statistics.median(ratios):12.3f} {min(ratios):7.3f}-{max(ratios):<8.3f}"
            if name in GOALS:
                comparison, bound = GOALS[name]
                met = sum(1 for r in ratios if (r >= bound if comparison == ">=" else r <= bound))
                line += f" {comparison + str(bound):>8} {met:>3}/{len(ratios)}"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
