"""Quality vs peers: final error at equal evaluation budgets (2000 x D), median over seeds.

Two suites: eight textbook functions (``problems.py``) and, with ``--suite bbob``, COCO's 24
noiseless BBOB functions (``cocoex``, instance seed + 1, box [-5, 5], evaluated row by row).
D in {2, 10, 30}, 5 seeds, our optimizers and every installed peer (``peers.py``). Our
bacterium 0 and CMA-ES's mean start uniform in the box (seeded); errors below 1e-8 count as
1e-8 (COCO's final precision). The optimizers see losses whose minimum is not 0, as a user's
are: COCO's own ``f(x)``, the eight functions plus a constant in [-1000, 1000]; ``--at-zero``
hands them ``f(x) - min f`` itself, reported apart as ``quality[_bbob]_at_zero``.

Each run appends a line to ``results/quality[_bbob]_runs.jsonl`` (local, not kept in git),
from which the tables are built, the last line per (optimizer, function, D, seed) winning.
Logged runs are skipped unless ``--rerun``: a run resumes, and ``--optimizers`` splits one
across processes (the BBOB suite: about 40 minutes in two on two cores).

    python benchmarks/quality.py [--suite bbob] [--at-zero] [--quick] [--optimizers NAME ...]
                                 [--rerun] [--report-only]
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from common import parse, table, write
from peers import PEERS, available, run_peer
from problems import BBOB_NAMES, BOXES, make, make_bbob, numpy_loss, row_by_row

import functional_bfo as fb

FLOOR = 1e-8
# Fractions of the budget at which the best-so-far error is recorded (the convergence curves).
FRACTIONS = [round(float(f), 4) for f in np.geomspace(0.002, 1.0, 16)]
BFO_PEERS = [name for name in PEERS if "BFO" in name]


OURS = {
    "fb.bfo": fb.bfo,
    "fb.adaptive_bfo": fb.adaptive_bfo,
    # The documented black-box setup (docs/variants.md; NOTES.md says how it was chosen).
    "fb.adaptive_bfo black-box": functools.partial(
        fb.adaptive_bfo, 8, relative_steps=True, swim_length=1, step_size_min=1e-12),
    "fb.black_box": None,  # the same setup with restarts: a driver, not an optimizer
}
DEFAULT_OURS = "fb.black_box"  # the setup the targets are judged on


def _curve(history: list[tuple[int, float]], budget: int, optimum: float) -> list[float]:
    """Best error (value minus ``optimum``) seen by each of FRACTIONS of the budget (inf
    before the first evaluation)."""
    out, best, i = [], math.inf, 0
    for fraction in FRACTIONS:
        while i < len(history) and history[i][0] <= fraction * budget:
            best = min(best, history[i][1])
            i += 1
        out.append(best - optimum)
    return out


class Problem(NamedTuple):
    """One function of a suite in both forms: ours take ``loss``, the peers ``f``."""

    loss: Callable  # {"x": tensor (dim,)} -> 0-d tensor, the function's value
    f: Callable  # float64 numpy vector -> float, the same value
    box: tuple[float, float]
    evaluator: fb.evaluate.Evaluator | None  # None: vmap
    optimum: float = 0.0  # the value at the minimum: errors are values minus it


def problem(suite: str, name: str, dim: int, seed: int, offset: bool = False) -> Problem:
    if suite == "bbob":
        f, box, optimum = make_bbob(name, dim, seed, offset)
        return Problem(numpy_loss(f), f, box, row_by_row(f), optimum)
    plain, box = make(name, dim, seed, rotate=True)
    # With offsets, a constant in [-1000, 1000] (two decimals, as COCO's f_opt) is added.
    optimum = float(np.round(np.random.default_rng([dim, seed, len(name)]).uniform(-1e3, 1e3),
                             2)) if offset else 0.0

    def loss(params):
        return plain(params) + optimum

    return Problem(loss, lambda x: float(loss({"x": torch.from_numpy(x)})), box, None, optimum)


def run_ours(label: str, task: Problem, dim: int, seed: int, budget: int, **settings) -> dict:
    """One run of our optimizer ``label``; ``settings`` go to ``fb.black_box`` (its
    defaults here; other settings are how a change to them is measured)."""
    loss, box = task.loss, task.box
    generator = torch.Generator().manual_seed(10_000 + seed)
    start = (torch.rand(dim, generator=generator, dtype=torch.float64) * 2 - 1) * box[1]
    started = time.perf_counter()
    if OURS[label] is None:
        out = fb.black_box(loss, {"x": start}, box, max_evals=budget, key=fb.random.key(seed),
                           evaluator=task.evaluator, **settings)
        return {"error": float(out.loss) - task.optimum, "evals": out.num_evals,
                "restarts": out.restarts, "explorer_updates": out.explorer_updates,
                "seconds": time.perf_counter() - started,
                "curve": _curve(out.history, budget, task.optimum)}
    if settings:
        raise ValueError(f"settings are fb.black_box's; {label} takes none")
    opt = OURS[label](bounds=box, evaluator=task.evaluator)
    state = opt.init({"x": start}, key=fb.random.key(seed))
    history, per_update = [], 0  # updates while the next one fits in the budget
    while (evals := int(state.num_evals)) + per_update <= budget:
        state = opt.update(state, loss)
        per_update = int(state.num_evals) - evals
        history.append((int(state.num_evals), float(state.best_loss)))
    return {"error": history[-1][1] - task.optimum, "evals": history[-1][0],
            "seconds": time.perf_counter() - started,
            "curve": _curve(history, budget, task.optimum)}


def run_other(label: str, task: Problem, dim: int, seed: int, budget: int) -> dict:
    out = run_peer(label, task.f, dim, *task.box, budget, None, seed)
    return {"error": out["best"] - task.optimum, "evals": out["evals"],
            "seconds": out["seconds"], "curve": _curve(out["history"], budget, task.optimum)}


def summarize(runs: list[dict], labels: list[str], names: list[str], dims: list[int],
              seeds: int, ours: tuple[str, ...] = tuple(OURS)) -> dict:
    """Median floored error per (optimizer, function, D), and the targets' verdicts."""
    latest = {(r["optimizer"], r["function"], r["dim"], r["seed"]): r for r in runs}
    cells, curves = {}, {}
    for name, dim in itertools.product(names, dims):
        cell = cells[f"{name}|{dim}"] = {}
        for label in labels:
            found = [latest.get((label, name, dim, s)) for s in range(seeds)]
            if any(r is None for r in found):
                continue
            errors = [max(r["error"], FLOOR) for r in found]
            cell[label] = {"median": statistics.median(errors), "errors": errors,
                           "seconds": sum(r["seconds"] for r in found)}
            curves[f"{label}|{name}|{dim}"] = [
                statistics.median(max(r["curve"][k], FLOOR) for r in found)
                for k in range(len(FRACTIONS))]
    verdict = {}
    for label in labels:
        d10 = [math.log10(cells[f"{n}|10"][label]["median"]) for n in names
               if label in cells.get(f"{n}|10", {})]
        verdict[label] = {"mean_log10_error_d10": statistics.mean(d10) if d10 else None}
        if label not in ours:
            continue
        # Per cell where ``label`` ran (named as the tables read it): its median, the best
        # BFO peer's, CMA-ES's.
        mine = {key.replace("|", " D="): cell for key, cell in cells.items() if label in cell}
        median = {key: cell[label]["median"] for key, cell in mine.items()}
        rivals = {key: min(cell[p]["median"] for p in BFO_PEERS if p in cell)
                  for key, cell in mine.items() if any(p in cell for p in BFO_PEERS)}
        cma = {key: cell["cma.CMAES"]["median"] for key, cell in mine.items()
               if "cma.CMAES" in cell}
        verdict[label].update(
            cells_beating_every_bfo_peer=sum(median[k] < best for k, best in rivals.items()),
            cells_with_bfo_peers=len(rivals),
            cells_where_cma_es_is_better=sum(c < median[k] for k, c in cma.items()),
            cells_over_2x_best_bfo_peer=[k for k, best in rivals.items() if median[k] > 2 * best],
            cells_beating_cma_es=[k for k, c in cma.items() if median[k] < c])
    return {"cells": cells, "curves": curves, "verdict": verdict}


