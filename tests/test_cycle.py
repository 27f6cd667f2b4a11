"""Cycle events run masked on every update: one program, compiled and vmapped over runs too."""

import optree
import pytest
import torch
from helpers import assert_trees_equal

import functional_bfo as fb
from functional_bfo._ask_tell import at_step, cycle_ends


def sq(p):
    return (p["x"] - 0.3).square().sum()


# Every variant, with the settings that change what a cycle's events do.
TWINS = [
    ("bfo", dict(reproduction_steps=2, bounds=(-1.0, 1.0))),
    ("bfo", dict(reproduction_steps=1, swarming=True, tumble="levy")),
    ("adaptive_bfo", dict(metric_rate=2.0, bounds=(-1.0, 1.0), relative_steps=True)),
    ("adaptive_bfo", dict(min_population_size=3, stagnation_steps=2, tumble="levy")),
    ("adaptive_bfo", dict(population_size=1, metric_rate=2.0)),
    ("hybrid_bfo", dict(grad_mask=True, momentum=0.5, min_population_size=4)),
]


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


@pytest.mark.parametrize(("variant", "settings"), TWINS)
def test_at_step_leaves_out_the_cycle_events_only_where_none_ends(variant, settings):
    """A driver that knows the step leaves out the masked cycle events: the same states,
    by update and by ask/tell; where a cycle ends it gets the whole update."""
    opt = getattr(fb, variant)(**{"population_size": 8, "chemotaxis_steps": 3,
                                  "elimination_prob": 0.5, **settings})
    state = opt.init({"x": torch.zeros(4)}, key=fb.random.key(3))
    for step in range(14):
        new, picked = opt.update(state, sq), at_step(opt, step)
        assert (picked is opt) == (step > 0 and step % 3 == 0)
        assert_trees_equal(picked.update(state, sq), new)
        asked = picked.ask(state)
        grads, losses = torch.func.vmap(torch.func.grad_and_value(sq))(asked.params)
        given = dict(grads=grads) if variant == "hybrid_bfo" else {}
        assert_trees_equal(picked.tell(state, asked, losses, **given),
                           opt.tell(state, asked, losses, **given))
        if picked is opt:  # left out, the events would be missed: health would not restart
            assert not torch.equal(opt.twin.update(state, sq).health, new.health)
        state = new


@pytest.mark.parametrize(("variant", "settings"), TWINS[::2])
def test_run_eager_is_a_loop_of_updates(variant, settings):
    """run picks each update with at_step: bitwise a plain loop over several cycles."""
    opt = getattr(fb, variant)(**{"population_size": 8, "chemotaxis_steps": 3, **settings})
    state = opt.init({"x": torch.zeros(3)}, key=fb.random.key(5))
    looped = state
    for _ in range(11):
        looped = opt.update(looped, sq)
    assert_trees_equal(fb.run(opt, state, sq, max_steps=11), looped)


def test_an_optimizer_without_a_twin_is_its_own_at_every_step():
    plain = fb.Optimizer(lambda params, *, key: params, lambda state, loss_fn: state)
    assert at_step(plain, 1) is plain and at_step(plain, 0) is plain
