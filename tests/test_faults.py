"""Nothing is lost or corrupted: checkpoints, interrupted runs, faulty losses, odd pytrees.

Each test injects a fault a user meets (a write killed half way, a file cut short or
tampered with, a loss that raises, Ctrl-C, NaN regions, huge values) and checks that only
documented exceptions come out, with their types kept, and that retrying gives what a run
that never saw the fault gives.
"""

import functools
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import optree
import pytest
import torch
from helpers import assert_trees_equal, population
from hypothesis import given, settings
from hypothesis import strategies as st
from variants import VARIANTS

import functional_bfo as fb

variants = pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
HYP = settings(max_examples=15, deadline=None)
GENERATED = settings(max_examples=40, deadline=None)


def params():
    return {"a": torch.tensor([0.5, -0.3, 1.2]), "b": (torch.full((2, 2), 0.4),)}


def loss_fn(p):
    return p["a"].square().sum() + (p["b"][0] - 0.1).square().sum()


def run_updates(opt, state, n, loss=loss_fn):
    for _ in range(n):
        state = opt.update(state, loss)
    return state


class Boom(Exception):
    """A user's own exception type."""


class FailAt:
    """A loss that raises ``error`` on its ``at``-th call (vmap calls it once per batch)."""

    def __init__(self, at: int, error: BaseException, loss=loss_fn):
        self.calls, self.at, self.error, self.loss = 0, at, error, loss

    def __call__(self, p):
        self.calls += 1
        if self.calls == self.at:
            raise self.error
        return self.loss(p)


# ------------------------------------------------------------------------------ checkpoints


def saved_state(tmp_path):
    opt = fb.adaptive_bfo(population_size=6)
    state = run_updates(opt, opt.init(params(), key=fb.random.key(1)), 2)
    path = tmp_path / "state.pt"
    fb.save(state, path)
    return opt, state, path


