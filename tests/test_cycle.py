"""Cycle events run masked on every update: one program, compiled and vmapped over runs too."""

import optree
import torch
from helpers import assert_trees_equal

import functional_bfo as fb
from functional_bfo._cycle import cycle_ends


def test_cycle_ends_on_multiples_of_the_period_after_the_start():
    ends = [bool(cycle_ends(torch.tensor(s), 3)) for s in range(8)]
    assert ends == [False, False, False, True, False, False, True, False]


def test_compiled_updates_vmapped_over_runs_match_each_run():
    """A batched step count (vmap over runs) cannot be read on the host: the masked events
    give every run its own reproductions, the same as each run alone."""
    opt = fb.adaptive_bfo(population_size=8, min_population_size=3, chemotaxis_steps=2)
    loss = lambda p: (p["x"] - 0.3).square().sum()  # noqa: E731
    start = {"x": torch.zeros(3)}
    keys = fb.random.split(fb.random.key(1), 3)
    states = torch.func.vmap(lambda k: opt.init(start, key=k))(keys)
    update = torch.compile(torch.func.vmap(lambda s: opt.update(s, loss)), fullgraph=True,
                           backend="aot_eager")
    for _ in range(5):  # steps 0..4: reproduction at 2 and 4
        states = update(states)
    for i, k in enumerate(keys):
        single = opt.init(start, key=k)
        for _ in range(5):
            single = opt.update(single, loss)
        assert_trees_equal(optree.tree_map(lambda x, i=i: x[i], states), single)
