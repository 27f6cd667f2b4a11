"""Ask/tell: every variant's update as a round the caller evaluates, bit for bit the same."""

import functools
import subprocess
import sys
import textwrap

import numpy as np
import optree
import pytest
import torch
from helpers import assert_trees_equal
from variants import VARIANTS, loss_fn, params, run_updates

import functional_bfo as fb

variants = pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)


def answer(variant, asked, fn=loss_fn):
    """What a caller does: evaluate every asked row (and its gradient for the hybrid)."""
    if variant.flags.get("uses_gradients"):
        grads, losses = torch.func.vmap(torch.func.grad_and_value(fn))(asked.params)
        return losses, {"grads": grads}
    return torch.func.vmap(fn)(asked.params), {}


def ask_tell(variant, opt, state, n, fn=loss_fn):
    for _ in range(n):
        asked = opt.ask(state)
        losses, extra = answer(variant, asked, fn)
        state = opt.tell(state, asked, losses, **extra)
    return state


@variants
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ask_tell_is_update_bit_for_bit(variant, seed):
    opt = variant.make()
    state = opt.init(params(), key=fb.random.key(seed))
    assert_trees_equal(ask_tell(variant, opt, state, 8), run_updates(opt, state, 8))


def test_hybrid_grads_off_the_mask_are_ignored_as_update_ignores_them():
    variant = next(v for v in VARIANTS if v.name == "hybrid_bfo")
    opt = variant.make(grad_mask={"w": True, "b": (False, True)})
    state = opt.init(params(), key=fb.random.key(7))
    assert_trees_equal(ask_tell(variant, opt, state, 6), run_updates(opt, state, 6))


@variants
def test_asking_twice_gives_the_same_round_and_changes_nothing(variant):
    opt = variant.make()
    state = ask_tell(variant, opt, opt.init(params(), key=fb.random.key(3)), 2)
    before = optree.tree_map(torch.clone, state)
    first, second = opt.ask(state), opt.ask(state)
    assert_trees_equal(first, second)
    assert_trees_equal(state, before)
    size = state.losses.shape[0]
    rows = optree.tree_leaves(first.params)[0].shape[0]
    assert rows % size == 0 and first.mask.shape == (rows,) and first.mask.dtype == torch.bool
    # The mask marks exactly what num_evals counts.
    losses, extra = answer(variant, first)
    told = opt.tell(state, first, losses, **extra)
    assert int(told.num_evals - state.num_evals) == int(first.mask.sum())


def test_rows_outside_the_mask_are_ignored():
    variant = next(v for v in VARIANTS if v.name == "adaptive_bfo_varying_population")
    opt = variant.make()
    state = ask_tell(variant, opt, opt.init(params(), key=fb.random.key(4)), 6)
    asked = opt.ask(state)
    assert not bool(asked.mask.all())  # some slots are out of play
    losses = torch.func.vmap(loss_fn)(asked.params)
    garbage = torch.where(asked.mask, losses, -1e30)  # would win if it were read
    assert_trees_equal(opt.tell(state, asked, garbage), opt.tell(state, asked, losses))


def test_losses_from_numpy_or_a_list_and_nan_ranks_last():
    opt = fb.bfo(4, swim_length=1)
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(0))
    asked = opt.ask(state)
    values = [float(v) for v in torch.func.vmap(lambda p: p["x"].sum())(asked.params)]
    by_tensor = opt.tell(state, asked, torch.tensor(values))
    assert_trees_equal(opt.tell(state, asked, np.array(values)), by_tensor)
    assert_trees_equal(opt.tell(state, asked, values), by_tensor)
    nan = [float("nan")] + values[1:]
    told = opt.tell(state, asked, nan)
    assert torch.isfinite(told.best_loss) and float(told.best_loss) == min(values[1:])
    with pytest.warns(RuntimeWarning, match="every loss told to bfo.tell this round is NaN"):
        assert float(opt.tell(state, asked, [float("nan")] * len(values)).best_loss) == np.inf
    opt.tell(state, asked, [float("nan")] * len(values), check=False)  # no host read, no word


