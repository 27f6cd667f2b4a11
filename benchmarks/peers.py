"""Peer optimizers behind one interface, measured as our own runs are.

``run_peer`` hands every peer the same ``f`` through a counter that cuts the run off at exactly
``budget`` calls, records the best value *it* saw (not the one the library reports) and times
the whole run. Each peer is imported inside its runner: this module imports without any of
them. What ``population`` sets (``None``: the library's default):

* mealpy's ``OriginalBFO`` / ``ABFO``: ``pop_size`` (ABFO rebalances to it each epoch).
  mealpy 3.0.3 validates OriginalBFO's step ``Ci`` as an int, so its default 0.01 becomes 0:
  chemotaxis never moves a bacterium, only elimination-dispersal (random restarts) searches.
* ``niapy.BFO`` and ``pymetaheuristic.BFO``: ``population_size`` (niapy's reproduction keeps
  ``population // 2`` copies: use an even one).
* ``cma.CMAES``: ``popsize`` (default ``4 + 3 ln D``). IPOP-CMA-ES (Auger & Hansen 2005): when
  cma's own criteria stop it, it restarts at a uniform random point with sigma0 = 0.3 *
  (high - low) and twice the population, until the budget is spent.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import random
import time
import warnings
from collections.abc import Callable

import numpy as np

Objective = Callable[[np.ndarray], float]


class _BudgetSpent(Exception):
    """Raised by the counter on the call after the last one the budget allows."""


class _Counter:
    """Wraps ``f``: counts calls, tracks the best value and stops the peer at the budget."""

    def __init__(self, f: Objective, budget: int):
        self.f, self.budget, self.evals, self.best = f, budget, 0, math.inf
        self.history: list[tuple[int, float]] = []

    def __call__(self, x) -> float:
        if self.evals >= self.budget:
            raise _BudgetSpent
        self.evals += 1
        y = float(self.f(np.asarray(x, dtype=np.float64)))
        if y < self.best:
            self.best = y
            self.history.append((self.evals, y))
        return y


def _mealpy(cls_name: str) -> Callable:
    def run(f: _Counter, dim: int, low: float, high: float, population: int | None,
            seed: int) -> None:
        from mealpy import FloatVar
        from mealpy.swarm_based import BFO

        population = population or 100  # mealpy's default pop_size
        # Epochs only stop the run (neither variant reads them in its update). Each evaluates at
        # least `population` points, so budget / population of them (capped at mealpy's limit,
        # 100000) outlast the budget: the counter ends the run at exactly `budget` evaluations.
        epochs = min(100_000, -(-f.budget // population))
        model = getattr(BFO, cls_name)(epoch=epochs, pop_size=population)
        problem = {"bounds": FloatVar(lb=(low,) * dim, ub=(high,) * dim), "obj_func": f,
                   "minmax": "min", "log_to": None}
        model.solve(problem, seed=seed)

    return run


def _niapy(f: _Counter, dim: int, low: float, high: float, population: int | None,
           seed: int) -> None:
    from niapy.algorithms.basic import BacterialForagingOptimization
    from niapy.problems import Problem
    from niapy.task import Task

    class Wrapped(Problem):
        def _evaluate(self, x):
            return f(x)

    task = Task(Wrapped(dim, low, high), max_evals=f.budget)  # niapy honours max_evals itself
    BacterialForagingOptimization(population_size=population or 50, seed=seed).run(task)


def _pymetaheuristic(f: _Counter, dim: int, low: float, high: float, population: int | None,
                     seed: int) -> None:
    import pymetaheuristic

    # max_evaluations is a strict cap in pymetaheuristic (it stops before calling f).
    pymetaheuristic.optimize("bfo", f, [low] * dim, [high] * dim, max_evaluations=f.budget,
                             seed=seed, store_history=False, population_size=population or 50)


def _cma(f: _Counter, dim: int, low: float, high: float, population: int | None, seed: int) -> None:
    import cma

    # cma samples from numpy's global RNG, which run_peer has seeded; seed=nan tells cma not to
    # reseed it (cma reads seed 0 as "seed from the clock"). verbose=-9 also stops its log files.
    popsize = population or 4 + int(3 * math.log(dim))
    while f.evals < f.budget:  # IPOP: restart with twice the population; the counter ends it
        x0 = np.random.uniform(low, high, dim)
        es = cma.CMAEvolutionStrategy(x0, 0.3 * (high - low), {
            "popsize": popsize, "bounds": [low, high], "seed": math.nan, "verbose": -9,
            "maxfevals": f.budget - f.evals})
        while not es.stop():
            xs = es.ask()
            es.tell(xs, [f(x) for x in xs])
        popsize *= 2


PEERS: dict[str, Callable] = {"mealpy.OriginalBFO": _mealpy("OriginalBFO"),
                               "mealpy.ABFO": _mealpy("ABFO"), "niapy.BFO": _niapy,
                               "pymetaheuristic.BFO": _pymetaheuristic, "cma.CMAES": _cma}


def evox_pso(population: int, dim: int, shift, device: str):
    """EvoX's PSO (``pip install evox``) on a Rastrigin shifted by ``shift``, box +-5.12."""
    import torch
    from evox.algorithms import PSO
    from evox.core import Problem
    from evox.workflows import StdWorkflow
    from problems import rastrigin

    class Rastrigin(Problem):
        def evaluate(self, pop):
            return rastrigin(pop - shift)

    box = torch.full((dim,), 5.12, device=device)
    algorithm = PSO(population, -box, box, device=device)
    workflow = StdWorkflow(algorithm, Rastrigin(), device=device)
    workflow.init_step()
    return algorithm, workflow


def available() -> list[str]:
    """Names of the peers whose package imports here."""
    names = []
    for name in PEERS:
        with contextlib.suppress(Exception):  # any import failure: the peer is unavailable
            importlib.import_module(name.split(".")[0])
            names.append(name)
    return names


def run_peer(name: str, f: Objective, dim: int, low: float, high: float, budget: int,
             population: int | None, seed: int) -> dict:
    """Minimize ``f`` over ``[low, high]**dim`` with peer ``name`` in at most ``budget`` calls:
    the ``best`` value the counter saw, ``evals``, ``seconds`` (wall time of the whole run) and
    ``history``, ``(evals, best)`` at every improvement."""
    counter = _Counter(f, budget)
    np.random.seed(seed)
    random.seed(seed)
    start = time.perf_counter()
    with (contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()),
          warnings.catch_warnings(), contextlib.suppress(_BudgetSpent)):
        warnings.simplefilter("ignore")
        PEERS[name](counter, dim, low, high, population, seed)
    return {"best": counter.best, "evals": counter.evals,
            "seconds": time.perf_counter() - start, "history": counter.history}
