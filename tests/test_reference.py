"""The vectorized update equals a slow bacterium-by-bacterium reference, fed the same randomness."""

import math

import pytest
import torch
from helpers import population, rastrigin, reference_update, sphere

import functional_bfo as fb

CASES = {
    "plain": dict(population_size=6, swim_length=3, chemotaxis_steps=2, reproduction_steps=2,
                  elimination_prob=0.5),
    "odd_population": dict(population_size=5, swim_length=2, chemotaxis_steps=1,
                           reproduction_steps=3, elimination_prob=0.5),
    "clip_bounds": dict(population_size=6, swim_length=3, chemotaxis_steps=2,
                        reproduction_steps=1, bounds=(-1.0, 1.0), boundary="clip",
                        step_size=0.4, elimination_prob=0.7),
    "swarming_levy": dict(population_size=6, swim_length=3, chemotaxis_steps=2,
                          reproduction_steps=2, swarming=True, tumble="levy", step_size=0.2),
    "maximize": dict(population_size=4, swim_length=2, chemotaxis_steps=2, reproduction_steps=2,
                     maximize=True),
    "no_swim": dict(population_size=4, swim_length=0, chemotaxis_steps=1, reproduction_steps=2),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("problem", [sphere(4), rastrigin(3)], ids=lambda p: p.name)
def test_update_matches_reference(name, problem):
    kwargs = CASES[name]
    loss = problem.loss
    if kwargs.get("maximize"):
        loss = lambda p, f=problem.loss: -f(p)  # noqa: E731
    opt = fb.bfo(**kwargs)
    state = opt.init({"x": torch.zeros(problem.dim, dtype=torch.float64)}, key=fb.random.key(7))
    for _ in range(6):  # covers the first evaluation, reproductions and dispersals
        want = reference_update(kwargs, state, loss)
        state = opt.update(state, loss)
        tol = dict(rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(population(state)["x"], want["population"], **tol)
        torch.testing.assert_close(state.losses, want["losses"], **tol)
        torch.testing.assert_close(state.health, want["health"], **tol)
        torch.testing.assert_close(state.best_params["x"], want["best_params"], **tol)
        assert math.isclose(float(state.best_loss), want["best_loss"], rel_tol=1e-10)
        assert int(state.num_evals) == want["num_evals"]