def test_tell_refuses_what_does_not_answer_the_round():
    opt = fb.bfo(4, swim_length=1)
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(0))
    asked = opt.ask(state)
    losses = torch.zeros(8)
    with pytest.raises(ValueError, match=r"shape \(7,\); expected \(8,\)"):
        opt.tell(state, asked, losses[:7])
    with pytest.raises(ValueError, match=r"expected \(8,\)"):
        opt.tell(state, asked, losses.reshape(8, 1))
    with pytest.raises(TypeError, match="real numbers"):
        opt.tell(state, asked, torch.zeros(8, dtype=torch.bool))
    with pytest.raises(TypeError, match="numpy array or a list"):
        opt.tell(state, asked, ["a"] * 8)
    for unreadable in ([None] * 8, ["1.5"] * 8, [1.0, [2.0]] + [0.0] * 6):
        with pytest.raises(TypeError, match=r"NaN, not None, for a loss that failed"):
            opt.tell(state, asked, unreadable)
    with pytest.raises(TypeError, match="takes the Ask"):
        opt.tell(state, tuple(asked), losses)
    later = opt.tell(state, asked, losses)
    with pytest.raises(ValueError, match="round of update 0, but the state has made 1"):
        opt.tell(later, asked, losses)
    other = opt.init({"x": torch.zeros(2)}, key=fb.random.key(1))
    with pytest.raises(ValueError, match="another state"):
        opt.tell(other, asked, losses)
    scored = fb.with_start_loss(state, 3.0)  # same key and step, another history
    with pytest.raises(ValueError, match="another"):
        opt.tell(scored, asked, losses)
    with pytest.raises(TypeError, match="another optimizer"):
        fb.adaptive_bfo(4, swim_length=1).tell(state, asked, losses)


@variants
def test_tell_refuses_an_ask_made_before_a_hyperparameter_change(variant):
    """A schedule between ask and tell would store the old losses against new candidates."""
    opt = variant.make()
    state = opt.init(params(), key=fb.random.key(0))
    asked = opt.ask(state)
    losses, extra = answer(variant, asked)
    with pytest.raises(ValueError, match="hyperparameter"):
        opt.tell(fb.with_hyperparams(state, step_size=0.37), asked, losses, **extra)
    other = variant.make(step_size=0.37)  # another optimizer: same shape and key
    with pytest.raises(ValueError, match="another state"):
        opt.tell(state, other.ask(other.init(params(), key=fb.random.key(0))), losses, **extra)
    if hasattr(state, "grad_mask"):
        with pytest.raises(ValueError, match="gradient mask"):
            opt.tell(fb.with_grad_mask(state, False), asked, losses, **extra)
    opt.tell(state, asked, losses, **extra)  # the round's own answer is taken


def test_hybrid_tell_needs_gradients_like_the_candidates():
    opt = fb.hybrid_bfo(4, swim_length=1, grad_mask=True)
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(0))
    asked = opt.ask(state)
    losses = torch.zeros(8)
    with pytest.raises(ValueError, match="needs grads="):
        opt.tell(state, asked, losses)
    with pytest.raises(ValueError, match="structure of asked.params"):
        opt.tell(state, asked, losses, grads={"y": torch.zeros(8, 2)})
    with pytest.raises(ValueError, match=r"shape \(4, 2\)"):
        opt.tell(state, asked, losses, grads={"x": torch.zeros(4, 2)})
    told = opt.tell(state, asked, losses, grads={"x": np.ones((8, 2))})
    assert bool(told.grad_known.all())


@pytest.mark.parametrize(("name", "not_update", "not_tell"), [
    ("bfo", "grad", "grads"), ("adaptive_bfo", "grad", "grads"), ("hybrid_bfo", "grads", "grad")])
def test_update_and_tell_refuse_the_keywords_they_do_not_take(name, not_update, not_tell):
    """The variants share update and tell: bfo and adaptive_bfo must not swallow the hybrid's
    grad= and grads=, and the hybrid's update takes grad= only, its tell grads= only."""
    opt = getattr(fb, name)(4, swim_length=1, **({"grad_mask": True} if "hybrid" in name else {}))
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(0))
    with pytest.raises(TypeError, match=rf"{name}.update\(\) got an unexpected keyword "
                                        f"argument '{not_update}'"):
        opt.update(state, lambda p: p["x"].square().sum(), **{not_update: {"x": torch.ones(2)}})
    with pytest.raises(TypeError, match=rf"{name}.tell\(\) got an unexpected keyword "
                                        f"argument '{not_tell}'"):
        opt.tell(state, opt.ask(state), torch.zeros(8), **{not_tell: {"x": torch.ones(8, 2)}})


