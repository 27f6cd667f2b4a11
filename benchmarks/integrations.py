"""Our Optuna sampler and nevergrad optimizer beside the libraries' own, in one run.

Optuna: BlackBoxSampler, TPESampler, CmaEsSampler (``pip install cmaes``) and RandomSampler
(Optuna's own cost) in turn, alone, a study of 1000 trials each per seed on BBOB f01 at D = 5
(``cocoex``: microseconds an evaluation): median ms per trial. Then the best error after 100,
300 and 1000 trials on those and BBOB f08, f10 and f15 (``suggest_float`` over [-5, 5], COCO's
f(x)), and after 30, 100 and 300 on an RBF SVC's C and gamma on breast cancer (3-fold CV error).
nevergrad: BlackBoxBFO, NGOpt, CMA, PSO and DE on its ArtificialFunction (translated, unbounded,
minimum 0): the best loss a run evaluated; a run that raises is recorded as failed. Medians over
seeds, below 1e-8 counted as 1e-8; all but the timed studies run in two processes.

    python benchmarks/integrations.py [--quick]
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import math
import multiprocessing
import os
import statistics
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import nevergrad as ng
import numpy as np
import optuna
from common import parse, table, write
from nevergrad.functions import ArtificialFunction
from optuna.distributions import FloatDistribution
from problems import make_bbob
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import StratifiedKFold
from sklearn.svm import SVC

import functional_bfo.adapters.nevergrad  # noqa: F401  registers "BlackBoxBFO"
from functional_bfo.adapters.optuna import BlackBoxSampler

FLOOR, DIM, SVC_NAME = 1e-8, 5, "SVC on breast cancer"
SAMPLERS = {"BlackBoxSampler": lambda space, n, seed: BlackBoxSampler(space, n_trials=n, seed=seed),
            **{x: lambda space, n, seed, x=x: getattr(optuna.samplers, x)(seed=seed)
               for x in ("TPESampler", "CmaEsSampler", "RandomSampler")}}
OPTIMIZERS = ["BlackBoxBFO", "NGOpt", "CMA", "PSO", "DE"]
VERSIONS = ["optuna", "cmaes", "nevergrad", "scikit-learn", "numpy", "coco-experiment"]
optuna.logging.set_verbosity(optuna.logging.WARNING)  # here: the worker processes too
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def problem(name: str, seed: int):
    """``(f of the params, their distributions, the optimum)``: BBOB ``name`` at D = 5 over
    its box, or an RBF SVC's C and gamma on breast cancer (standardized), 3-fold CV error."""
    if name != SVC_NAME:
        f, (low, high), optimum = make_bbob(name, DIM, seed, offset=True)
        return lambda p: f(np.array(list(p.values()))), {
            f"x{i}": FloatDistribution(low, high) for i in range(DIM)}, optimum
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    folds = list(StratifiedKFold(3, shuffle=True, random_state=0).split(x, y))
    return lambda p: float(np.mean([1 - SVC(**p).fit(x[a], y[a]).score(x[b], y[b])
                                    for a, b in folds])), {
        "C": FloatDistribution(1e-2, 1e3, log=True),
        "gamma": FloatDistribution(1e-5, 1.0, log=True)}, 0.0


def study(sampler: str, name: str, checkpoints: list[int], seed: int) -> tuple[list, float, float]:
    """The best error after each of ``checkpoints`` trials of one study, its wall and CPU s."""
    f, space, optimum = problem(name, seed)
    run = optuna.create_study(sampler=SAMPLERS[sampler](space, checkpoints[-1], seed))
    wall, cpu = time.perf_counter(), time.process_time()
    run.optimize(lambda t: f({k: t.suggest_float(k, d.low, d.high, log=d.log)
                              for k, d in space.items()}), n_trials=checkpoints[-1])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    best = np.minimum.accumulate([t.value - optimum for t in run.trials])
    return [max(float(best[k - 1]), FLOOR) for k in checkpoints], wall, cpu


def nevergrad_run(name: str, function: str, dim: int, budget: int, seed: int) -> float | str:
    """The best loss ``name`` evaluated (as ``peers.py`` counts; nevergrad's recommendation,
    for CMA its latest restart's best, can be worse), or why the run failed."""
    func = ArtificialFunction(function, block_dimension=dim)
    func.parametrization.random_state.seed(seed)  # draws the translation
    param = ng.p.Array(shape=(dim,))
    param.random_state.seed(seed)
    seen: list[float] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ng.optimizers.registry[name](param, budget=budget).minimize(
                lambda x: seen.append(func(x)) or seen[-1])
        return max(min(seen), FLOOR)
    except Exception as e:  # NGOpt's metamodel raises with some numpy/scikit-learn versions
        return f"{type(e).__name__}: {e}"


def summary(runs: dict, ours: str) -> tuple[list, str]:
    """Table rows of the medians of ``{row: {label: [values]}}`` (the least in bold; "failed"
    where a run failed), and in how many rows ``ours`` beats, ties and trails each label."""
    med = [{x: statistics.median(v) if all(isinstance(e, float) for e in v) else math.inf
            for x, v in by.items()} for by in runs.values()]
    rows = [[*row, *["failed" if m == math.inf else ("**{:.3g}**" if m == min(by.values())
                                                     else "{:.3g}").format(m) for m in by.values()]]
            for row, by in zip(runs, med)]
    return rows, "; ".join(f"against {x} {sum(by[ours] < by[x] for by in med)} / "
                           f"{sum(by[ours] == by[x] for by in med)} / "
                           f"{sum(by[ours] > by[x] for by in med)}" for x in med[0] if x != ours)


