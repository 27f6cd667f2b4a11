"""The black box as a nevergrad optimizer, registered as ``ng.optimizers.registry["BlackBoxBFO"]``.

It searches nevergrad's normalized unit box (``p.helpers.Normalizer``: bounded coordinates map
linearly, unbounded ones through arctan) and hands each asked candidate as standardized data,
so it takes any continuous parametrization, as nevergrad's own samplers do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import nevergrad as ng
import numpy as np
import torch
from nevergrad.optimization import base
from nevergrad.parametrization import parameter as p

import functional_bfo as fb

BUDGET_PER_DIM = 2000  # one search's budget without nevergrad's, as the benchmarks run it
EDGE = 1e-9  # an unbounded coordinate's arctan stays off its infinite ends


class _BlackBoxBFO(base.Optimizer):
    """:func:`functional_bfo.black_box_search` asked and told one candidate at a time."""

    def __init__(self, parametrization: Any, budget: int | None = None, num_workers: int = 1,
                 **given: Any):
        super().__init__(parametrization, budget=budget, num_workers=num_workers)
        # A candidate that breaks a cheap constraint is told +inf (the worst), as nevergrad
        # does for DE, before it asks again: its row would otherwise hold the round open.
        self._penalize_cheap_violations = True
        size = self.dimension
        self._to_data = _unit_to_data(p.helpers.Normalizer(self.parametrization), size)
        settings = {k: v for k, v in given.items() if v is not None}
        rows_per_round = settings.get("swim_length", 1) + 1
        settings.setdefault("population_size", max(8, -(-num_workers // rows_per_round)))
        round_size = settings["population_size"] * rows_per_round  # a budget below it: one round
        self._search: Any = fb.black_box_search(  # its ask and tell are never None
            (torch.zeros(size, dtype=torch.float64), torch.ones(size, dtype=torch.float64)),
            max_evals=max(budget or BUDGET_PER_DIM * size, round_size), **settings)
        self._state: Any = None  # drawn at the first ask, from the parametrization's seed
        self._searches, self.spares = 0, 0  # spares: asked past the open round, not searched
        self._holders: dict[str, int] = {}  # candidate uid -> its row of the open round

    def _begin(self, start: np.ndarray) -> None:
        if self._searches == 0:
            self._key = fb.random.key(int(self._rng.randint(2**31)))
        key = fb.random.fold_in(self._key, self._searches) if self._searches else self._key
        self._state = self._search.init({"x": torch.from_numpy(start)}, key=key)
        self._searches += 1
        self._ask_round()

    def _ask_round(self) -> None:
        self._open = self._search.ask(self._state)
        self._rows = self._open.params["x"].numpy()
        mask = self._open.mask.numpy()
        self._free = [int(row) for row in np.flatnonzero(mask)]
        self._untold = set(self._free)
        self._losses = np.full(len(mask), np.nan)
        self._holders.clear()

    def _candidate(self, unit: np.ndarray) -> p.Parameter:
        return self.parametrization.spawn_child().set_standardized_data(self._to_data(unit))

    def _internal_ask_candidate(self) -> p.Parameter:
        if self._state is None:
            self._begin(np.full(self.dimension, 0.5))
        if not self._free:  # every row of the open round is out: a uniform spare point
            self.spares += 1
            return self._candidate(self._rng.uniform(size=self.dimension))
        row = self._free.pop(0)
        candidate = self._candidate(self._rows[row])
        self._holders[candidate.uid] = row
        return candidate

    def _internal_tell_candidate(self, candidate: p.Parameter, loss: Any) -> None:
        row = self._holders.pop(candidate.uid, None)
        if row is None:  # a spare (nevergrad's archive keeps it)
            return
        self._losses[row] = loss if math.isfinite(loss) or loss == math.inf else math.nan
        self._untold.discard(row)
        if self._untold:
            return
        self._state = self._search.tell(self._state, self._open, self._losses, check=False)
        if self._state.phase == "done":
            self._begin(self._state.best_row.numpy().copy())
        else:
            self._ask_round()


def _unit_to_data(normalizer: Any, size: int) -> Callable[[np.ndarray], np.ndarray]:
    """Unit box -> standardized data: the normalizer's map, in closed form where it can be.

    Probing three points tells whether each coordinate's map is linear (bounded) or arctan's
    (unbounded); the closed form skips the normalizer's per-candidate parameter copies.
    """
    probes = np.array([0.2, 0.5, 0.8])
    data = np.stack([normalizer.backward(np.full(size, u)) for u in probes])
    slope = (data[2] - data[0]) / 0.6
    offset = data[1] - 0.5 * slope
    linear = np.isclose(data[0], offset + 0.2 * slope, rtol=1e-9, atol=1e-12)
    arctan = np.isclose(data, np.tan(np.pi * (probes[:, None] - 0.5)), rtol=1e-9).all(0)
    if not (linear | arctan).all():
        return lambda unit: normalizer.backward(np.clip(unit, EDGE, 1 - EDGE))
    return lambda unit: np.where(arctan, np.tan(np.pi * (np.clip(unit, EDGE, 1 - EDGE) - 0.5)),
                                 offset + slope * unit)


class BlackBoxBFO(base.ConfiguredOptimizer):
    """:func:`functional_bfo.black_box_search` as a nevergrad optimizer.

    ``budget`` is the search's ``max_evals`` (2000 per coordinate without one; once spent, a
    new search starts from the best point on the next key). A round holds at least
    ``num_workers`` candidates (``population_size`` grows to fit), so parallel workers are
    served from the open round; an ask past it (a faces round, or a batch larger than
    ``num_workers``) gets a uniform spare point, counted in ``optimizer.spares``, which
    nevergrad's archive keeps but the search does not. A candidate told but never asked is
    ignored by the search. The key comes from the parametrization's ``random_state``.

    Args:
        population_size: the swarm's size (default: 8, or more to give ``num_workers`` a row
            each).
        swim_length: points a bacterium tries along its tumble per round (default 1).
        metric_rate: how fast the swarm learns its metric (default 2.0; 0 keeps it isotropic).
        polish: the budget's share kept for the end's local search (default 0.1).

    Examples:
        >>> import nevergrad as ng, numpy as np
        >>> from functional_bfo.adapters import nevergrad  # registers "BlackBoxBFO"
        >>> param = ng.p.Array(shape=(2,), lower=-5, upper=5)
        >>> param.random_state.seed(0)
        >>> opt = ng.optimizers.registry["BlackBoxBFO"](param, budget=1000)
        >>> best = opt.minimize(lambda x: float(np.sum((x - 1.5) ** 2)) + 10)
        >>> np.round(best.value, 4).tolist()
        [1.5, 1.5]
    """

    def __init__(self, *, population_size: int | None = None, swim_length: int | None = None,
                 metric_rate: float | None = None, polish: float | None = None):
        super().__init__(_BlackBoxBFO, locals())


ng.optimizers.registry.register_name("BlackBoxBFO", BlackBoxBFO())
