"""COCO's bbob report: runs through cocoex's Observer, runtime ECDFs drawn by cocopp.

Every problem of COCO's noiseless ``bbob`` suite (24 functions x 15 instances) in D = 2, 3, 5,
10, 20 at 2000 x D evaluations, observed into a COCO data set, ``<out>/coco/<optimizer>``.
``fb.black_box`` starts from ``problem.initial_solution`` (the box's centre), is seeded from
(function, instance, D) and sees COCO's own ``f(x)``; a run stops at the final target
``f_opt + 1e-8``. ``--optimizers fb.black_box cma.CMAES`` adds IPOP-CMA-ES (``peers.py``).
``results/coco.{json,md}``: per optimizer and D, the share of (function, instance, target)
triples reached, COCO's 51 targets 10^[-8..2] on f - f_opt; cocopp's ECDFs per D beside its
best-2009 reference (a full run into ``benchmarks/results`` copies them to ``docs/figures``).
``--jobs`` processes (default: one per core) each run a function at a time (two on 2 cores:
12 minutes). ``--quick``: f1 and f5, D = 2, two instances, 200 x D evaluations. ``--functions
I ...``: those alone, with runs solved and their median evaluations (``results/coco_fI_...``).

    python benchmarks/coco.py [--quick] [--optimizers NAME ...] [--jobs N] [--functions I ...]
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pathlib
import shutil
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
from common import RESULTS, parse, table, write
from peers import run_peer
from problems import numpy_loss, row_by_row

import functional_bfo as fb

BUDGET_PER_DIM = 2000
TARGETS = np.logspace(2, -8, 51)  # COCO's standard targets on f - f_opt
FIGURES = pathlib.Path(__file__).parents[1] / "docs" / "figures"


class _TargetHit(Exception):
    """Raised by the evaluation that hits the final target, to end the run there."""


def run_black_box(problem, f: Callable, seed: int, budget: int) -> None:
    """``fb.black_box`` from the initial solution, one ``f`` call per row (all observed)."""
    x0 = torch.tensor(problem.initial_solution, dtype=torch.float64)
    box = (torch.tensor(problem.lower_bounds), torch.tensor(problem.upper_bounds))
    fb.black_box(numpy_loss(f), {"x": x0}, box, max_evals=budget, key=fb.random.key(seed),
                 evaluator=row_by_row(f))


RUNNERS = {"fb.black_box": run_black_box,  # and IPOP-CMA-ES as peers.py runs it:
           "cma.CMAES": lambda problem, f, seed, budget: run_peer(
               "cma.CMAES", f, problem.dimension, float(problem.lower_bounds[0]),
               float(problem.upper_bounds[0]), budget, None, seed)}


def experiment(name: str, selection: str, functions: list[int], folder: pathlib.Path,
               budget_per_dim: int, jobs: int) -> list[dict]:
    """``selection``'s problems of ``functions`` run by ``name`` in ``jobs`` processes, a function
    at a time, each observed apart, then moved into ``folder``: one COCO data set."""
    parts = folder.with_name(folder.name + ".parts")
    for old in (parts, folder):
        shutil.rmtree(old, ignore_errors=True)  # else cocoex writes to <folder>-0001
    spawn = multiprocessing.get_context("spawn")  # no forked torch threads
    with ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
        runs = pool.map(observed, [name] * len(functions),
                        [f"{selection} function_indices: {f}" for f in functions],
                        [parts / f"f{f}" for f in functions], [budget_per_dim] * len(functions))
        runs = [run for part in runs for run in part]
    folder.mkdir(parents=True)
    for part in sorted(parts.iterdir()):
        for item in part.iterdir():
            shutil.move(item, folder / item.name)
    shutil.rmtree(parts)
    return runs


def observed(name: str, selection: str, folder: pathlib.Path, per_dim: int) -> list[dict]:
    """Every problem of COCO's ``bbob`` ``selection`` run by ``name``, observed into ``folder``."""
    import cocoex

    torch.set_num_threads(1)
    cocoex.log_level("warning")
    observer = cocoex.Observer("bbob", f"outer_folder: {folder.parent} result_folder: "
                               f"{folder.name} algorithm_name: {name}")
    runs = []
    for problem in cocoex.Suite("bbob", "", selection):
        dim, function, instance = problem.dimension, problem.id_function, problem.id_instance
        optimum = cocoex.BareProblem("bbob", function, dim, instance).best_value()
        problem.observe_with(observer)

        def f(x: np.ndarray, problem=problem) -> float:  # ends the run at the final target
            y = float(problem(x))
            if problem.final_target_hit:
                raise _TargetHit
            return y

        started = time.perf_counter()
        with contextlib.suppress(_TargetHit):
            RUNNERS[name](problem, f, 10_000 * dim + 100 * function + instance, per_dim * dim)
        error = problem.best_observed_fvalue1 - optimum
        runs.append({"function": function, "dim": dim, "evals": problem.evaluations,
                     "seconds": time.perf_counter() - started,
                     "targets_hit": int((error <= TARGETS).sum())})
        print(f"{name} {problem.id} error={error:.3g} evals={problem.evaluations} "
              f"({runs[-1]['seconds']:.1f} s)", flush=True)
        problem.free()
    return runs


def share(runs: list[dict]) -> float:
    """The share of (function, instance, target) triples ``runs`` reached."""
    return sum(r["targets_hit"] for r in runs) / (len(TARGETS) * len(runs))