def markdown(summary: dict, labels: list[str], names: list[str], dims: list[int], seeds: int,
             budget_factor: int, suite: str, offsets: bool = False) -> list[str]:
    what = ("COCO's 24 noiseless BBOB functions (`cocoex`, instance seed + 1, box [-5, 5])"
            + ("; the optimizers see COCO's values f(x), minimum f(x*) != 0, and the errors "
               "are f(x) - f(x*)" if offsets else "")
            if suite == "bbob" else
            "Shifted problems, rotated where a rotation is defined (`problems.py`)"
            + ("; the optimizers see f(x) + c, c in [-1000, 1000], and the errors are f(x) - "
               "min f" if offsets else ""))
    lines = [f"# Quality vs peers: median error over {seeds} seeds at {budget_factor} x D "
             "evaluations", "",
             f"{what}; errors below {FLOOR:g} count as {FLOOR:g}; bold is the best median of "
             "the row."]
    def row(cell: dict) -> list[str]:
        best = min((c["median"] for c in cell.values()), default=None)
        return [("**{:.3g}**" if cell[x]["median"] == best else "{:.3g}").format(
            cell[x]["median"]) if x in cell else "-" for x in labels]

    for dim in dims:
        lines += ["", f"D = {dim}:", ""] + table("function | " + " | ".join(labels), [
            [name, *row({x: c for x, c in summary["cells"][f"{name}|{dim}"].items()
                         if x in labels})] for name in names])
    lines += [""] + table("optimizer | cells beating every BFO peer's median | cells where "
                          "CMA-ES is better | mean log10 error, D = 10", [
        [label, f"{v['cells_beating_every_bfo_peer']} / {v['cells_with_bfo_peers']}"
         if v.get("cells_with_bfo_peers") else "-", v.get("cells_where_cma_es_is_better", "-"),
         "-" if v["mean_log10_error_d10"] is None else f"{v['mean_log10_error_d10']:.2f}"]
        for label, v in summary["verdict"].items()])
    v = summary["verdict"].get(DEFAULT_OURS, {})
    if v.get("cells_with_bfo_peers") and v["mean_log10_error_d10"] is not None:
        share = v["cells_beating_every_bfo_peer"] / v["cells_with_bfo_peers"]
        lines += ["", f"Targets for {DEFAULT_OURS}: beats every BFO peer's median in "
                  f">= 90% of cells: {share:.0%}, {'met' if share >= 0.9 else 'missed'}; "
                  f"never more than 2x the best BFO peer's median: "
                  f"{', '.join(v['cells_over_2x_best_bfo_peer']) or 'met'}; mean "
                  f"log10 error at D = 10 <= -1: {v['mean_log10_error_d10']:.2f}, "
                  f"{'met' if v['mean_log10_error_d10'] <= -1 else 'missed'}. "
                  f"Cells where it beats IPOP-CMA-ES's median: "
                  f"{', '.join(v['cells_beating_cma_es']) or 'none'}."]
    return lines