@variants
def test_ask_and_tell_compile_without_graph_breaks_and_vmap_over_states(variant):
    torch.compiler.reset()
    opt = variant.make()
    state = ask_tell(variant, opt, opt.init(params(), key=fb.random.key(5)), 1)
    # Dynamo and AOTAutograd trace them whole (a graph break raises); Inductor's code for
    # the plan and assembly they share with update is test_contract.py's.
    compiled_ask = torch.compile(opt.ask, fullgraph=True, backend="aot_eager")
    compiled_tell = torch.compile(functools.partial(opt.tell, check=False), fullgraph=True,
                                  backend="aot_eager")
    eager = compiled = state
    for _ in range(3):
        asked = compiled_ask(compiled)
        losses, extra = answer(variant, asked)
        compiled = compiled_tell(compiled, asked, losses, **extra)
        eager = ask_tell(variant, opt, eager, 1)
    torch.testing.assert_close(compiled.best_loss, eager.best_loss, rtol=1e-4, atol=1e-6)
    assert torch.equal(compiled.num_evals, eager.num_evals)

    keys = torch.stack([fb.random.key(0), fb.random.key(1)])
    states = torch.func.vmap(lambda k: opt.init(params(), key=k))(keys)
    asked = torch.func.vmap(opt.ask)(states)
    losses, extra = torch.func.vmap(lambda a: answer(variant, a))(asked)
    batched = torch.func.vmap(lambda s, a, v, e: opt.tell(s, a, v, check=False, **e))(
        states, asked, losses, extra)
    for i, key in enumerate(keys):
        one = ask_tell(variant, opt, opt.init(params(), key=key), 1)
        torch.testing.assert_close(batched.best_loss[i], one.best_loss)


