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
from quality import BFO_PEERS, DEFAULT_OURS, floored, problem  # noqa: E402

import functional_bfo as fb  # noqa: E402

LOGS = {"bbob": "quality_bbob_runs.jsonl", "eight": "quality_runs.jsonl",
        "bbob-offsets": "quality_bbob_offsets_runs.jsonl"}  # quality.py --suite bbob --offsets
CMA = "cma.CMAES"


def run(job: tuple[str, str, int, int, dict]) -> float:
    """The error of one fb.black_box run, set up as benchmarks/quality.py sets it up."""
    suite, name, dim, seed, settings = job
    torch.set_num_threads(1)
    task = problem(suite.removesuffix("-offsets"), name, dim, seed, suite.endswith("-offsets"))
    generator = torch.Generator().manual_seed(10_000 + seed)
    start = (torch.rand(dim, generator=generator, dtype=torch.float64) * 2 - 1) * task.box[1]
    out = fb.black_box(task.loss, {"x": start}, task.box, max_evals=2000 * dim,
                       key=fb.random.key(seed), evaluator=task.evaluator, **settings)
    return float(out.loss) - task.optimum


def recorded(suite: str, seeds: int) -> dict:
    """Median floored error per (optimizer, function, D) over the recorded runs' seeds."""
    path = ROOT / "benchmarks" / "results" / LOGS[suite]
    latest = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["seed"] < seeds:
            latest[(r["optimizer"], r["function"], r["dim"], r["seed"])] = r["error"]
    cells: dict = {}
    for (label, name, dim, _), error in latest.items():
        cells.setdefault((label, name, dim), []).append(floored(error))
    return {cell: statistics.median(errors) for cell, errors in cells.items()}


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
            medians = recorded(suite, a.seeds)
            jobs = [(suite, n, d, s, settings) for settings in variants.values()
                    for n in names for d in a.dims for s in range(a.seeds)]
            errors = iter(pool.map(run, jobs, chunksize=1))
            mine = {(label, n, d): statistics.median(floored(next(errors))
                                                     for _ in range(a.seeds))
                    for label in variants for n in names for d in a.dims}
            for d in a.dims:
                lines += [f"{suite}, D = {d} (median of {a.seeds} seeds; ! = not beating "
                          "every BFO peer):", "",
                          "| function | best BFO peer | CMA-ES | default | "
                          + " | ".join(variants) + " |",
                          "|---" * (4 + len(variants)) + "|"]
                totals = {label: [0, [], 0, []] for label in variants}
                for n in names:
                    peer = min(medians[(q, n, d)] for q in BFO_PEERS if (q, n, d) in medians)
                    cma = medians.get((CMA, n, d), math.nan)
                    row = [n, f"{peer:.3g}", f"{cma:.3g}",
                           f"{medians.get((DEFAULT_OURS, n, d), math.nan):.3g}"]
                    for label in variants:
                        m = mine[(label, n, d)]
                        t = totals[label]
                        t[0] += m < peer
                        t[1].append(math.log10(m))
                        t[2] += m < cma
                        if m > 2 * peer:
                            t[3].append(n.split()[0])
                        row.append(f"{m:.3g}" + ("" if m < peer else "!"))
                    lines.append("| " + " | ".join(row) + " |")
                lines.append("")
                for label, (wins, logs, cma_wins, behind) in totals.items():
                    lines.append(f"- {label}: beats every BFO peer in {wins}/{len(names)}, "
                                 f"mean log10 {statistics.mean(logs):.3f}, beats CMA-ES in "
                                 f"{cma_wins}, more than 2x behind the best peer: "
                                 f"{', '.join(behind) or 'none'}")
                lines.append("")
                print("\n".join(lines[printed:]), flush=True)
                printed = len(lines)
    if a.out:
        a.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
