"""The population between swims: its start, reproduction, elimination–dispersal, its noise."""

from __future__ import annotations

from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from . import random
from ._base import Key, Params
from ._bounds import LeafBounds, flat_box, leaf_bounds, project, sample_domain
from ._checks import check_params
from ._layout import layout, ravel, unravel


class Start(NamedTuple):
    """What every variant's ``init`` starts from."""

    first: Params  # the params, detached, copied and clipped into the box: bacterium 0
    population: Tensor  # (P, D): bacterium 0, then P - 1 samples of the search domain
    key: Tensor  # the run key (the init key's second half; the first made the population)
    dtype: torch.dtype  # the loss and step dtype: float64 if any leaf is, else float32
    box: LeafBounds  # the rows' box in that dtype (every side open without bounds)

    def state_fields(self, sign: float, hyperparams: dict, hyperparams_type: type) -> dict:
        """The fields every variant's state starts with, nothing evaluated yet."""
        size, device = self.population.shape[0], self.key.device
        largest = torch.finfo(self.dtype).max
        for name, value in hyperparams.items():
            if abs(value) > largest:
                raise ValueError(f"Invalid {name}: {value!r} overflows {self.dtype} (largest "
                                 f"{largest:.3g}), the dtype of the state for these params; "
                                 "pass a smaller value, or float64 params.")
        tensor = lambda v: torch.tensor(v, dtype=self.dtype, device=device)  # noqa: E731
        count = torch.zeros((), dtype=torch.int64, device=device)
        return dict(  # in the order of the states' leading fields
            population=self.population,
            losses=torch.full((size,), torch.nan, dtype=self.dtype, device=device),
            health=torch.zeros(size, dtype=self.dtype, device=device),
            best_params=self.first, best_loss=tensor(sign * torch.inf), key=self.key, step=count,
            num_evals=count.clone(), box=self.box, disagreeing_ranks=count.clone(),
            hyperparams=hyperparams_type(**{k: tensor(v) for k, v in hyperparams.items()}),
        )


def per_run(state: Any) -> Any:
    """``state`` plus a zero from its key and population: batched under ``vmap(init)``."""
    # zeros_like, not sum * 0: a sum of huge params is inf, and inf * 0 is NaN.
    zero = state.key[..., 0] * 0 + torch.zeros_like(state.population[..., 0, 0], dtype=torch.int64)

    def batched(x: Tensor) -> Tensor:
        return x | zero.bool() if x.dtype == torch.bool else x + zero.to(x.dtype)

    kept = ("population", "key", "best_params")  # the population: from params and key
    shape = layout(state.best_params)  # views of one row, as every update leaves them
    return state._replace(best_params=unravel(shape, batched(ravel(shape, state.best_params))),
                          **{name: optree.tree_map(batched, getattr(state, name))
                             for name in state._fields if name not in kept})


def initial_population(params: Params, key: Tensor, size: int, bounds: Any, init_scale: float
                       ) -> Start:
    """Validate ``params`` and ``key``; the initial population, bacterium 0 the params."""
    leaves, _ = check_params(params)
    random.check_key(key)
    try:
        shape = layout(params)
        device, dtype = leaves[0].device, shape.dtype  # one, checked
        init_key, run_key = random.split(key.to(device))
        box = flat_box(bounds, shape, device)
        first = project(ravel(shape, params).detach(), box, "clip").clone()
        keys = random.fold_in(init_key, torch.arange(1, size, device=device))
        z = torch.func.vmap(lambda k: random.normal(k, (shape.size,), dtype))(keys)
        rest = sample_domain(first, z, box, torch.tensor(init_scale, dtype=dtype, device=device))
        if box is None:  # every side open (vmap returns no None)
            inf = torch.tensor(torch.inf, dtype=dtype, device=device)
            box = leaf_bounds(-inf, inf)
        return Start(unravel(shape, first), torch.cat([first.unsqueeze(0), rest]), run_key,
                     dtype, box._replace(open=~box.finite))
    except RuntimeError as e:  # the allocator's own words, with the size that asked for it
        message = str(e)
        if "out of memory" in message or "allocate" in message:
            per = sum(x.numel() * x.element_size() for x in leaves)
            e.add_note(f"functional_bfo: population_size={size} bacteria of {per:,} bytes "
                       f"each need {size * per / 2**30:.3g} GiB for the population alone (and "
                       "as much again per swim point evaluated); lower population_size.")
        raise


def reproduction_index(health: Tensor, reproduce: Tensor, active: Tensor | None = None) -> Tensor:
    """Source bacterium of each slot after reproduction, (P,): the identity unless ``reproduce``.

    With ``active`` (a 0-d count ``n``) only the first ``n`` slots take part.
    """
    slots = torch.arange(health.shape[0], device=health.device)
    n = health.shape[0] if active is None else active
    if active is not None:
        inside = slots < n
        health, reproduce = torch.where(inside, health, torch.inf), reproduce & inside
    order = torch.argsort(health, stable=True)  # the healthiest survivors, then copies
    return torch.where(reproduce, order.index_select(0, slots % (n - n // 2)), slots)


class Noise(NamedTuple):
    """The random numbers of one update, per bacterium."""

    direction: Tensor  # (P, n) standard normals, for the tumble
    place: Tensor  # (P, n) standard normals, for dispersal
    levy_u: Tensor  # (P,) normals for Mantegna's step length
    levy_v: Tensor  # (P,)
    coin: Tensor  # (P,) uniforms for the dispersal decision


def bacterium_noise(key: Key, step: Tensor, size: int, n: int, dtype) -> Noise:
    """Every random number of one update: ``normal_rows(key, step, P, 2n + 3)``, cut."""
    z = random.normal_rows(key, step, size, 2 * n + 3, dtype)
    return Noise(z[:, :n], z[:, n:2 * n], z[:, 2 * n], z[:, 2 * n + 1],
                 torch.special.ndtr(z[:, 2 * n + 2]))
