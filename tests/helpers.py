"""Problem bank with known minima, and a slow loop-based reference BFO to check the core against."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import optree
import torch

import functional_bfo as fb


def clone(tree):
    return optree.tree_map(torch.clone, tree)


def assert_trees_equal(a, b):
    """Same structure, shapes, dtypes, devices and bits (NaN equal to NaN)."""
    assert optree.tree_structure(a) == optree.tree_structure(b)
    for x, y in zip(optree.tree_leaves(a), optree.tree_leaves(b)):
        assert (x.dtype, x.shape, x.device) == (y.dtype, y.shape, y.device)
        assert torch.equal(x.isnan(), y.isnan())
        assert torch.equal(x.nan_to_num(), y.nan_to_num())


@dataclass(frozen=True)
class Problem:
    name: str
    loss: Callable[[dict], torch.Tensor]  # loss({"x": tensor(D)}) -> 0-d tensor
    dim: int
    minimum: float
    bounds: tuple[float, float]


def _shift(dim: int) -> torch.Tensor:
    """A fixed shift so that no optimum sits at the origin (where BFO starts)."""
    return torch.linspace(-0.7, 0.9, dim, dtype=torch.float64)


def sphere(dim: int = 5) -> Problem:
    s = _shift(dim)
    return Problem("sphere", lambda p: (p["x"] - s.to(p["x"].dtype)).square().sum(), dim, 0.0,
                   (-5.0, 5.0))


def rosenbrock(dim: int = 2) -> Problem:
    s = _shift(dim)

    def loss(p):
        x = p["x"] - s.to(p["x"].dtype) + 1.0  # the minimum (all ones) moves to x = shift
        return (100 * (x[1:] - x[:-1].square()).square() + (1 - x[:-1]).square()).sum()
    return Problem("rosenbrock", loss, dim, 0.0, (-2.0, 2.0))


def rastrigin(dim: int = 5) -> Problem:
    s = _shift(dim)

    def loss(p):
        x = p["x"] - s.to(p["x"].dtype)
        return 10 * dim + (x.square() - 10 * torch.cos(2 * math.pi * x)).sum()
    return Problem("rastrigin", loss, dim, 0.0, (-5.12, 5.12))


def reference_normals(key, step: int, row: int, count: int, dtype) -> torch.Tensor:
    """Row ``row`` of ``fb.random.normal_rows`` at counter ``step``, spelled out value by value."""
    wide = dtype == torch.float64
    words_needed = count * (2 if wide else 1)
    half = (words_needed + 1) // 2
    lanes = torch.arange(half) + row * half
    y0, y1 = fb.random.threefry2x32(key, torch.full((half,), step), lanes)
    words = (y0.tolist() + y1.tolist())[:words_needed]
    values = []
    for k in range(count):
        if wide:  # 52 bits (open interval): 20 high from the first half, 32 from the second
            m = ((words[k] >> 12) << 32) | words[count + k]
            u = (m + 0.5) * 2.0**-52
        else:  # 23 bits, open interval, in float32
            u = float(torch.tensor(((words[k] >> 9) + 0.5) * 2.0**-23, dtype=torch.float32))
        values.append(u)
    u = torch.tensor(values, dtype=torch.float64 if wide else torch.float32)
    return (math.sqrt(2.0) * torch.erfinv(2.0 * u - 1.0)).to(dtype)


def reference_update(opt_kwargs: dict, state: fb.BFOState, loss: Callable, *, leaf="x"):
    """One canonical BFO step written bacterium by bacterium, straight from Passino (2002).

    Params must be ``{leaf: 1-d tensor}``. Randomness is re-derived here from the documented
    layout: bacterium i at step s draws 2n+3 normals from the Threefry words of counters
    (s, i*h + j), j < h = ceil(words/2), by the inverse normal CDF of (0, 1) uniforms
    = tumble (n) | dispersal place (n) | Lévy u, v | dispersal coin (through the normal CDF).
    """
    size = opt_kwargs["population_size"]
    swims = opt_kwargs.get("swim_length", 4)
    n_c = opt_kwargs.get("chemotaxis_steps", 100)
    n_re = opt_kwargs.get("reproduction_steps", 4)
    bounds = opt_kwargs.get("bounds")
    sign = -1.0 if opt_kwargs.get("maximize", False) else 1.0
    hp = state.hyperparams
    c, p_ed, scale = float(hp.step_size), float(hp.elimination_prob), float(hp.init_scale)
    dtype = state.losses.dtype

    pop = [population(state)[leaf][i].clone() for i in range(size)]
    cost = [sign * float(v) for v in state.losses]
    health = [float(v) for v in state.health]
    best_x, best = state.best_params[leaf].clone(), sign * float(state.best_loss)
    step = int(state.step)

    def bound(x):
        return x if bounds is None else x.clamp(bounds[0], bounds[1])

    n = pop[0].numel()
    noise = [reference_normals(state.key, step, i, 2 * n + 3, dtype) for i in range(size)]

    if step > 0 and step % n_c == 0:  # reproduction: healthiest half splits
        order = sorted(range(size), key=lambda i: (health[i], i))
        src = order[: size - size // 2] + order[: size // 2]
        pop, cost, health = [pop[j] for j in src], [cost[j] for j in src], [0.0] * size
    if step > 0 and step % (n_c * n_re) == 0:  # elimination-dispersal
        for i in range(size):
            if float(torch.special.ndtr(noise[i][2 * n + 2])) < p_ed:
                z = noise[i][n : 2 * n]
                if bounds is None:
                    pop[i] = (best_x.to(dtype) + scale * z).to(pop[i].dtype)
                else:
                    u = torch.special.ndtr(z)
                    pop[i] = (bounds[0] + (bounds[1] - bounds[0]) * u).to(pop[i].dtype)
                cost[i] = math.nan

    swarm = [x.clone() for x in pop]

    def jcc(x):
        if not opt_kwargs.get("swarming", False):
            return 0.0
        total = 0.0
        for y in swarm:
            d2 = float((x.to(dtype) - y.to(dtype)).square().sum())
            total += (-float(hp.d_attract) * math.exp(-float(hp.w_attract) * d2)
                      + float(hp.h_repel) * math.exp(-float(hp.w_repel) * d2))
        return total

    def cost_of(x):
        v = float(loss({leaf: x}))
        return sign * v if math.isfinite(v) else math.inf

    new_pop, new_cost, evals = [], [], 0
    for i in range(size):
        z = noise[i][:n]
        phi = z / z.square().sum().sqrt()
        length = 1.0
        if opt_kwargs.get("tumble", "gaussian") == "levy":
            beta = float(hp.levy_beta)
            u, v = noise[i][2 * n : 2 * n + 2].tolist()
            sigma = (math.gamma(1 + beta) * math.sin(math.pi * beta / 2)
                     / (math.gamma((1 + beta) / 2) * beta * 2 ** ((beta - 1) / 2))) ** (1 / beta)
            length = min(sigma * abs(u) / abs(v) ** (1 / beta), 1e3)
        known = not math.isnan(cost[i])
        j_last = cost[i] + jcc(pop[i]) if known else math.inf
        start = 1 if known else 0
        xs, raws, js = [], [], []
        for k in range(swims + 1):  # the whole swim ray is evaluated
            x = bound(pop[i].to(dtype) + (start + k) * (c * length) * phi).to(pop[i].dtype)
            r = cost_of(x)
            evals += 1
            if r < best:
                best, best_x = r, x.clone()
            xs.append(x)
            raws.append(r)
            js.append(r + jcc(x))
        k = 0  # Passino: keep swimming while the last step improved on the one before
        while k < swims and js[k] < (j_last if k == 0 else js[k - 1]):
            k += 1
        new_pop.append(xs[k])
        new_cost.append(raws[k])
        health[i] += js[k]
    return {
        "population": torch.stack(new_pop),
        "losses": torch.tensor([sign * v for v in new_cost], dtype=dtype),
        "health": torch.tensor(health, dtype=dtype),
        "best_params": best_x,
        "best_loss": sign * best,
        "num_evals": int(state.num_evals) + evals,
    }


def population(state):
    """The population of ``state`` as params, each leaf ``(P, *leaf.shape)``."""
    return fb.as_params(state, state.population)


def leaf_flags(state):
    """A hybrid state's gradient mask as params of bools, one per leaf."""
    return optree.tree_map(lambda m: bool(m.all()), fb.as_params(state, state.grad_mask))