def test_a_save_between_ask_and_tell_resumes_in_a_fresh_process(tmp_path):
    opt = fb.hybrid_bfo(6, grad_mask=True, chemotaxis_steps=2)
    variant = next(v for v in VARIANTS if v.name == "hybrid_bfo")
    state = ask_tell(variant, opt, opt.init(params(), key=fb.random.key(6)), 3)
    asked = opt.ask(state)  # then the process dies before it can tell
    fb.save(state, tmp_path / "state.pt")
    losses, extra = answer(variant, asked)
    expected = ask_tell(variant, opt, opt.tell(state, asked, losses, **extra), 2)
    torch.save(fb._state.to_dict(expected), tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import torch
        import functional_bfo as fb
        from functional_bfo._state import to_dict
        opt = fb.hybrid_bfo(6, grad_mask=True, chemotaxis_steps=2)
        def loss_fn(p):
            return ((p["w"] - 0.5).square().sum() + (p["b"][0] + 0.25).square().sum()
                    + (p["b"][1] - 1.0).square())
        like = opt.init({{"w": torch.zeros(3), "b": (torch.zeros(2, 2), torch.zeros(()))}},
                        key=fb.random.key(0))
        state = fb.load({str(tmp_path / "state.pt")!r}, like)
        for _ in range(3):
            asked = opt.ask(state)
            grads, losses = torch.func.vmap(torch.func.grad_and_value(loss_fn))(asked.params)
            state = opt.tell(state, asked, losses, grads=grads)
        mine, want = to_dict(state), torch.load({str(tmp_path / "expected.pt")!r})
        same = all(torch.equal(a.nan_to_num(), b.nan_to_num())
                   for a, b in zip(mine["leaves"], want["leaves"]))
        print("same" if same else "differs")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "same", out.stderr


@variants
def test_tell_refuses_an_ask_of_another_state_or_optimizer_that_shares_its_key(variant):
    """The round tag covers the whole state and the optimizer's settings: an Ask of a state
    started elsewhere with the same key, of an optimizer with other bounds or tumbles, or of a
    state edited between ask and tell would store foreign losses against this state's rows."""
    opt, key = variant.make(), fb.random.key(0)
    mine = opt.init(params(), key=key)
    elsewhere = opt.init(optree.tree_map(lambda x: x + 3.0, params()), key=key)
    asked = opt.ask(elsewhere)
    losses, extra = answer(variant, asked)
    with pytest.raises(ValueError, match="another state"):
        opt.tell(mine, asked, losses, **extra)
    edited = mine._replace(population=mine.population + 1.0)
    asked = opt.ask(mine)
    losses, extra = answer(variant, asked)
    with pytest.raises(ValueError, match="another state"):
        opt.tell(edited, asked, losses, **extra)
    for settings in (dict(bounds=(-7.0, 7.0)), dict(tumble="levy"), dict(boundary="wrap")):
        if variant.kwargs.get("bounds") == settings.get("bounds", 0) or (
                variant.kwargs.get("tumble") == settings.get("tumble", 0)):
            continue
        other = variant.make(**settings)
        asked = other.ask(other.init(params(), key=key))
        losses, extra = answer(variant, asked)
        with pytest.raises(ValueError, match="another optimizer: one with other settings"):
            opt.tell(mine, asked, losses, **extra)
    chunked = (dict(chunk_size=2) if variant.flags.get("uses_gradients")  # the hybrid's own
               else dict(evaluator=fb.evaluate.vmap(chunk_size=2)))
    for evaluated in (dict(swim_batch=5), chunked):  # how rows are batched or
        twin = variant.make(**evaluated)  # evaluated leaves the round as it is
        asked = twin.ask(twin.init(params(), key=key))
        losses, extra = answer(variant, asked)
        opt.tell(mine, asked, losses, **extra)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_any_flipped_bit_moves_the_digest_and_the_ranks_checksum(dtype):
    """Every bit of every element, sign and exponent too: the tag's digest and the checksum
    the distributed evaluators compare (52 bits, exact in float64) both change."""
    from functional_bfo._ask_tell import BITS, state_digest
    from functional_bfo.distributed import _checksum

    x = torch.linspace(-3.0, 5.0, 4, dtype=torch.float64).to(dtype)
    digest, checksum = state_digest({"x": x}), _checksum({"x": x}, x.device)
    for at in range(4):
        for bit in range(8 * x.element_size()):
            words = x.view(BITS[x.element_size()]).clone()
            words[at] ^= torch.tensor(1, dtype=words.dtype) << bit
            y = {"x": words.view(dtype)}
            assert state_digest(y) != digest and _checksum(y, x.device) != checksum, (at, bit)


@variants
def test_the_twins_ask_is_refused_where_a_cycle_ends_and_taken_elsewhere(variant):
    """The twin skips the cycle events: where a cycle ends its candidates are not the
    optimizer's, so their Asks are not each other's there; elsewhere they are the same."""
    opt = variant.make()
    state = opt.init(params(), key=fb.random.key(0))
    for step in range(opt.period + 1):
        ends = step > 0 and step % opt.period == 0
        for asker, teller in ((opt.twin, opt), (opt, opt.twin)):
            asked = asker.ask(state)
            losses, extra = answer(variant, asked)
            if ends:
                with pytest.raises(ValueError, match="another optimizer"):
                    teller.tell(state, asked, losses, **extra)
            else:
                assert_trees_equal(teller.tell(state, asked, losses, **extra),
                                   asker.tell(state, asked, losses, **extra))
        state = run_updates(opt, state, 1)


@variants
def test_an_ask_of_another_swim_length_is_refused_even_unchecked(variant):
    """Its row count is static: 8 rows told to a 12-row round must not count as 12."""
    opt = variant.make(swim_length=2)
    state = opt.init(params(), key=fb.random.key(0))
    for swims in (1, 3):
        other = variant.make(swim_length=swims)
        asked = other.ask(other.init(params(), key=fb.random.key(0)))
        losses, extra = answer(variant, asked)
        rows = variant.kwargs["population_size"] * 3
        for check in (True, False):
            with pytest.raises(ValueError, match=f"asked has {len(losses)} rows, but this "
                                                 f"state's round has {rows}"):
                opt.tell(state, asked, losses, check=check, **extra)


def test_black_box_tell_refuses_an_ask_of_another_search_that_shares_its_key():
    opt, key = fb.black_box_search((-5.0, 5.0), max_evals=2000), fb.random.key(0)
    mine = opt.init({"x": torch.full((4,), 3.0)}, key=key)
    other = opt.init({"x": torch.full((4,), 1.0)}, key=key)
    asked = opt.ask(other)
    with pytest.raises(ValueError, match="another state"):
        opt.tell(mine, asked, (asked.params["x"] - 1).square().sum(1))
    wider = fb.black_box_search((-6.0, 6.0), max_evals=2000)
    asked = wider.ask(wider.init({"x": torch.full((4,), 3.0)}, key=key))
    with pytest.raises(ValueError, match="another optimizer"):
        opt.tell(mine, asked, (asked.params["x"] - 1).square().sum(1))


def test_vmapped_tell_says_to_pass_check_false():
    opt = fb.bfo(4, swim_length=1)
    states = torch.func.vmap(lambda k: opt.init({"x": torch.zeros(2)}, key=k))(
        torch.stack([fb.random.key(0), fb.random.key(1)]))
    asked = torch.func.vmap(opt.ask)(states)
    with pytest.raises(RuntimeError, match=r"bfo.tell\(check=True\) reads asked.tag .* pass "
                                           "check=False under vmap"):
        torch.func.vmap(opt.tell)(states, asked, torch.zeros(2, 8))
    torch.func.vmap(functools.partial(opt.tell, check=False))(states, asked, torch.zeros(2, 8))