def main() -> None:
    args = parse(__doc__, cpu=True)
    seeds = [0] if args.quick else [0, 1, 2]
    at, svc_at = ([20, 40], [10, 20]) if args.quick else ([100, 300, 1000], [30, 100, 300])
    problems = {f: at for f in ["f01 sphere"] + ([] if args.quick else [
        "f08 rosenbrock", "f10 ellipsoid"]) + ["f15 rastrigin"]} | {SVC_NAME: svc_at}
    labels = [x for x in SAMPLERS if x != "CmaEsSampler" or importlib.util.find_spec("cmaes")]
    cases = [("sphere", 2, 50)] if args.quick else [
        (f, d, k * d) for f in ("sphere", "rastrigin", "cigar", "rosenbrock")
        for d, k in ((5, 100), (5, 1000), (20, 100))]
    started = time.perf_counter()
    got = {}  # the overhead first, alone: each sampler in turn, a seed a repeat
    for s, x in itertools.product(seeds, labels):
        got["f01 sphere", x, s] = study(x, "f01 sphere", at, s)
    with ThreadPoolExecutor(1) if args.quick else ProcessPoolExecutor(  # quick: no spawn cost
            2, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = {(name, x, s): pool.submit(study, x, name, n, s) for name, n in problems.items()
                for x in labels for s in seeds if (name, x, s) not in got}
        jobs |= {(case, x, s): pool.submit(nevergrad_run, x, *case, s) for case in cases
                 for x in OPTIMIZERS for s in seeds}
    got |= {key: job.result() for key, job in jobs.items()}
    runs = {name: {x: [got[name, x, s] for s in seeds] for x in labels} for name in problems}
    ms = {x: [statistics.median(1e3 * r[k] / at[-1] for r in runs["f01 sphere"][x])
              for k in (1, 2)] for x in labels}  # wall and CPU ms per trial
    optuna_rows, optuna_record = summary({
        (name, k): {x: [r[0][i] for r in by[x]] for x in labels}
        for name, by in runs.items() for i, k in enumerate(problems[name])}, labels[0])
    ng_runs = {case: {x: [got[case, x, s] for s in seeds] for x in OPTIMIZERS} for case in cases}
    ng_rows, ng_record = summary(ng_runs, OPTIMIZERS[0])
    installed = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()}
    failures = sorted({v for by in ng_runs.values() for r in by.values() for v in r
                       if isinstance(v, str)})
    result = {"versions": {p: installed.get(p) for p in VERSIONS}, "seeds": seeds,
              "ms_per_trial": ms, "target_met": ms["BlackBoxSampler"][0] < 2.0,
              "optuna": {f"{name}|{x}": r for name, by in runs.items() for x, r in by.items()},
              "nevergrad": {"|".join(map(str, case)): by for case, by in ng_runs.items()},
              "failures": failures, "seconds": time.perf_counter() - started,
              "cpu_seconds": sum(os.times()[:4])}  # this process's and the workers'
    md = [f"# Our Optuna sampler and nevergrad optimizer beside theirs "
          f"({'quick' if args.quick else 'full'} run)", "", ", ".join(
              f"{p} {v}" for p, v in result["versions"].items()) + f"; {result['seconds']:.0f} s "
          f"({result['cpu_seconds']:.0f} s of CPU).", "",
          f"Optuna: whole studies of {at[-1]} trials on BBOB f01 (D = {DIM}, microseconds an "
          f"evaluation), the samplers in turn, a repeat per seed ({len(seeds)}); median ms per "
          "trial, wall and CPU, and wall over RandomSampler's (Optuna's own cost):", ""]
    md += table("sampler | ms per trial | CPU ms per trial | over RandomSampler", [
        [x, f"{t:.2f}", f"{c:.2f}", f"{t - ms['RandomSampler'][0]:+.2f}"]
        for x, (t, c) in ms.items()])
    md += ["", f"Target: BlackBoxSampler under 2 ms per trial at {at[-1]} trials: "
           f"{ms['BlackBoxSampler'][0]:.2f} ms, {'met' if result['target_met'] else 'missed'}.",
           "", "Best error after so many trials (BBOB: f - f_opt; SVC: 3-fold CV error), median "
           f"over {len(seeds)} seeds, below 1e-8 counted as 1e-8; bold: the best of the row:", ""]
    md += table("problem | trials | " + " | ".join(labels), optuna_rows)
    md += ["", f"BlackBoxSampler's rows better / tied / worse: {optuna_record}.", "",
           "nevergrad: ArtificialFunction (translated, unbounded), the best loss a run evaluated "
           f"within the budget, median over {len(seeds)} seeds:", ""]
    md += table("function | D | budget | " + " | ".join(OPTIMIZERS), ng_rows)
    md += ["", f"BlackBoxBFO's rows better / tied / worse: {ng_record}. "
           f"Failed runs: {'; '.join(failures) or 'none'}."]
    write(args, "integrations", result, md)


if __name__ == "__main__":
    main()
