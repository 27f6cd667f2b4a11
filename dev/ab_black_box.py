"""fb.black_box with other settings, on the quality suites, against the recorded runs.

Runs ``fb.black_box(..., **settings)`` for each variant exactly as ``benchmarks/quality.py``
runs the default (same problems, start points, keys and budget), and prints per cell the
median error of each variant beside the best BFO peer's, IPOP-CMA-ES's and the default's
medians read from ``benchmarks/results/quality*_runs.jsonl``; then per variant the targets'
numbers: cells beating every BFO peer, cells more than 2x behind the best one, cells beating
CMA-ES, and the mean log10 error. Settings are keyword arguments of ``fb.black_box`` as JSON.
``bbob-offsets`` hands over COCO's own values (``quality.py --offsets``; recorded at D = 10).

    python dev/ab_black_box.py --suites bbob eight --dims 10 --jobs 2 \\
        --variant 'floor={"step_size_min": 0.1}' --out dev/results/ab_floor.md
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from problems import BBOB_NAMES, BOXES  # noqa: E402
from quality import (  # noqa: E402
    BFO_PEERS,
    DEFAULT_OURS,
    problem,
    read_runs,
    run_ours,
    summarize,
)

LOGS = {"bbob": "quality_bbob_runs.jsonl", "eight": "quality_runs.jsonl",
        "bbob-offsets": "quality_bbob_offsets_runs.jsonl"}  # quality.py --suite bbob --offsets
CMA = "cma.CMAES"


def run(job: tuple[str, str, str, int, int, dict]) -> dict:
    """One fb.black_box run with ``settings``, logged as benchmarks/quality.py logs runs."""
    suite, label, name, dim, seed, settings = job
    torch.set_num_threads(1)
    task = problem(suite.removesuffix("-offsets"), name, dim, seed, suite.endswith("-offsets"))
    out = run_ours(DEFAULT_OURS, task, dim, seed, 2000 * dim, **settings)
    return {"optimizer": label, "function": name, "dim": dim, "seed": seed, **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suites", nargs="+", default=["bbob", "eight"], choices=list(LOGS))
    p.add_argument("--dims", nargs="+", type=int, default=[10])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--functions", nargs="*", help="prefixes of the function names to run")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--variant", nargs="+", required=True,
                   help='label=JSON settings, e.g. jitter=\'{"jitter": 0.03}\'')
    p.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    a = p.parse_args()
    variants = {label: json.loads(text) for label, text in
                (v.split("=", 1) for v in a.variant)}
    lines = [f"`python dev/ab_black_box.py {shlex.join(sys.argv[1:])}`", ""]
    printed = 0
    with multiprocessing.Pool(a.jobs) as pool:
        for suite in a.suites:
            names = list(BOXES) if suite == "eight" else BBOB_NAMES
            names = [n for n in names if not a.functions
                     or any(n.startswith(f) for f in a.functions)]
            jobs = [(suite, label, n, d, s, settings) for label, settings in variants.items()
                    for n in names for d in a.dims for s in range(a.seeds)]
            runs = read_runs(ROOT / "benchmarks" / "results" / LOGS[suite])
            runs += pool.map(run, jobs, chunksize=1)
            labels = [*BFO_PEERS, CMA, DEFAULT_OURS, *variants]
            for d in a.dims:
                summary = summarize(runs, labels, names, [d], a.seeds, ours=tuple(variants))
                lines += [f"{suite}, D = {d} (median of {a.seeds} seeds; ! = not beating "
                          "every BFO peer):", "",
                          "| function | best BFO peer | CMA-ES | default | "
                          + " | ".join(variants) + " |",
                          "|---" * (4 + len(variants)) + "|"]
                for n in names:
                    cell = {label: v["median"] for label, v in
                            summary["cells"][f"{n}|{d}"].items()}
                    peer = min(cell[q] for q in BFO_PEERS if q in cell)
                    row = [n, f"{peer:.3g}", f"{cell.get(CMA, math.nan):.3g}",
                           f"{cell.get(DEFAULT_OURS, math.nan):.3g}"]
                    row += [f"{cell[label]:.3g}" + ("" if cell[label] < peer else "!")
                            for label in variants]
                    lines.append("| " + " | ".join(row) + " |")
                lines.append("")
                for label in variants:
                    v = summary["verdict"][label]
                    logs = [math.log10(summary["cells"][f"{n}|{d}"][label]["median"])
                            for n in names]
                    lines.append(f"- {label}: beats every BFO peer in "
                                 f"{v['cells_beating_every_bfo_peer']}/"
                                 f"{v['cells_with_bfo_peers']}, mean log10 "
                                 f"{statistics.mean(logs):.3f}, beats CMA-ES in "
                                 f"{len(v['cells_beating_cma_es'])}, more than 2x behind the "
                                 "best peer: "
                                 f"{', '.join(v['cells_over_2x_best_bfo_peer']) or 'none'}")
                lines.append("")
                print("\n".join(lines[printed:]), flush=True)
                printed = len(lines)
    if a.out:
        a.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
