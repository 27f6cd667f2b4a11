"""Hashes of fixed-seed trajectories of every variant: a refactor must leave them unchanged.

    python dev/fingerprint.py > before.json   # on the old code
    python dev/fingerprint.py | diff before.json -   # on the new code: no output
"""

import hashlib
import json
import sys

import optree
import torch

import functional_bfo as fb


def rastrigin(p):
    x = p["x"]
    wave = (x.square() - 10 * torch.cos(2 * torch.pi * x)).sum()
    return 10 * x.numel() + wave + p["b"].square().sum()


def digest(state) -> str:
    h = hashlib.sha256()
    for leaf in optree.tree_leaves(state):
        h.update(leaf.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def params(dtype=torch.float32):
    return {"x": torch.full((5,), 1.5, dtype=dtype), "b": torch.zeros(2, 2, dtype=dtype)}


RUNS = {
    "bfo": (fb.bfo, dict(population_size=8, chemotaxis_steps=3, reproduction_steps=2)),
    "bfo_batch2": (fb.bfo, dict(population_size=8, chemotaxis_steps=3, swim_batch=2)),
    "bfo_batch5": (fb.bfo, dict(population_size=7, chemotaxis_steps=3, swim_batch=5)),
    "bfo_swarm_levy": (fb.bfo, dict(population_size=8, chemotaxis_steps=3, swarming=True,
                                    tumble="levy")),
    "bfo_reflect": (fb.bfo, dict(population_size=8, bounds=(-2.0, 2.0), step_size=0.7,
                                 chemotaxis_steps=3, reproduction_steps=1)),
    "bfo_clip": (fb.bfo, dict(population_size=8, bounds=(-2.0, 2.0), boundary="clip",
                              step_size=0.7)),
    "bfo_wrap_open": (fb.bfo, dict(population_size=8, bounds=(-2.0, float("inf")),
                                   boundary="wrap", step_size=0.7)),
    "bfo_max": (fb.bfo, dict(population_size=8, maximize=True, chemotaxis_steps=4)),
    "bfo_noswim": (fb.bfo, dict(population_size=5, swim_length=0, chemotaxis_steps=2)),
    "adaptive": (fb.adaptive_bfo, dict(population_size=8, chemotaxis_steps=3)),
    "adaptive_batch3": (fb.adaptive_bfo, dict(population_size=8, chemotaxis_steps=3,
                                              swim_batch=3)),
    "adaptive_vary": (fb.adaptive_bfo, dict(population_size=10, min_population_size=4,
                                            chemotaxis_steps=2, stagnation_steps=2)),
    "adaptive_rel": (fb.adaptive_bfo, dict(population_size=8, bounds=(-5.12, 5.12),
                                           relative_steps=True, step_size=0.05)),
    "hybrid": (fb.hybrid_bfo, dict(population_size=8, grad_mask=True, chemotaxis_steps=3)),
    "hybrid_mom": (fb.hybrid_bfo, dict(population_size=8, momentum=0.5, chemotaxis_steps=3,
                                       grad_mask={"x": True, "b": False}, swim_batch=2)),
    "hybrid_vary": (fb.hybrid_bfo, dict(population_size=8, grad_mask=True, min_population_size=3,
                                        chemotaxis_steps=2, stagnation_steps=2)),
}


def main() -> None:
    out = {}
    for name, (factory, kwargs) in RUNS.items():
        for dtype in (torch.float32, torch.float64):
            opt = factory(**kwargs)
            state = opt.init(params(dtype), key=fb.random.key(3))
            for _ in range(13):
                state = opt.update(state, rastrigin)
            out[f"{name}-{str(dtype)[6:]}"] = digest(state)
    opt = fb.hybrid_bfo(population_size=6, grad_mask=True)
    state = opt.init(params(), key=fb.random.key(4))
    for _ in range(5):
        grad = torch.func.grad(rastrigin)(state.best_params)
        state = opt.update(state, rastrigin, grad=grad)
    out["hybrid_given_grad"] = digest(state)
    lo = {"x": (-5.12, 5.12), "b": (-1.0, 1.0)}
    result = fb.black_box(rastrigin, params(), lo, max_evals=3000, key=fb.random.key(5))
    counts = f"-{result.num_evals}-{result.restarts}"
    out["black_box"] = digest((result.params, result.loss)) + counts
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
