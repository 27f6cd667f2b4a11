"""The benchmarks' problems: shifted functions, BBOB's, and the update scripts' with their setup.

``make(name, dim, seed, rotate)`` returns ``(loss_fn, bounds)``; ``loss_fn({"x": tensor(dim)})``
is the *error* ``f(x) - f(x*)``, 0 at the optimum, which a random shift or sign flip moves off
the box's centre:

* sphere, ellipsoid (condition 1e6), Rosenbrock, Rastrigin, Ackley, Griewank: ``z = R (x - s)``,
  ``s`` uniform in the middle 80% of half the box; ``rotate``: a random orthogonal ``R`` for
  the five that a rotation changes.
* Schwefel (box +-500, optimum 420.97 per coordinate): ``z = sign * x``, random signs; a shift
  or rotation would bring its deeper minima outside +-500 into the box.
* Styblinski-Tang (box +-5, optimum -2.9035 per coordinate): ``z = sign * (x - s)``, never
  rotated: a rotation could carry the optimum (norm 2.9 sqrt(D)) out of the box.
"""

from __future__ import annotations

import math

import optree
import torch

import functional_bfo as fb

BOXES = {"sphere": 5.0, "ellipsoid": 5.0, "rosenbrock": 2.0, "rastrigin": 5.12,
         "ackley": 32.0, "griewank": 600.0, "schwefel": 500.0, "styblinski_tang": 5.0}
ROTATABLE = ("ellipsoid", "rosenbrock", "rastrigin", "ackley", "griewank")
SCHWEFEL_ARGMIN = 420.968746227503
STYBLINSKI_TANG_ARGMIN = -2.903534027771178


def shift_of(name: str, dim: int, generator: torch.Generator) -> torch.Tensor:
    """Where the optimum of ``name`` sits: uniform in the middle 80% of half the box."""
    return (torch.rand(dim, generator=generator, dtype=torch.float64) * 1.6 - 0.8) * (
        BOXES[name] * 0.5)


def rastrigin(z, xp=torch):
    """Rastrigin over the last axis of ``z``, a torch tensor or (``xp=np``) a numpy array."""
    return 10 * z.shape[-1] + (z * z - 10 * xp.cos(2 * math.pi * z)).sum(-1)


def _schwefel_terms(z):
    return -z * torch.sin(z.abs().sqrt())


def _styblinski_tang_terms(z):
    return 0.5 * (z.pow(4) - 16 * z.square() + 5 * z)


def make(name: str, dim: int, seed: int, rotate: bool = False):
    """The error function of problem ``name`` in ``dim`` dimensions and its box ``(-b, b)``;
    ``seed`` draws the shift, signs and rotation (``rotate``: where one is defined)."""
    if name not in BOXES:
        raise ValueError(f"unknown problem {name!r}; expected one of {sorted(BOXES)}")
    shift, signs, generator = _placement(name, dim, seed)
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    rot = q * torch.sign(torch.diagonal(r)) if rotate and name in ROTATABLE else torch.eye(dim)
    weights = 10 ** (6 * torch.arange(dim, dtype=torch.float64) / max(dim - 1, 1))
    schwefel_min = _schwefel_terms(torch.tensor(SCHWEFEL_ARGMIN, dtype=torch.float64))
    st_min = _styblinski_tang_terms(torch.tensor(STYBLINSKI_TANG_ARGMIN, dtype=torch.float64))

    def loss(params):
        x = params["x"]
        if name == "schwefel":
            return (_schwefel_terms(signs.to(x.dtype) * x) - schwefel_min.to(x.dtype)).sum()
        z = (x - shift.to(x.dtype)) @ rot.to(x.dtype).T
        if name == "sphere":
            return z.square().sum()
        if name == "ellipsoid":
            return (weights.to(z.dtype) * z.square()).sum()
        if name == "rosenbrock":
            y = z + 1.0
            return (100 * (y[1:] - y[:-1].square()).square() + (1 - y[:-1]).square()).sum()
        if name == "rastrigin":
            return rastrigin(z)
        if name == "ackley":
            return (-20 * torch.exp(-0.2 * z.square().mean().sqrt())
                    - torch.exp(torch.cos(2 * math.pi * z).mean()) + 20 + math.e)
        if name == "griewank":
            i = torch.arange(1, dim + 1, dtype=z.dtype)
            return 1 + z.square().sum() / 4000 - torch.cos(z / i.sqrt()).prod()
        # styblinski_tang
        return (_styblinski_tang_terms(signs.to(z.dtype) * z) - st_min.to(z.dtype)).sum()

    return loss, (-BOXES[name], BOXES[name])