def read_runs(log) -> list[dict]:
    """The runs logged in ``log`` (a jsonl file), oldest first; none if it does not exist."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def main() -> None:
    args = parse(__doc__, ("--optimizers", {"nargs": "*", "choices": [*OURS, *PEERS],
                                                "help": "run only these (default: all)"}),
                     ("--rerun", {"action": "store_true", "help": "rerun logged runs"}),
                     ("--report-only", {"action": "store_true", "help": "rebuild the tables"}),
                     ("--suite", {"choices": ["eight", "bbob"], "default": "eight"}),
                     ("--at-zero", {"dest": "offsets", "action": "store_false", "help": "hand "
                                    "the optimizers f(x) - min f, minimum 0 (module docstring)"}),
                     cpu=True)
    torch.set_num_threads(1)
    seeds, per_dim = (2, 200) if args.quick else (5, 2000)  # per_dim: evaluations per dimension
    dims = [2, 5] if args.quick else [2, 10, 30]  # run and reported
    names = (list(BOXES) if args.suite == "eight" else BBOB_NAMES)[:2 if args.quick else None]
    labels = list(OURS) + available()
    todo = args.optimizers if args.optimizers is not None else labels
    result_name = "quality" + ("_bbob" if args.suite == "bbob" else "") + (
        "" if args.offsets else "_at_zero")
    log = args.out / f"{result_name}{'_quick' if args.quick else ''}_runs.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    done = set() if args.rerun else {(r["optimizer"], r["function"], r["dim"], r["seed"])
                                     for r in read_runs(log)}
    planned = [] if args.report_only else itertools.product(names, dims, todo, range(seeds))
    for name, dim, label, seed in planned:
        if (label, name, dim, seed) in done:
            continue
        runner = run_ours if label in OURS else run_other
        out = runner(label, problem(args.suite, name, dim, seed, args.offsets), dim, seed,
                     per_dim * dim)
        with log.open("a") as fh:
            fh.write(json.dumps({"optimizer": label, "function": name, "dim": dim,
                                 "seed": seed, **out}) + "\n")
        print(f"{label:22s} {name:16s} D={dim:<3d} seed={seed} "
              f"error={out['error']:.3g} ({out['seconds']:.1f} s)", flush=True)
    runs = read_runs(log)
    logged = {r["optimizer"] for r in runs}
    labels = list(OURS) + [name for name in PEERS if name in labels or name in logged]
    summary = summarize(runs, labels, names, dims, seeds)
    result = {"suite": args.suite, "offsets": args.offsets, "dims": dims, "seeds": seeds,
              "budget_per_dim": per_dim, "floor": FLOOR, "fractions": FRACTIONS, **summary}
    write(args, result_name, result, markdown(summary, labels, names, dims, seeds, per_dim,
                                              args.suite, args.offsets))


if __name__ == "__main__":
    main()