def summarize(runs: list[dict]) -> dict:
    by_function = {f: [r for r in runs if r["function"] == f] for f in sorted(
        {r["function"] for r in runs})}
    solved = {f: [r["evals"] for r in rs if r["targets_hit"] == len(TARGETS)]
              for f, rs in by_function.items()}
    return {"runs": len(runs), "reached": share(runs), "solved": sum(map(len, solved.values())),
            "evals": sum(r["evals"] for r in runs), "seconds": sum(r["seconds"] for r in runs),
            "reached_per_function": {f"f{f}": share(rs) for f, rs in by_function.items()},
            "solved_evals_per_function": {f"f{f}": [len(e), statistics.median(e) if e else None]
                                          for f, e in solved.items()}}


def ecdf_figures(folders: list[pathlib.Path], out: pathlib.Path, figures: pathlib.Path,
                 quick: bool) -> dict[int, pathlib.Path]:
    """cocopp's runtime ECDFs over all functions per D into ``out``, copied to ``figures``
    (``rungenericmany`` draws them for one optimizer too; ``cocopp.main`` needs two), PNG at
    300 dpi (--quick: 60, fewer bootstrap samples)."""
    socket.setdefaulttimeout(10)  # cocopp's import fetches its archive list with no timeout
    with warnings.catch_warnings():  # and warns when offline
        warnings.simplefilter("ignore")
        import cocopp

        settings = cocopp.genericsettings
        settings.figure_file_formats, settings.in_a_hurry = ["png"], 1000 if quick else 0
        settings.isRldOnSingleFcts = settings.isTab = settings.isFig = False
        shutil.rmtree(out, ignore_errors=True)
        cocopp.rungenericmany.main([str(folder) for folder in folders], str(out))
    figures.mkdir(parents=True, exist_ok=True)
    copied = {}
    for found in sorted(out.rglob("pprldmany_*D_noiselessall.png")):
        dim = int(found.name.split("_")[1].removesuffix("D"))
        copied[dim] = figures / f"coco_ecdf_{dim}D.png"
        shutil.copy(found, copied[dim])
    return copied


def markdown(summary: dict, links: dict[int, str], where: object, budget_per_dim: int,
             jobs: int, wall: dict[str, float]) -> list[str]:
    lines = ["# COCO bbob: share of (function, instance, target) triples reached", "",
             f"{budget_per_dim} x D evaluations per run, COCO's 51 targets 10^[-8..2] on "
             "f - f_opt, a run stopped at the final target (solved).", "",
             f"Wall time in {jobs} processes: " + ", ".join(
                 f"{name} {seconds / 60:.0f} min" for name, seconds in wall.items())
             + "; the seconds column sums the runs' own.", ""]
    lines += table("optimizer | D | runs | targets reached | solved | seconds", [
        [name, dim, cell["runs"], f"{cell['reached']:.1%}", cell["solved"],
         f"{cell['seconds']:.0f}"] for name, by_dim in summary.items()
        for dim, cell in by_dim.items()])
    return lines + ["", f"Runtime ECDFs over all functions, drawn by cocopp, in {where}: "
                    + ", ".join(f"`{link}`" for link in links.values()) + "."]


def main() -> None:
    args = parse(__doc__, ("--optimizers", {
        "nargs": "*", "default": ["fb.black_box"], "choices": list(RUNNERS)}), ("--jobs", {
        "type": int, "default": os.cpu_count() or 1, "help": "processes (default: every core)"}),
        ("--functions", {"nargs": "*", "type": int, "help": "only these (module docstring)"}),
        cpu=True)
    dims, budget_per_dim = ([2], 200) if args.quick else ([2, 3, 5, 10, 20], BUDGET_PER_DIM)
    selection = f"dimensions: {','.join(map(str, dims))} instance_indices: " + (
        "1-2" if args.quick else "1-15")
    # The multimodal functions first: they seldom stop at the final target, so take longest.
    functions = [1, 5] if args.quick else args.functions or list(range(24, 0, -1))
    summary, folders, wall = {}, [], {}
    for name in args.optimizers:
        folders.append(args.out / "coco" / name)
        started = time.perf_counter()
        runs = experiment(name, selection, functions, folders[-1], budget_per_dim, args.jobs)
        wall[name] = time.perf_counter() - started
        summary[name] = {dim: summarize([r for r in runs if r["dim"] == dim]) for dim in dims}
    to_docs = not (args.quick or args.functions) and args.out.resolve() == RESULTS.resolve()
    where = FIGURES if to_docs else args.out / "coco"
    links = {dim: f"figures/{path.name}" if to_docs else str(path) for dim, path in ecdf_figures(
        folders, args.out / "coco" / "ppdata", where, args.quick).items()}
    result = {"jobs": args.jobs, "wall_seconds": wall, "budget_per_dim": budget_per_dim,
              "selection": f"{selection} function_indices: {','.join(map(str, functions))}",
              "targets": len(TARGETS), "summary": summary, "figures": links}
    lines = markdown(summary, links, "docs/figures" if to_docs else where, budget_per_dim,
                     args.jobs, wall)
    if args.functions:
        lines += ["", *table("optimizer | D | function | solved | median evaluations of those", [
            [name, dim, f, *cell] for name, by_dim in summary.items() for dim, by in by_dim.items()
            for f, cell in by["solved_evals_per_function"].items()])]
    write(args, "_".join(["coco", *(f"f{f}" for f in args.functions or [])]), result, lines)


if __name__ == "__main__":
    main()