def _placement(name: str, dim: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return shift_of(name, dim, generator), 1 - 2 * (  # the shift, then the signs
        torch.rand(dim, generator=generator, dtype=torch.float64) < 0.5).double(), generator


def optimum(name: str, dim: int, seed: int) -> torch.Tensor:
    """Where ``make(name, dim, seed, rotate)`` is 0 (rotations turn about this point)."""
    shift, signs, _ = _placement(name, dim, seed)
    if name == "schwefel":
        return signs * SCHWEFEL_ARGMIN
    if name == "styblinski_tang":
        return shift + signs * STYBLINSKI_TANG_ARGMIN
    return shift


# COCO's 24 noiseless BBOB functions (Hansen et al. 2009), by function number. The suite's
# problems live in the box [-5, 5]^D; instance ``seed + 1`` places each seed's optimum.
BBOB_NAMES = [f"f{number:02d} {name}" for number, name in enumerate((
    "sphere ellipsoid-separable rastrigin-separable bueche-rastrigin linear-slope attractive-"
    "sector step-ellipsoid rosenbrock rosenbrock-rotated ellipsoid discus bent-cigar sharp-ridge "
    "different-powers rastrigin weierstrass schaffer-f7 schaffer-f7-ill griewank-rosenbrock "
    "schwefel gallagher-101 gallagher-21 katsuura lunacek-bi-rastrigin").split(), start=1)]
BBOB_BOX = 5.0


def make_bbob(name: str, dim: int, seed: int, offset: bool = False):
    """BBOB problem ``name`` (one of ``BBOB_NAMES``) as ``(f, box, optimum)``: ``f`` takes a
    float64 numpy vector and returns ``f(x) - f(x*)``, 0 at the optimum, with ``optimum`` 0;
    with ``offset`` it returns COCO's own value, as COCO hands it to an optimizer, and
    ``optimum`` is ``f(x*)`` (``cocoex``, from the ``coco-experiment`` package)."""
    import cocoex

    if name not in BBOB_NAMES:
        raise ValueError(f"unknown BBOB problem {name!r}; expected one of {BBOB_NAMES}")
    problem = cocoex.BareProblem("bbob", int(name[1:3]), dim, seed + 1)
    shift = 0.0 if offset else problem.best_value()
    return lambda x: float(problem(x)) - shift, (-BBOB_BOX, BBOB_BOX), problem.best_value() - shift


# The update scripts' problems (a shifted Rastrigin in a box and a small MLP classifier) and
# their setup: swim length SWIM, a reproduction every CYCLE updates, the hybrid with grad_mask.
FACTORIES = {"bfo": fb.bfo, "adaptive_bfo": fb.adaptive_bfo, "hybrid_bfo": fb.hybrid_bfo}
SWIM = 4  # swim_length: N_s + 1 = 5 evaluation calls an update
CYCLE = 10  # chemotaxis_steps: updates per reproduction


def rastrigin_problem(dim: int, device: str):
    def loss(params: dict) -> torch.Tensor:
        return rastrigin(params["x"] - 0.5)

    return {"x": torch.zeros(dim, device=device)}, loss, dict(bounds=(-5.12, 5.12))


def mlp(widths: tuple[int, ...], samples: int, device: str):
    """A seeded MLP classifier (tanh between its layers) and random inputs and labels."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    x = torch.randn(samples, widths[0], device=device)
    y = torch.randint(0, widths[-1], (samples,), device=device)
    return model, x, y


def mlp_problem(widths: tuple[int, ...], samples: int, device: str):
    model, x, y = mlp(widths, samples, device)
    params, module_loss = fb.module_loss(model, torch.nn.functional.cross_entropy)
    return params, lambda p: module_loss(p, x, y), {}


def started(variant: str, population: int, problem, core=fb, **extra):
    """``(opt, state)``: ``variant`` of ``core`` on a ``*_problem`` triple, after one update."""
    params, loss, settings = problem
    extra = {"grad_mask": True, **extra} if variant == "hybrid_bfo" else extra
    opt = getattr(core, variant)(population_size=population, swim_length=SWIM,
                                 chemotaxis_steps=CYCLE, **settings, **extra)
    return opt, opt.update(opt.init(params, key=core.random.key(0)), loss)


def evaluation(variant: str, loss):
    """What an update of ``variant`` calls on a population: the floor's evaluation."""
    return torch.func.vmap(torch.func.grad_and_value(loss) if variant == "hybrid_bfo" else loss)


def cycle(update, state, loss, clone: bool = False, current: list | None = None):
    """CYCLE updates chained from ``state`` (one reproduction), as a user runs them; each end
    in ``current[0]`` (pass a list to read it), copied with ``clone`` (a CUDA graph's outputs
    live until its next replay)."""
    current = [] if current is None else current
    current[:] = [state]

    def run():
        s = current[0]
        for _ in range(CYCLE):
            s = update(s, loss)
        current[0] = optree.tree_map(torch.clone, s) if clone else s

    return run


def numpy_loss(f):
    """A loss of ``{"x": tensor}`` that calls the numpy ``f`` (float64 vector -> float)."""
    return lambda params: torch.tensor(f(params["x"].detach().numpy()), dtype=torch.float64)


def row_by_row(f) -> fb.evaluate.Evaluator:
    """An evaluator calling ``f`` on each row of the population (the ``loop()`` evaluator
    does the same through one ``loss_fn`` call per bacterium, more slowly)."""
    return lambda loss_fn, population: torch.tensor(
        [f(row) for row in population["x"].detach().numpy()], dtype=population["x"].dtype)
