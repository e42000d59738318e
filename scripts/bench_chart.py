#!/usr/bin/env python3
"""The benchmark's chart: each read rate of scripts/bench.sh beside the ceiling it is measured against.

    python scripts/bench_chart.py ROWS.tsv OUT.png TITLE

ROWS.tsv holds one measurement per line: label, GB/s, the ceiling's label, the ceiling's GB/s (tab-separated),
as bench.sh writes them. Horizontal bars, measured over ceiling, with the ratio at the end of each pair.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    rows_path, out, title = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    with rows_path.open(newline="") as f:
        rows = [(label, float(rate), ceiling_label, float(ceiling))
                for label, rate, ceiling_label, ceiling in csv.reader(f, delimiter="\t")]
    if not rows:
        print(f"{rows_path}: no measurements", file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(10, 0.75 * len(rows) + 1.5))
    height = 0.38
    top = max(max(rate, ceiling) for _, rate, _, ceiling in rows)
    for i, (label, rate, ceiling_label, ceiling) in enumerate(rows):
        y = len(rows) - 1 - i
        ax.barh(y + height / 2, rate, height, color="tab:blue", label="reshardfs" if i == 0 else None)
        ax.barh(y - height / 2, ceiling, height, color="tab:gray", alpha=0.5, label="ceiling" if i == 0 else None)
        ax.text(rate, y + height / 2, f" {rate:.2f}", va="center", fontsize=8)
        ax.text(ceiling, y - height / 2, f" {ceiling:.2f} ({ceiling_label})", va="center", fontsize=8, color="dimgray")
        ax.text(top * 1.55, y, f"{rate / ceiling:.2f}x", va="center", ha="right", fontsize=9, weight="bold")
    ax.set_yticks(range(len(rows)), [label for label, *_ in reversed(rows)], fontsize=9)
    ax.set_xlim(0, top * 1.6)
    ax.set_xlabel("GB/s (1 GB = 1e9 B)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"bench: chart written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