def test_a_save_that_fails_half_way_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    opt, state, path = saved_state(tmp_path)
    before = path.read_bytes()
    real_save = torch.save

    def dies_half_way(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.seek(f.tell() // 2)
        f.truncate()
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        fb.save(run_updates(opt, state, 1), path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["state.pt"]  # no scratch file left behind
    assert_trees_equal(fb.load(path, like=state), state)


@pytest.mark.parametrize("edit, match", [
    (lambda s: s._replace(hyperparams=s.hyperparams._replace(
        step_size=torch.tensor(-1.0))), r"hyperparams\.step_size is -1\.0, outside \[0\.0, inf\)"),
    (lambda s: s._replace(population=torch.full_like(s.population, torch.inf)),
     r"state\.population holds NaN or infinite values"),
    (lambda s: s._replace(step_sizes=s.step_sizes.nan_to_num(0.0) * torch.nan),
     r"state\.step_sizes holds NaN"),
    (lambda s: s._replace(num_evals=torch.tensor(-5)), r"state\.num_evals is negative"),
    (lambda s: s._replace(best_loss=torch.tensor(math.nan)), r"state\.best_loss is NaN"),
    (lambda s: s._replace(best_loss=torch.tensor(-math.inf)),
     r"state\.best_loss \(-inf\) is neither the least nor the greatest of the losses"),
    (lambda s: s._replace(active_size=torch.tensor(0)), r"active_size is 0, outside \[1, 6\]"),
    (lambda s: s._replace(active_size=torch.tensor(7)), r"active_size is 7, outside \[1, 6\]"),
    (lambda s: s._replace(step_sizes=-s.step_sizes), r"state\.step_sizes is negative"),
    (lambda s: s._replace(hyperparams=s.hyperparams._replace(
        step_size_min=torch.tensor(2.0), step_size_max=torch.tensor(1.0))),
     r"hyperparams\.step_size_min \(2\.0\) is above its step_size_max \(1\.0\)"),
    (lambda s: s._replace(reference_diversity=torch.tensor(-1.0)),
     r"state\.reference_diversity is negative"),
], ids=["negative step size", "population of infinities", "NaN step sizes", "negative count",
        "NaN best", "minimizing best of -inf", "no bacterium in play", "more in play than exist",
        "negative step sizes", "floor above ceiling", "negative reference diversity"])
def test_a_checkpoint_of_a_state_no_update_makes_is_refused(tmp_path, edit, match):
    """The digest is a checksum, not a signature: an edited state saved (digest and all)
    is refused by its values, as init and with_hyperparams refuse them."""
    _, state, path = saved_state(tmp_path)
    fb.save(edit(state), path)
    with pytest.raises(ValueError, match=match):
        fb.load(path, like=state)


def holed_loss(p):
    """``loss_fn`` with holes: NaN where a[0] > 0.5, +inf where a[1] > -0.3 (about half)."""
    return torch.where(p["a"][0] > 0.5, torch.nan,
                       torch.where(p["a"][1] > -0.3, torch.inf, loss_fn(p)))


@pytest.mark.parametrize("make", [v.make for v in VARIANTS] + [
    lambda: fb.black_box_search((-1.0, 1.0), max_evals=600)],
    ids=[v.name for v in VARIANTS] + ["black box"])
def test_a_state_that_met_non_finite_losses_saves_loads_and_resumes(tmp_path, make):
    """A NaN or infinite loss ranks last: its bacterium's health (its costs summed since the
    last reproduction) is +inf, a value updates make, so the state loads and resumes bitwise."""
    opt = make()
    state = run_updates(opt, opt.init(params(), key=fb.random.key(3)), 3, holed_loss)
    health = state.swarm.health if hasattr(state, "swarm") else state.health
    assert bool(torch.isinf(health).any())
    fb.save(state, tmp_path / "state.pt")
    resumed = fb.load(tmp_path / "state.pt", like=opt.init(params(), key=fb.random.key(0)))
    assert_trees_equal(run_updates(opt, resumed, 3, holed_loss),
                       run_updates(opt, state, 3, holed_loss))


@pytest.mark.parametrize("make", [
    lambda bounds: fb.hybrid_bfo(population_size=4, bounds=bounds, grad_mask=True),
    lambda bounds: fb.black_box_search(bounds, max_evals=100)], ids=["hybrid_bfo", "black box"])
def test_a_checkpoint_written_under_other_bounds_is_refused(tmp_path, make):
    """The box lives in the state; resumed under other bounds it would be kept, silently."""
    state = make((-1.0, 1.0)).init(params(), key=fb.random.key(0))
    fb.save(state, tmp_path / "state.pt")
    assert_trees_equal(fb.load(tmp_path / "state.pt", like=state), state)
    other = make((-2.0, 1.0)).init(params(), key=fb.random.key(0))
    with pytest.raises(ValueError, match=r"state(\.swarm)?\.box differs from like's: .* other "
                                         r"bounds"):
        fb.load(tmp_path / "state.pt", like=other)


def test_a_nan_tumble_metric_or_black_box_entry_best_is_refused(tmp_path):
    learner = fb.adaptive_bfo(4, metric_rate=2.0, bounds=(-1.0, 1.0), relative_steps=True)
    state = learner.init(params(), key=fb.random.key(0))
    fb.save(state._replace(metric=state.metric._replace(cov=state.metric.cov * math.nan)),
            tmp_path / "state.pt")
    with pytest.raises(ValueError, match=r"state\.metric holds NaN"):
        fb.load(tmp_path / "state.pt", like=state)
    search = fb.black_box_search((-1.0, 1.0), max_evals=200)
    state = search.init(params(), key=fb.random.key(0))
    fb.save(state._replace(entry_best=torch.tensor(math.nan, dtype=torch.float64)),
            tmp_path / "state.pt")
    with pytest.raises(ValueError, match=r"state\.entry_best is NaN"):
        fb.load(tmp_path / "state.pt", like=state)


@pytest.mark.parametrize("make", [
    lambda maximize: fb.bfo(population_size=4, maximize=maximize),
    lambda maximize: fb.adaptive_bfo(population_size=4, maximize=maximize),
    lambda maximize: fb.black_box_search((-1.0, 1.0), max_evals=400, maximize=maximize)],
    ids=["bfo", "adaptive_bfo", "black box"])
def test_a_checkpoint_loads_only_into_an_optimizer_of_its_direction(tmp_path, make):
    """A minimizing run's best resumed as a maximizing one would never be beaten (or the
    resumed run would end at best_loss = inf): fresh or far along, it is refused."""
    minimizing, maximizing = make(False), make(True)
    fresh = minimizing.init(params(), key=fb.random.key(0))
    along = fb.run(minimizing, fresh, lambda p: p["a"].square().sum() + 2.0, max_steps=6)
    like = maximizing.init(params(), key=fb.random.key(0))
    for state in (fresh, along):
        fb.save(state, tmp_path / "state.pt")
        assert_trees_equal(fb.load(tmp_path / "state.pt", like=fresh), state)
        with pytest.raises(ValueError, match="written by a minimizing optimizer, but like is a "
                                             "maximizing one's state"):
            fb.load(tmp_path / "state.pt", like=like)
    fb.save(like, tmp_path / "state.pt")
    with pytest.raises(ValueError, match="written by a maximizing optimizer"):
        fb.load(tmp_path / "state.pt", like=fresh)


@pytest.mark.parametrize("factory", [fb.bfo, fb.adaptive_bfo], ids=["bfo", "adaptive_bfo"])
def test_a_batch_of_runs_loads_only_into_an_optimizer_of_its_direction(tmp_path, factory):
    """Runs vmapped over keys: each run's best says its direction, as one run's does."""
    minimizing, maximizing = factory(4), factory(4, maximize=True)
    keys = fb.random.split(fb.random.key(0), 3)
    init = torch.func.vmap(lambda k, opt: opt.init(params(), key=k), in_dims=(0, None))
    update = torch.func.vmap(minimizing.update, in_dims=(0, None))
    runs = update(update(init(keys, minimizing), loss_fn), loss_fn)
    fb.save(runs, tmp_path / "state.pt")
    assert_trees_equal(fb.load(tmp_path / "state.pt", like=init(keys, minimizing)), runs)
    with pytest.raises(ValueError, match="written by a minimizing optimizer"):
        fb.load(tmp_path / "state.pt", like=init(keys, maximizing))


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_a_save_keeps_the_files_mode_and_a_new_file_gets_the_umasks(tmp_path):
    """As open() would: a new checkpoint readable as the umask allows, a replaced one as it
    was (the scratch file it is renamed from must not carry mkstemp's 0600)."""
    umask = os.umask(0o022)
    os.umask(umask)
    _, state, path = saved_state(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    path.chmod(0o640)
    fb.save(state, path)
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_checkpoint_written_on_a_gpu_loads_where_like_lives(tmp_path, monkeypatch):
    """Its storages are tagged cuda; by default they load onto like's device, which a
    machine without a GPU can do (torch.load alone refuses)."""
    _, state, path = saved_state(tmp_path)
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    fb.save(state, path)
    monkeypatch.undo()
    assert_trees_equal(fb.load(path, like=state), state)


def test_a_good_save_removes_what_killed_saves_left_and_nothing_else(tmp_path):
    """A job killed mid-save every hour must not fill its disk with full-size scratch."""
    opt, state, path = saved_state(tmp_path)
    killed = [tmp_path / ".state.pt.k1ll3d_1.tmp", tmp_path / ".state.pt.k1ll3d_2.tmp"]
    others = [tmp_path / ".state.pt.b.abcdefgh.tmp", tmp_path / "notes.tmp",
              tmp_path / ".other.pt.abcdefgh.tmp"]  # another checkpoint's, or the user's
    for leftover in killed + others:
        leftover.write_bytes(path.read_bytes())
        os.utime(leftover, (time.time() - 60, time.time() - 60))
    fb.save(run_updates(opt, state, 1), path)
    assert sorted(os.listdir(tmp_path)) == sorted(["state.pt"] + [p.name for p in others])


def _slow_first_fsync():
    """A slow disk: the first write of this process waits 0.3 s before its rename, while
    other writers start and finish (the rest fsync as usual)."""
    fsync, calls = os.fsync, []

    def slow(fd):
        if not calls:
            calls.append(fd)
            time.sleep(0.3)
        fsync(fd)
    os.fsync = slow


def _save_often(path, seed, times, slow=False):
    """A run checkpointing to ``path`` ``times`` times (a thread's or a process's)."""
    if slow:
        _slow_first_fsync()
    opt = fb.bfo(population_size=64)
    state = opt.init({"w": torch.zeros(8192)}, key=fb.random.key(seed))  # a 2 MB state
    for _ in range(times):
        fb.save(state, path)
    return state


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_saves_racing_to_one_path_all_succeed_and_leave_no_scratch(tmp_path, workers,
                                                                   monkeypatch):
    """Two runs checkpointing to one file: a save must not remove the other's scratch file
    mid-write as a killed write's leftover. The last rename wins; nothing else is left."""
    path = tmp_path / "state.pt"
    monkeypatch.setattr(os, "fsync", os.fsync)  # restored after the threads' slow disk
    if workers == "threads":
        _slow_first_fsync()
        pool = ThreadPoolExecutor(3)
    else:  # spawned: torch forks badly; the first process has the slow disk
        pool = ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn"))
    with pool:
        states = list(pool.map(_save_often, [path] * 3, range(3), [10] * 3,
                               [workers == "processes", False, False]))
    assert sorted(os.listdir(tmp_path)) == ["state.pt"]
    loaded = fb.load(path, like=states[0])
    assert any(torch.equal(loaded.population, s.population) for s in states)


def test_a_save_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    opt, state, target = saved_state(tmp_path)
    link = tmp_path / "latest.pt"
    link.symlink_to(target.name)
    later = run_updates(opt, state, 1)
    fb.save(later, link)
    assert link.is_symlink() and os.readlink(link) == target.name
    assert_trees_equal(fb.load(target, like=state), later)
    assert sorted(os.listdir(tmp_path)) == ["latest.pt", "state.pt"]


@HYP
@given(cut=st.floats(0.0, 0.9999))
def test_a_file_cut_short_anywhere_raises_value_error(tmp_path_factory, cut):
    tmp_path = tmp_path_factory.mktemp("cut")
    _, state, path = saved_state(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: int(cut * len(data))])
    with pytest.raises(ValueError, match="checkpoint"):
        fb.load(path, like=state)


@HYP
@given(where=st.floats(0.0, 0.9999), bit=st.integers(0, 7))
def test_a_flipped_bit_anywhere_never_loads_silently(tmp_path_factory, where, bit):
    """Either the file still reads as the same state (a bit in zip padding or metadata
    that does not matter), or load raises ValueError: never a different state."""
    tmp_path = tmp_path_factory.mktemp("flip")
    _, state, path = saved_state(tmp_path)
    data = bytearray(path.read_bytes())
    data[int(where * len(data))] ^= 1 << bit
    path.write_bytes(bytes(data))
    try:
        loaded = fb.load(path, like=state)
    except ValueError:
        return
    assert_trees_equal(loaded, state)


def test_tensor_bytes_changed_in_the_file_are_refused(tmp_path):
    _, state, path = saved_state(tmp_path)
    data = torch.load(path, weights_only=True)
    data["leaves"][1] = data["leaves"][1] + 1  # the losses, edited after saving
    torch.save(data, path)
    with pytest.raises(ValueError, match="do not match its digest"):
        fb.load(path, like=state)


@pytest.mark.parametrize("content", [
    b"", b"not a checkpoint at all", b"PK\x03\x04garbage",
], ids=["empty", "text", "zip-header"])
def test_foreign_bytes_raise_value_error(tmp_path, content):
    _, state, path = saved_state(tmp_path)
    path.write_bytes(content)
    with pytest.raises(ValueError, match="checkpoint"):
        fb.load(path, like=state)


@pytest.mark.parametrize("obj", [
    {"format": "functional_bfo.state/1"}, {"leaves": [torch.zeros(2)]}, [1, 2, 3],
    {"format": "functional_bfo.state/1", "type": "BFOState", "paths": "x", "leaves": [],
     "digest": "0"},
], ids=["format-only", "no-format", "list", "wrong-field-types"])
def test_foreign_torch_files_raise_value_error(tmp_path, obj):
    _, state, path = saved_state(tmp_path)
    torch.save(obj, path)
    with pytest.raises(ValueError, match="checkpoint"):
        fb.load(path, like=state)


def test_a_missing_file_is_not_a_corrupt_one(tmp_path):
    _, state, _ = saved_state(tmp_path)
    with pytest.raises(FileNotFoundError):
        fb.load(tmp_path / "nowhere.pt", like=state)


# ------------------------------------------------------------------------------ runs


@pytest.mark.parametrize("error", [Boom("the simulator crashed"), KeyboardInterrupt(),
                                   torch.OutOfMemoryError("out of memory")],
                         ids=["user-exception", "ctrl-c", "out-of-memory"])
def test_run_hands_back_the_last_good_state_when_interrupted(error, tmp_path):
    opt = fb.bfo(population_size=4, swim_length=1)  # 2 vmapped loss calls per update
    start = opt.init(params(), key=fb.random.key(2))
    path = tmp_path / "run.pt"
    with pytest.raises(type(error)) as info:
        fb.run(opt, start, FailAt(2 * 3 + 2, error), max_steps=10, checkpoint=path,
               checkpoint_every=2)
    assert type(info.value) is type(error)  # the type is kept
    assert any("last_good_state" in note for note in info.value.__notes__)
    three = run_updates(opt, start, 3)  # three updates finished before the fault
    assert_trees_equal(info.value.last_good_state, three)
    assert_trees_equal(fb.load(path, like=start), three)
    resumed = fb.run(opt, fb.load(path, like=start), loss_fn, max_steps=2)
    assert_trees_equal(resumed, run_updates(opt, start, 5))


def test_a_checkpoint_that_cannot_be_written_keeps_the_users_exception(tmp_path):
    folder = tmp_path / "gone"
    folder.mkdir()
    calls = []

    def loss(p):  # 2 calls per update: the folder vanishes in the second, then it raises
        calls.append(1)
        if len(calls) == 4:
            folder.rmdir()
        if len(calls) == 5:
            raise Boom("the simulator crashed")
        return loss_fn(p)
    opt = fb.bfo(population_size=4, swim_length=1)
    start = opt.init(params(), key=fb.random.key(2))
    with pytest.raises(Boom) as info:
        fb.run(opt, start, loss, max_steps=5, checkpoint=folder / "run.pt")
    assert_trees_equal(info.value.last_good_state, run_updates(opt, start, 2))
    assert any("failed" in note and "last_good_state" in note for note in info.value.__notes__)


def test_run_checks_the_checkpoint_folder_before_the_first_update(tmp_path):
    opt = fb.bfo(population_size=4, swim_length=1)
    start = opt.init(params(), key=fb.random.key(2))
    with pytest.raises(ValueError, match=r"does not exist\. Create it first"):
        fb.run(opt, start, FailAt(1, Boom("never reached")), max_steps=5,
               checkpoint=tmp_path / "missing" / "run.pt")


def test_a_budget_smaller_than_one_update_warns():
    opt = fb.bfo(population_size=10, swim_length=1)  # 20 evaluations per update
    with pytest.warns(RuntimeWarning, match=r"one update costs 20 evaluations, more than "
                                            r"max_evals=5 left room for, so the run spent 20"):
        state = fb.run(opt, opt.init(params(), key=fb.random.key(2)), loss_fn, max_evals=5)
    assert int(state.num_evals) == 20


@pytest.mark.parametrize("max_evals", [40, 44], ids=["spent", "less than an update left"])
def test_a_run_resumed_at_its_budget_makes_no_update(max_evals):
    opt = fb.bfo(population_size=4, swim_length=1)  # 8 evaluations per update
    done = fb.run(opt, opt.init(params(), key=fb.random.key(2)), loss_fn, max_evals=max_evals)
    assert int(done.num_evals) == 40
    again = fb.run(opt, done, loss_fn, max_evals=max_evals)  # no update, so no warning
    assert_trees_equal(again, done)


def test_a_run_resumed_at_its_target_makes_no_update():
    opt = fb.bfo(population_size=4, swim_length=1)
    done = fb.run(opt, opt.init(params(), key=fb.random.key(2)), loss_fn, max_evals=4000,
                  target_loss=0.5)
    assert float(done.best_loss) <= 0.5 and int(done.num_evals) < 4000
    assert_trees_equal(fb.run(opt, done, loss_fn, max_evals=4000, target_loss=0.5), done)


def test_run_checkpoints_periodically_and_at_the_end(tmp_path):
    opt = fb.adaptive_bfo(population_size=4)
    start = opt.init(params(), key=fb.random.key(3))
    path = tmp_path / "run.pt"
    seen = []
    real_save = fb._state.save

    def counting_save(state, f):
        seen.append(int(state.step))
        real_save(state, f)

    import functional_bfo._run as run_module
    original = run_module.save
    run_module.save = counting_save
    try:
        final = fb.run(opt, start, loss_fn, max_steps=7, checkpoint=path, checkpoint_every=3)
        assert seen == [3, 6, 7]
        assert_trees_equal(fb.load(path, like=start), final)
        seen.clear()
        fb.run(opt, start, loss_fn, max_steps=6, checkpoint=path, checkpoint_every=3)
        assert seen == [3, 6]  # the last state is on disk already: not written twice
    finally:
        run_module.save = original


def test_run_stops_and_warns_when_every_loss_is_non_finite():
    opt = fb.bfo(population_size=4, swim_length=1)
    state = opt.init(params(), key=fb.random.key(4))
    reports = []
    with pytest.warns(RuntimeWarning, match="NaN or infinite"):
        fb.run(opt, state, lambda p: loss_fn(p) * torch.nan, max_steps=50,
               progress=reports.append)
    assert reports[-1]["stopped"] == "non_finite" and reports[-1]["updates"] == 1


def test_run_reads_maximize_from_the_optimizer():
    """target_loss=-0.5 on a maximized loss below it must not stop the run at once."""
    opt = fb.bfo(population_size=6, maximize=True, step_size=0.2)
    state = opt.init({"x": torch.full((2,), 2.0)}, key=fb.random.key(5))
    reports = []
    fb.run(opt, state, lambda p: -(p["x"].square().sum()), max_steps=200, target_loss=-0.5,
           progress=reports.append)
    assert reports[-1]["stopped"] == "target_loss" and reports[-1]["updates"] > 1
    assert reports[-1]["best_loss"] >= -0.5


# ------------------------------------------------------------------------------ updates


@variants
def test_a_loss_that_raises_keeps_its_type_and_a_retry_equals_an_unfaulted_run(variant):
    opt = variant.make()
    state = run_updates(opt, opt.init(params(), key=fb.random.key(6)), 2)
    for error in (Boom("no"), RuntimeError("my own runtime error"), KeyboardInterrupt()):
        with pytest.raises(type(error)) as info:
            opt.update(state, FailAt(3, error))
        assert type(info.value) is type(error)
        assert not getattr(info.value, "__notes__", [])  # vmap is not the cause: no advice
    assert_trees_equal(opt.update(state, loss_fn), run_updates(opt, state, 1))


@variants
def test_the_state_never_holds_an_autograd_graph(variant):
    """A loss touching a tensor outside params that requires grad (a model's other weights)."""
    weight = torch.tensor(2.0, requires_grad=True)
    opt = variant.make()
    state = opt.init(params(), key=fb.random.key(7))
    for _ in range(3):
        state = opt.update(state, lambda p: weight * loss_fn(p))
    for leaf in optree.tree_leaves(state):
        assert not leaf.requires_grad and leaf.grad_fn is None


@variants
def test_non_finite_start_params_are_refused(variant):
    opt = variant.make()
    bad = {"a": torch.tensor([0.0, math.nan, 1.0]), "b": (torch.zeros(2, 2),)}
    with pytest.raises(ValueError, match=r"params\['a'\] holds NaN or infinite values"):
        opt.init(bad, key=fb.random.key(0))


@pytest.mark.parametrize("factory", [fb.bfo, fb.adaptive_bfo,
                                     functools.partial(fb.hybrid_bfo, grad_mask=True)],
                         ids=["bfo", "adaptive_bfo", "hybrid_bfo"])
def test_a_hyperparameter_that_overflows_the_state_dtype_is_refused(factory):
    kwargs = {"step_size_max": 1e300} if factory is not fb.bfo else {"step_size": 1e300}
    opt = factory(population_size=4, **kwargs)
    with pytest.raises(ValueError, match=r"1e\+300 overflows torch\.float32"):
        opt.init(params(), key=fb.random.key(0))
    opt.init(optree.tree_map(lambda x: x.double(), params()), key=fb.random.key(0))  # fits


@variants
def test_params_whose_sum_overflows_start_a_clean_state(variant):
    """Finite params of huge magnitude (their sum is inf in float32): init's counters and
    hyperparameters are what small params get, not a NaN cast to an integer."""
    opt = variant.make(bounds=None) if "bounds" in variant.kwargs else variant.make()
    huge, small = ({"w": torch.full((64,), v)} for v in (1e37, 1.0))
    got, want = (opt.init(p, key=fb.random.key(0)) for p in (huge, small))
    assert int(got.step) == int(got.num_evals) == 0
    assert_trees_equal(got.hyperparams, want.hyperparams)


def test_a_none_leaf_is_named():
    with pytest.raises(TypeError, match=r"got None at params\['b'\]"):
        fb.bfo(population_size=4).init({"a": torch.zeros(2), "b": None}, key=fb.random.key(0))


@pytest.mark.parametrize("make, other", [
    (lambda: fb.bfo(population_size=4), lambda: fb.adaptive_bfo(population_size=4)),
    (lambda: fb.adaptive_bfo(population_size=4),
     lambda: fb.hybrid_bfo(population_size=4, grad_mask=True)),
    (lambda: fb.hybrid_bfo(population_size=4, grad_mask=True),
     lambda: fb.bfo(population_size=4)),
], ids=["adaptive-state-to-bfo", "hybrid-state-to-adaptive", "bfo-state-to-hybrid"])
def test_a_state_of_another_variant_is_named(make, other):
    state = other().init(params(), key=fb.random.key(0))
    with pytest.raises(TypeError, match=r"update got a \w+State, the state of another optimizer"):
        make().update(state, loss_fn)


def test_a_population_too_large_to_allocate_says_how_large():
    opt = fb.bfo(population_size=2**40)
    with pytest.raises(RuntimeError) as info:
        opt.init({"x": torch.zeros(1000)}, key=fb.random.key(0))
    assert any("lower population_size" in note for note in info.value.__notes__)


# ------------------------------------------------------------------ generated fault injection


def pytrees():
    """Small params pytrees: dicts, lists, tuples, nested; every floating dtype."""
    shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
    dtypes = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16])
    leaves = st.builds(lambda shape, dtype, fill: torch.full(shape, fill, dtype=dtype),
                       shapes, dtypes, st.floats(-2, 2))
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3),
        st.lists(inner, min_size=1, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abc"), inner, min_size=1, max_size=3)),
        max_leaves=4)


