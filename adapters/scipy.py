"""The black box in scipy's calling convention: a function of a numpy vector in a box.

``minimize(fun, x0, bounds)`` returns scipy's ``OptimizeResult``; no torch in sight.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import math
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import Bounds, OptimizeResult

import functional_bfo as fb

BUDGET_PER_DIM = 2000  # maxfev's default per coordinate, as the benchmarks run it


def minimize(fun: Callable[..., float], x0: Any, bounds: Any, args: tuple = (), *,
             maxfev: int | None = None, seed: int | None = None,
             callback: Callable[[OptimizeResult], Any] | None = None,
             vectorized: bool = False, workers: int | Callable = 1,
             **settings: Any) -> OptimizeResult:
    """Minimize ``fun(x, *args)`` over the box ``bounds`` with :func:`functional_bfo.black_box`.

    Args:
        fun: ``fun(x, *args) -> float`` (or a one-element array) for ``x`` a float64 vector
            of shape ``(D,)``; with ``vectorized``, ``fun(X, *args)`` for ``X`` of shape
            ``(D, S)`` returns ``S`` values (scipy's ``differential_evolution`` convention).
            NaN or infinite values count as the worst.
        x0: the start, ``D`` numbers (or one number: ``D = 1``), the first swarm's bacterium 0.
        bounds: ``D`` pairs ``(low, high)`` or a ``scipy.optimize.Bounds`` (an infinite
            side, or None in a pair, is open).
        args: passed to every ``fun`` call.
        maxfev: the budget of evaluations (default ``2000 * D``).
        seed: an int (numpy's too) or a ``numpy.random.Generator`` to draw one from; the
            same seed gives the same run; None draws one.
        callback: ``callback(intermediate_result)`` after every round, an ``OptimizeResult``
            of the best so far (a callback with another signature gets the best ``x``, as
            scipy's ``minimize`` calls it); raising ``StopIteration`` ends the run (status 1).
        vectorized: ``fun`` takes a round's points at once.
        workers: an int of processes (-1: every core) evaluating a round's points in
            parallel (``fun`` must pickle), or a map-like callable, as
            ``differential_evolution`` takes it.
        **settings: :func:`functional_bfo.black_box`'s (``population_size``, ...).

    Returns:
        ``OptimizeResult`` with ``x``, ``fun``, ``nfev``, ``nit`` (rounds), ``success``,
        ``status`` (0: budget spent, 1: stopped by the callback, 2: no finite value) and
        ``message``.

    Raises:
        ValueError: bounds that are not ``D`` pairs, or a bad budget or setting.
        Exception: whatever ``fun`` raised, its type kept.

    Examples:
        >>> import numpy as np
        >>> from functional_bfo.adapters.scipy import minimize
        >>> res = minimize(lambda x: np.sum((x - 0.3) ** 2) + 7, np.zeros(3), [(-1, 1)] * 3,
        ...                maxfev=3000, seed=0)
        >>> bool(res.fun - 7 < 1e-8), res.nfev <= 3000, res.status
        (True, True, 0)
    """
    start = np.atleast_1d(np.asarray(x0, dtype=np.float64))  # a number: one coordinate
    if start.ndim != 1 or start.size == 0:
        raise ValueError(f"Invalid x0: shape {start.shape}; expected a vector of D numbers.")
    low, high = _box(bounds, start.size)
    budget = BUDGET_PER_DIM * start.size if maxfev is None else maxfev
    search = fb.black_box_search((torch.tensor(low), torch.tensor(high)),
                                 max_evals=budget, **settings)
    key = fb.random.key(_seed(seed))
    state = search.init({"x": torch.from_numpy(start.copy())}, key=key)
    evaluate = _Rows(fun, tuple(args), vectorized, workers)
    report = None if callback is None else _as_scipy_calls(callback)
    status = 0
    try:
        while state.phase != "done":
            asked = search.ask(state)  # type: ignore[misc]  # black_box_search has one
            rows, mask = asked.params["x"].numpy(), asked.mask.numpy()
            losses = np.full(len(rows), np.nan)
            losses[mask] = evaluate(rows[mask])
            state = search.tell(state, asked, losses)  # type: ignore[misc]
            if report is not None:
                try:
                    report(_result(state, 0, "a round"))
                except StopIteration:
                    status = 1
                    break
    finally:
        evaluate.close()
    if status == 0 and not math.isfinite(float(state.best_loss)):
        status = 2
    return _result(state, status, MESSAGES[status])


MESSAGES = {0: "The budget of evaluations (maxfev) was spent.",
            1: "The callback raised StopIteration.",
            2: "Every value of fun was NaN or infinite."}


def _as_scipy_calls(callback: Callable[..., Any]) -> Callable[[OptimizeResult], Any]:
    """As scipy calls it: ``callback(intermediate_result)`` gets the result, another the best x."""
    try:
        named = set(inspect.signature(callback).parameters) == {"intermediate_result"}
    except (TypeError, ValueError):  # no signature to read: the legacy form
        named = False
    if named:
        return lambda result: callback(intermediate_result=result)
    return lambda result: callback(np.copy(result.x))


def _box(bounds: Any, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``bounds`` as float64 ``(low, high)`` vectors of ``size``, or a clear error."""
    if bounds is None:
        raise ValueError("minimize needs bounds (D pairs (low, high) or a scipy.optimize."
                         "Bounds): the black box's steps and restarts are relative to the box.")
    if isinstance(bounds, Bounds):
        low, high = (np.broadcast_to(np.asarray(v, dtype=np.float64), (size,))
                     for v in (bounds.lb, bounds.ub))
    else:
        pairs = np.asarray(_open_sides(bounds), dtype=np.float64)
        if pairs.shape != (size, 2):
            raise ValueError(f"Invalid bounds: shape {pairs.shape}; expected {size} pairs "
                             "(low, high), one per coordinate of x0, or a scipy.optimize.Bounds.")
        low, high = pairs[:, 0], pairs[:, 1]
    return np.ascontiguousarray(low), np.ascontiguousarray(high)


def _open_sides(bounds: Any) -> Any:
    """Pairs with None, an open side as scipy takes it, as -inf or inf; anything else as is."""
    if isinstance(bounds, np.ndarray) or not all(
            isinstance(pair, (tuple, list)) and len(pair) == 2 for pair in bounds):
        return bounds
    return [(-np.inf if low is None else low, np.inf if high is None else high)
            for low, high in bounds]


class _Rows:
    """A round's points ``(k, D)`` -> their ``k`` values, by ``fun`` as the caller asked."""

    def __init__(self, fun: Callable, args: tuple, vectorized: bool, workers: int | Callable):
        if not callable(fun):
            raise TypeError(f"Invalid fun: {fun!r}; expected a callable fun(x, *args) -> float.")
        self.fun, self.args, self.vectorized, self.pool = fun, args, vectorized, None
        if callable(workers):
            self.map: Callable = workers
        elif isinstance(workers, (int, np.integer)) and not isinstance(workers, bool) and (
                workers == -1 or workers >= 1):
            if workers != 1:
                self.pool = concurrent.futures.ProcessPoolExecutor(
                    None if workers == -1 else int(workers))
            self.map = map if self.pool is None else self.pool.map
        else:
            raise ValueError(f"Invalid workers: {workers!r}; expected an int >= 1, -1 (every "
                             "core) or a map-like callable.")

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        if self.vectorized:
            values = np.asarray(self.fun(rows.T.copy(), *self.args), dtype=np.float64)
            if values.shape != (len(rows),):
                raise ValueError(f"A vectorized fun returned shape {values.shape} for {len(rows)} "
                                 f"points; expected ({len(rows)},).")
            return values
        calls: Iterable = self.map(_Call(self.fun, self.args), list(rows))
        return np.fromiter(map(_number, calls), dtype=np.float64, count=len(rows))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _number(value: Any) -> float:
    """``fun``'s value as a float: a number, or one element of an array (as scipy takes it)."""
    values = np.asarray(value, dtype=np.float64)
    if values.size != 1:
        raise ValueError(f"fun returned {values.size} values of shape {values.shape}; expected "
                         "one number (pass vectorized=True for a fun of many points).")
    return float(values.reshape(()))


def _seed(seed: Any) -> int:
    """The key's seed: an int (numpy's too), one drawn from a numpy Generator, or a fresh one."""
    if seed is None:
        return secrets.randbits(63)
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(2**63 - 1))
    return int(seed) if isinstance(seed, np.integer) else seed


class _Call:
    """``fun(x, *args)``, picklable where ``fun`` is (a pool's workers call it)."""

    def __init__(self, fun: Callable, args: Sequence):
        self.fun, self.args = fun, tuple(args)

    def __call__(self, x: np.ndarray) -> Any:
        return self.fun(x, *self.args)


def _result(state: Any, status: int, message: str) -> OptimizeResult:
    """The best point of ``state`` as scipy reports one."""
    return OptimizeResult(x=state.best_row.numpy().copy(), fun=float(state.best_loss),
                          nfev=int(state.num_evals), nit=int(state.step), success=status != 2,
                          status=status, message=message)