def adversarial(kind: str, scale: float):
    """A loss that is NaN or infinite on half the space, or huge everywhere."""
    def loss(p):
        total = sum(x.double().square().sum() for x in optree.tree_leaves(p))
        first = optree.tree_leaves(p)[0].reshape(-1)[0].double()
        if kind == "nan_region":
            return torch.where(first > 0, torch.nan, total)
        if kind == "inf_region":
            return torch.where(first > 0, torch.inf, total)
        return total * scale

    return loss


@GENERATED
@given(tree=pytrees(), variant=st.sampled_from(VARIANTS),
       kind=st.sampled_from(["nan_region", "inf_region", "huge"]),
       scale=st.sampled_from([1.0, 1e30, 1e300]), fail_at=st.integers(1, 5),
       error=st.sampled_from([Boom, KeyboardInterrupt]), seed=st.integers(0, 2**31 - 1))
def test_generated_faults_only_raise_what_was_injected_and_never_corrupt(tree, variant, kind,
                                                                         scale, fail_at, error,
                                                                         seed):
    opt = variant.make()
    state = opt.init(tree, key=fb.random.key(seed))
    loss = adversarial(kind, scale)
    clean = run_updates(opt, state, 3, loss)
    # The same run with the loss raising at one of the third update's five evaluator calls:
    # retried, it ends where the clean run does.
    state2 = run_updates(opt, state, 2, loss)
    with pytest.raises(error):
        opt.update(state2, FailAt(fail_at, error(), loss))
    retried = opt.update(state2, loss)
    assert_trees_equal(retried, clean)
    # No corrupted state: positions finite, best never NaN, counters exact.
    for leaf in optree.tree_leaves(population(clean)):
        assert bool(torch.isfinite(leaf).all())
    assert not bool(torch.isnan(clean.best_loss))
    assert int(clean.step) == 3


def test_hybrid_names_a_wrong_loss_shape_and_a_loss_vmap_cannot_batch():
    opt = fb.hybrid_bfo(population_size=4, grad_mask=True)
    state = opt.init(params(), key=fb.random.key(0))
    with pytest.raises(ValueError, match=r"one floating scalar .* shape \(3,\)"):
        opt.update(state, lambda p: p["a"].square())
    with pytest.raises(RuntimeError) as info:
        opt.update(state, lambda p: loss_fn(p) * loss_fn(p).item())
    assert any("evaluate.loop()" in note for note in info.value.__notes__)
