"""Every bad input gets a clear error, raised before anything is computed or corrupted.

One table drives the test: ``(id, callable, exception type, regex on the message)``. Rows
marked ``xfail`` document inputs the library accepts, or rejects with an unclear message,
as the test thinks they should be handled.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import optree
import pytest
import torch
from helpers import assert_trees_equal, clone

import functional_bfo as fb

KEY = fb.random.key(0)


def params():
    return {"w": torch.zeros(3), "b": (torch.zeros(2, 2), torch.zeros(()))}


def loss_fn(p):
    return (p["w"] - 0.5).square().sum() + (p["b"][0] + 0.25).square().sum() + p["b"][1].square()


def opt(**kwargs):
    return fb.bfo(**{"population_size": 4, "swim_length": 1, **kwargs})


def state(**kwargs):
    return opt(**kwargs).init(params(), key=KEY)



def update(loss, **kwargs):
    """A thunk: one update of a fresh state of ``opt(**kwargs)`` with ``loss``."""
    return lambda: opt(**kwargs).update(state(**kwargs), loss)


def checkpoint(obj=None, raw: bytes | None = None) -> io.BytesIO:
    """A file holding ``torch.save(obj)`` (or the bytes ``raw``), rewound."""
    f = io.BytesIO()
    if raw is not None:
        f.write(raw)
    else:
        torch.save(obj, f)
    f.seek(0)
    return f


def saved_state(**kwargs) -> io.BytesIO:
    f = io.BytesIO()
    fb.save(state(**kwargs), f)
    f.seek(0)
    return f


def item_loss(p):
    return loss_fn(p) * p["w"].sum().item()


def branching_loss(p):
    return loss_fn(p) if p["w"].sum() > 0 else -loss_fn(p)


def batched_states():
    return torch.func.vmap(lambda k: opt().init(params(), key=k))(fb.random.split(KEY, 3))


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[], object]
    exc: type[BaseException] | tuple[type[BaseException], ...]
    match: str
    xfail: str | None = None  # why the library fails this row today
    fails_with: type[BaseException] | tuple | None = None  # how it fails today (narrows xfail)


ANY_INT = r"expected an int >= {}"
FLOAT_RANGE = r"expected a finite float in "
BOUNDS_FORM = r"bounds must be None, a \(low, high\) pair"
LOSS_SCALAR = r"loss_fn must return one floating scalar \(a 0-d tensor\) per set of parameters"
# pytest.raises reports a message mismatch as AssertionError and "DID NOT RAISE" as Failed.
MISMATCH = AssertionError
NOT_RAISED = pytest.fail.Exception

TABLE = [
    # ---- fb.bfo hyperparameters -------------------------------------------------------------
    Case("population_size=0", lambda: fb.bfo(population_size=0), ValueError,
         r"Invalid population_size: 0; " + ANY_INT.format(1)),
    Case("population_size=1.5", lambda: fb.bfo(population_size=1.5), ValueError,
         r"Invalid population_size: 1\.5; " + ANY_INT.format(1)),
    Case("population_size=True", lambda: fb.bfo(population_size=True), ValueError,
         r"Invalid population_size: True \(a bool, not a number\); " + ANY_INT.format(1)),
    Case("step_size=-1", lambda: fb.bfo(step_size=-1), ValueError,
         r"Invalid step_size: -1\.0; " + FLOAT_RANGE),
    Case("step_size=nan", lambda: fb.bfo(step_size=math.nan), ValueError,
         r"Invalid step_size: nan; " + FLOAT_RANGE),
    Case("step_size=inf", lambda: fb.bfo(step_size=math.inf), ValueError,
         r"Invalid step_size: inf; " + FLOAT_RANGE),
    Case("step_size=inf does not claim inf is allowed", lambda: fb.bfo(step_size=math.inf),
         ValueError, r"Invalid step_size: inf; expected a finite float in \[0\.0, inf\)"),
    Case("step_size='0.1'", lambda: fb.bfo(step_size="0.1"), ValueError,
         r"Invalid step_size: '0\.1' \(a str, not a number\); " + FLOAT_RANGE),
    Case("swim_length=-1", lambda: fb.bfo(swim_length=-1), ValueError,
         r"Invalid swim_length: -1; " + ANY_INT.format(0)),
    Case("swim_batch=0", lambda: fb.bfo(swim_batch=0), ValueError,
         r"Invalid swim_batch: 0; " + ANY_INT.format(1)),
    Case("adaptive swim_batch=None", lambda: fb.adaptive_bfo(swim_batch=None), ValueError,
         r"Invalid swim_batch: None; " + ANY_INT.format(1)),
    Case("chemotaxis_steps=0", lambda: fb.bfo(chemotaxis_steps=0), ValueError,
         r"Invalid chemotaxis_steps: 0; " + ANY_INT.format(1)),
    Case("reproduction_steps=0", lambda: fb.bfo(reproduction_steps=0), ValueError,
         r"Invalid reproduction_steps: 0; " + ANY_INT.format(1)),
    Case("elimination_prob=1.5", lambda: fb.bfo(elimination_prob=1.5), ValueError,
         r"Invalid elimination_prob: 1\.5; " + FLOAT_RANGE + r"\[0\.0, 1\.0\]"),
    Case("elimination_prob=-0.1", lambda: fb.bfo(elimination_prob=-0.1), ValueError,
         r"Invalid elimination_prob: -0\.1; " + FLOAT_RANGE + r"\[0\.0, 1\.0\]"),
    Case("levy_beta=0", lambda: fb.bfo(levy_beta=0), ValueError,
         r"Invalid levy_beta: 0\.0; " + FLOAT_RANGE + r"\(0\.0, "),
    Case("levy_beta=2.5", lambda: fb.bfo(levy_beta=2.5), ValueError,
         r"Invalid levy_beta: 2\.5; " + FLOAT_RANGE),
    Case("init_scale=0", lambda: fb.bfo(init_scale=0), ValueError,
         r"Invalid init_scale: 0\.0; " + FLOAT_RANGE + r"\(0\.0, "),
    Case("d_attract=-1", lambda: fb.bfo(d_attract=-1), ValueError,
         r"Invalid d_attract: -1\.0; " + FLOAT_RANGE + r"\[0\.0, "),
    Case("tumble=cauchy", lambda: fb.bfo(tumble="cauchy"), ValueError,
         r"Invalid tumble: 'cauchy'; expected one of gaussian, levy"),
    Case("boundary=bounce", lambda: fb.bfo(boundary="bounce"), ValueError,
         r"Invalid boundary: 'bounce'; expected one of clip, reflect, wrap"),
    Case("swarming=yes", lambda: fb.bfo(swarming="yes"), ValueError,
         r"Invalid swarming: 'yes'; expected True or False"),
    Case("maximize=1", lambda: fb.bfo(maximize=1), ValueError,
         r"Invalid maximize: 1; expected True or False"),
    Case("relative_steps=1", lambda: fb.adaptive_bfo(relative_steps=1), ValueError,
         r"Invalid relative_steps: 1; expected True or False"),
    Case("evaluator=3", lambda: fb.bfo(evaluator=3), TypeError,
         r"Invalid evaluator: 3; expected a callable evaluator\(loss_fn, population, \*args\) "
         r"-> losses, such as functional_bfo\.evaluate\.vmap\(chunk_size=64\)"),
    Case("evaluator=evaluate.vmap (the factory)", lambda: fb.bfo(evaluator=fb.evaluate.vmap),
         TypeError, r"Invalid evaluator: vmap takes fewer than the two positional arguments of "
         r"evaluator\(loss_fn, population, \*args\) -> losses\. If it makes evaluators, "
         r"call it: evaluator=vmap\(\)"),
    Case("evaluator=distributed.sharded (the factory)",
         lambda: fb.adaptive_bfo(evaluator=fb.distributed.sharded), TypeError,
         r"call it: evaluator=sharded\(\)"),
    Case("hybrid evaluator=distributed.data_parallel (the factory)",
         lambda: fb.hybrid_bfo(evaluator=fb.distributed.data_parallel), TypeError,
         r"positional arguments of evaluator\(loss_fn, population, \*args\) -> "
         r"\(losses, grads\)"),
    Case("hybrid integer loss",
         lambda: fb.hybrid_bfo(population_size=4, grad_mask=True).update(
             fb.hybrid_bfo(population_size=4, grad_mask=True).init(params(), key=KEY),
             lambda p: (p["w"].sum() > 0).long()), TypeError, r"got dtype torch\.int64"),
    Case("chunk_size=0", lambda: fb.evaluate.vmap(chunk_size=0), ValueError,
         r"Invalid chunk_size: 0; " + ANY_INT.format(1)),
    Case("chunk_size=1.5", lambda: fb.evaluate.vmap(chunk_size=1.5), ValueError,
         r"Invalid chunk_size: 1\.5; " + ANY_INT.format(1)),
    # ---- bounds (checked in the factory) ----------------------------------------------------
    Case("bounds=(1,0)", lambda: fb.bfo(bounds=(1.0, 0.0)), ValueError,
         r"Invalid bounds.*\(1\.0, 0\.0\); expected low < high everywhere "
         r"\(use -inf/inf for an open side\)"),
    Case("bounds=(1,0) message reads 'Invalid bounds: '", lambda: fb.bfo(bounds=(1.0, 0.0)),
         ValueError, r"^Invalid bounds: \(1\.0, 0\.0\)"),
    Case("bounds=(1,1)", lambda: fb.bfo(bounds=(1.0, 1.0)), ValueError, r"low < high"),
    Case("bounds of bool tensors (read as 0 and 1)",
         lambda: fb.bfo(bounds=(torch.tensor(False), torch.tensor([True, True]))), ValueError,
         r"not bool or complex tensors \(a mask is no box\)"),
    Case("bounds=(0,nan)", lambda: fb.bfo(bounds=(0, math.nan)), ValueError,
         r"Invalid bounds.*\(0, nan\); expected low < high"),
    Case("bounds=(inf,inf)", lambda: fb.bfo(bounds=(math.inf, math.inf)), ValueError,
         r"low < high"),
    Case("bounds=tensor pair, one low >= high",
         lambda: fb.bfo(bounds=(torch.zeros(2), torch.tensor([1.0, -1.0]))), ValueError,
         r"expected low < high everywhere"),
    Case("bounds='abc'", lambda: fb.bfo(bounds="abc"), ValueError,
         r"Invalid bounds.*'abc'; " + BOUNDS_FORM),
    Case("bounds=5.0", lambda: fb.bfo(bounds=5.0), ValueError,
         r"Invalid bounds.*5\.0; " + BOUNDS_FORM),
    Case("bounds=(1,2,3)", lambda: fb.bfo(bounds=(1, 2, 3)), ValueError, BOUNDS_FORM),
    Case("bounds=(1,2,3) message shows the bounds given", lambda: fb.bfo(bounds=(1, 2, 3)),
         ValueError, r"Invalid bounds.*\(1, 2, 3\)"),
    Case("bounds={}", lambda: fb.bfo(bounds={}), ValueError,
         r"Invalid bounds: \{\}; " + BOUNDS_FORM),
    Case("bounds={'x': (1,0)}", lambda: fb.bfo(bounds={"x": (1.0, 0.0)}), ValueError,
         r"Invalid bounds entry: \(1\.0, 0\.0\); expected low < high"),
    Case("bounds={'x': 3}", lambda: fb.bfo(bounds={"x": 3}), ValueError,
         r"Invalid bounds entry: 3; " + BOUNDS_FORM),
    Case("bounds=(None, 1.0)", lambda: fb.bfo(bounds=(None, 1.0)), (TypeError, ValueError),
         r"Invalid bounds.*\(None, 1\.0\).*(-inf|number)"),
    Case("bounds=('a','b')", lambda: fb.bfo(bounds=("a", "b")), (TypeError, ValueError),
         r"Invalid bounds.*\('a', 'b'\)"),
    # ---- init -------------------------------------------------------------------------------
    Case("init({})", lambda: opt().init({}, key=KEY), ValueError,
         r"params is an empty pytree; BFO needs at least one floating tensor leaf"),
    Case("init([])", lambda: opt().init([], key=KEY), ValueError, r"params is an empty pytree"),
    Case("init(python float leaf)",
         lambda: opt().init({"a": torch.zeros(2), "b": (torch.zeros(1), 1.5)}, key=KEY),
         TypeError,
         r"Expected a tensor leaf, got 1\.5 at params\['b'\]\[1\]; convert it with "
         r"torch\.as_tensor"),
    Case("init(numpy leaf)",
         lambda: opt().init({"a": torch.zeros(2), "b": (torch.zeros(1), np.zeros(2))}, key=KEY),
         TypeError, r"Expected a tensor leaf, got array\(.*\) at params\['b'\]\[1\]"),
    Case("init(int leaf)",
         lambda: opt().init({"a": torch.zeros(2), "n": torch.zeros(2, dtype=torch.int64)},
                            key=KEY),
         TypeError, r"Expected a floating tensor leaf, got dtype torch\.int64 at params\['n'\]; "
                    r".*cast it with \.float\(\) or keep it out of params"),
    Case("init(bool leaf)", lambda: opt().init([torch.zeros(2, dtype=torch.bool)], key=KEY),
         TypeError, r"floating tensor leaf, got dtype torch\.bool at params\[0\]"),
    Case("init(mixed devices, meta first)",
         lambda: opt().init({"a": torch.zeros(2, device="meta"), "b": torch.zeros(2)}, key=KEY),
         ValueError, r"params leaves are on different devices \(params\['a'\] on meta, "
                     r"params\['b'\] on cpu\); move them to one device"),
    Case("init(mixed devices, cpu first)",
         lambda: opt().init([torch.zeros(2), torch.zeros(2, device="meta")], key=KEY),
         ValueError, r"different devices \(params\[0\] on cpu, params\[1\] on meta\)"),
    Case("init(key float)", lambda: opt().init(params(), key=torch.zeros(2)), TypeError,
         r"Expected a key \(int64 tensor of shape \(2,\)\), got torch\.float32 tensor of shape "
         r"\(2,\); make one with functional_bfo\.random\.key\(seed\)"),
    Case("init(key (3,))", lambda: opt().init(params(), key=torch.zeros(3, dtype=torch.int64)),
         TypeError, r"Expected a key .*got torch\.int64 tensor of shape \(3,\)"),
    Case("init(key batch (4,2))", lambda: opt().init(params(), key=fb.random.split(KEY, 4)),
         TypeError, r"Expected a key .*got torch\.int64 tensor of shape \(4, 2\)"),
    Case("init(key int)", lambda: opt().init(params(), key=0), TypeError,
         r"Expected a key .*got 0; make one with functional_bfo\.random\.key\(seed\)"),
    Case("init(bounds pytree, wrong keys)",
         lambda: opt(bounds={"w": (0.0, 1.0), "c": (0.0, 1.0)}).init(params(), key=KEY),
         ValueError, r"bounds does not match the structure of params: .*'c'.*" + BOUNDS_FORM),
    Case("init(bounds pytree, leaf missing)",
         lambda: opt(bounds={"w": (0.0, 1.0)}).init(params(), key=KEY),
         ValueError, r"bounds does not match the structure of params"),
    Case("init(bounds pytree, None at a leaf)",
         lambda: opt(bounds={"w": (-1.0, 1.0), "b": ((-1.0, 1.0), None)}).init(params(), key=KEY),
         ValueError, r"Invalid bounds at params\['b'\]\[1\]: None; " + BOUNDS_FORM),
    Case("init(bounds shape (2,) on leaf (3,))",
         lambda: opt(bounds={"w": (torch.zeros(2), torch.ones(2)), "b": ((0.0, 1.0), (0.0, 1.0))}
                     ).init(params(), key=KEY),
         ValueError, r"bounds at params\['w'\] have shape \(2,\), which does not broadcast to "
                     r"the leaf's shape \(3,\)"),
    Case("init(bounds pair of (2,) tensors for every leaf)",
         lambda: opt(bounds=(-torch.ones(2), torch.ones(2))).init(params(), key=KEY),
         ValueError, r"bounds at params\['b'\]\[1\] have shape \(2,\).*leaf's shape \(\)"),
    Case("init(bounds shape (2,3) on leaf (3,))",
         lambda: opt(bounds=(-torch.ones(2, 3), torch.ones(2, 3))).init({"w": torch.zeros(3)},
                                                                        key=KEY),
         ValueError, r"bounds at params\['w'\] have shape \(2, 3\).*leaf's shape \(3,\)"),
    # ---- update -----------------------------------------------------------------------------
    Case("loss shape (10,)", update(lambda p: loss_fn(p) + torch.zeros(10)), ValueError,
         LOSS_SCALAR + r"; got shape \(10,\) per bacterium \(\(4, 10\) for the population\)\. "
         r"Reduce it"),
    Case("loss shape (1,)", update(lambda p: p["w"].sum(0, keepdim=True)), ValueError,
         r"one floating scalar .*shape \(1,\) per bacterium"),
    Case("a whole-population evaluator, a loss of one candidate",
         update(lambda p: p["w"].square().sum(), evaluator=lambda f, population: f(population)),
         ValueError,
         r"The evaluator returned losses of shape \(\) for 4 candidates; expected one per "
         r"candidate\. A loss called on the whole population reduces every axis but the first"),
    Case("an evaluator dropping a candidate",
         update(lambda p: loss_fn(p), evaluator=lambda f, population: torch.zeros(3)),
         ValueError, r"returned losses of shape \(3,\) for 4 candidates"),
    Case("loss int", update(lambda p: (loss_fn(p) > 1).long()), TypeError,
         LOSS_SCALAR + r"; got dtype torch\.int64.*cast to float"),
    Case("loss bool", update(lambda p: loss_fn(p) > 1), TypeError,
         r"one floating scalar .*got dtype torch\.bool"),
    Case("loss tuple", update(lambda p: (loss_fn(p), loss_fn(p))), TypeError,
         LOSS_SCALAR + r"; got tuple"),
    Case("loss python float, loop", update(lambda p: 1.0, evaluator=fb.evaluate.loop()),
         TypeError, LOSS_SCALAR + r"; got float 1\.0"),
    Case("loss None, loop", update(lambda p: None, evaluator=fb.evaluate.loop()),
         TypeError, LOSS_SCALAR + r"; got NoneType None"),
    Case("loss shape (10,), loop",
         update(lambda p: loss_fn(p) + torch.zeros(10), evaluator=fb.evaluate.loop()),
         ValueError, LOSS_SCALAR + r"; got shape \(10,\)"),
    Case("loss int, loop",
         update(lambda p: (loss_fn(p) > 1).long(), evaluator=fb.evaluate.loop()),
         TypeError, r"one floating scalar .*got dtype torch\.int64"),
    Case("loss python float, vmap", update(lambda p: 1.0), (TypeError, ValueError),
         LOSS_SCALAR + r"; got a value that is not a tensor\. Compute it with tensor ops"),
    Case("loss calls .item(), vmap", update(item_loss), RuntimeError,
         r"(?s)vmap: .*\.item\(\).*loss_fn could not be batched by torch\.func\.vmap.*"
         r"evaluator=functional_bfo\.evaluate\.loop\(\)"),
    Case("loss branches on a tensor, vmap", update(branching_loss), RuntimeError,
         r"(?s)data-dependent control flow.*branch in Python on tensor values.*"
         r"evaluate\.loop\(\)"),
    Case("state of another population size",
         lambda: opt(population_size=5).update(state(), loss_fn), ValueError,
         r"state has a population of \(4,\) bacteria but this optimizer has "
         r"population_size=5; use the optimizer that made the state"),
    Case("update(loss_fn, state) swapped", lambda: opt().update(loss_fn, state()), TypeError,
         r"Expected the state returned by init/update, got function"),
    Case("update(None)", lambda: opt().update(None, loss_fn), TypeError,
         r"Expected the state returned by init/update, got NoneType"),
    Case("batch of states without vmap", lambda: opt().update(batched_states(), loss_fn),
         (TypeError, ValueError), r"vmap"),
    Case("custom evaluator returns (P-1,) losses",
         update(loss_fn, evaluator=lambda f, pop, *a: torch.zeros(3)), ValueError,
         r"one floating scalar|\(3,\)"),
    # ---- run --------------------------------------------------------------------------------
    Case("run without a budget", lambda: fb.run(opt(), state(), loss_fn), ValueError,
         r"run needs a budget: pass max_evals=\.\.\. or max_steps=\.\.\."),
    Case("run target_loss only", lambda: fb.run(opt(), state(), loss_fn, target_loss=0.0),
         ValueError, r"run needs a budget"),
    Case("run max_evals=0", lambda: fb.run(opt(), state(), loss_fn, max_evals=0), ValueError,
         r"Invalid max_evals: 0; " + ANY_INT.format(1)),
    Case("run max_steps=-1", lambda: fb.run(opt(), state(), loss_fn, max_steps=-1), ValueError,
         r"Invalid max_steps: -1; " + ANY_INT.format(0)),
    Case("run patience=0",
         lambda: fb.run(opt(), state(), loss_fn, max_steps=1, patience=0), ValueError,
         r"Invalid patience: 0; " + ANY_INT.format(1)),
    Case("run log_every=0",
         lambda: fb.run(opt(), state(), loss_fn, max_steps=1, log_every=0), ValueError,
         r"Invalid log_every: 0; " + ANY_INT.format(1)),
    Case("run min_delta=-1",
         lambda: fb.run(opt(), state(), loss_fn, max_steps=1, min_delta=-1), ValueError,
         r"Invalid min_delta: -1\.0; " + FLOAT_RANGE),
    Case("run progress='yes'",
         lambda: fb.run(opt(), state(), loss_fn, max_steps=1, progress="yes"), TypeError,
         r"Invalid progress: 'yes'; expected a bool or a callable\(dict\)"),
    Case("run with another population size",
         lambda: fb.run(opt(population_size=5), state(), loss_fn, max_steps=1), ValueError,
         r"state has a population of \(4,\) bacteria"),
    Case("run maximize=True (the optimizer's setting)",
         lambda: fb.run(opt(), state(), loss_fn, max_steps=0, maximize=True),
         TypeError, r"unexpected keyword argument 'maximize'"),
    Case("run compile='yes'", lambda: fb.run(opt(), state(), loss_fn, max_steps=0, compile="yes"),
         ValueError, r"Invalid compile: 'yes'; expected True or False"),
    Case("run target_loss=nan",
         lambda: fb.run(opt(), state(), loss_fn, max_steps=0, target_loss=math.nan),
         ValueError, r"Invalid target_loss: nan"),
    Case("run a batched state",
         lambda: fb.run(opt(), batched_states(), loss_fn, max_steps=1), ValueError,
         r"run drives one state, and this one is batched \(best_loss of shape \(3,\)\)"),
    Case("run checkpoint=a file object",
         lambda: fb.run(opt(), state(), loss_fn, max_steps=1, checkpoint=io.BytesIO()),
         TypeError, r"Invalid checkpoint: .*expected a path \(str or os\.PathLike\)"),
    Case("run a state that is not one", lambda: fb.run(opt(), params(), loss_fn, max_steps=1),
         TypeError, r"Expected the state returned by init/update, got dict"),
    # ---- with_hyperparams -------------------------------------------------------------------
    Case("with_hyperparams(stepsize=...)", lambda: fb.with_hyperparams(state(), stepsize=0.1),
         ValueError, r"Unknown hyperparameters \['stepsize'\]; this state has \['step_size', "),
    Case("with_hyperparams(step_size=-1)", lambda: fb.with_hyperparams(state(), step_size=-1.0),
         ValueError, r"Invalid step_size: -1\.0"),
    Case("with_hyperparams(elimination_prob=nan)",
         lambda: fb.with_hyperparams(state(), elimination_prob=math.nan), ValueError,
         r"Invalid elimination_prob: nan"),
    Case("with_hyperparams(step_size=[0.1, 0.2])",
         lambda: fb.with_hyperparams(state(), step_size=[0.1, 0.2]), ValueError,
         r"step_size.*shape"),
    Case("with_hyperparams(not a state)",
         lambda: fb.with_hyperparams({"w": torch.zeros(1)}, step_size=0.1), TypeError,
         r"Expected the state returned by init/update"),
    # ---- save -------------------------------------------------------------------------------
    Case("save(a dict of tensors)", lambda: fb.save({"w": torch.zeros(1)}, io.BytesIO()),
         TypeError, r"Expected the state returned by init/update, got dict"),
    # ---- load -------------------------------------------------------------------------------
    Case("load(a dict of tensors)", lambda: fb.load(checkpoint({"a": torch.zeros(1)}), state()),
         ValueError, r"Not a functional_bfo state checkpoint \(expected format "
                     r"functional_bfo\.state/1 with \['digest', .*\]\); write one with "
                     r"functional_bfo\.save"),
    Case("load(a tensor)", lambda: fb.load(checkpoint(torch.zeros(1)), state()), ValueError,
         r"Not a functional_bfo state checkpoint"),
    Case("load(bytes that are no torch file)",
         lambda: fb.load(checkpoint(raw=b"not a checkpoint at all"), state()), ValueError,
         r"Not a functional_bfo state checkpoint"),
    Case("load(like: another population size)",
         lambda: fb.load(saved_state(), opt(population_size=5).init(params(), key=KEY)),
         ValueError, r"Checkpoint leaf .* is torch\.float32 \(4, 8\) but like has "
                     r"torch\.float32 \(5, 8\); the optimizer \(population size\) or "
                     r"params differ"),
    Case("load(like: another population size) names the state field",
         lambda: fb.load(saved_state(), opt(population_size=5).init(params(), key=KEY)),
         ValueError, r"Checkpoint leaf state\.population is"),
    Case("load(like: another params structure)",
         lambda: fb.load(saved_state(), opt().init({"w": torch.zeros(3)}, key=KEY)),
         ValueError, r"Checkpoint holds a BFOState of \d+ leaves, but like is a BFOState of "
                     r"\d+: only in the checkpoint \[.*state\.best_params\['b'\]\[0\].*\], only "
                     r"in like \[\] \(8 at most each\); pass a state of the same optimizer"),
    Case("load(like: another dtype)",
         lambda: fb.load(saved_state(),
                         opt().init(optree.tree_map(torch.Tensor.double, params()), key=KEY)),
         ValueError, r"is torch\.float32 \(4, 8\) but like has torch\.float64 \(4, 8\)"),
    # ---- module_loss ------------------------------------------------------------------------
    Case("module_loss(a function)",
         lambda: fb.module_loss(lambda x: x, torch.nn.functional.mse_loss), TypeError,
         r"Expected an nn\.Module, got function"),
    Case("module_loss(a params dict)",
         lambda: fb.module_loss({"w": torch.zeros(1)}, torch.nn.functional.mse_loss), TypeError,
         r"Expected an nn\.Module, got dict"),
]


TABLE += [  # contradictory settings, and numbers as users write them
    Case("adaptive_bfo(step_size_min above step_size_max)",
         lambda: fb.adaptive_bfo(4, step_size_min=2.0, step_size_max=1.0), ValueError,
         r"Invalid step_size_min: 2\.0 is above step_size_max=1\.0"),
    Case("hybrid_bfo(step_size_min above step_size_max)",
         lambda: fb.hybrid_bfo(4, step_size_min=2.0, step_size_max=1.0), ValueError,
         r"Invalid step_size_min: 2\.0 is above step_size_max=1\.0"),
    Case("with_hyperparams(a floor above the ceiling)",
         lambda: fb.with_hyperparams(fb.adaptive_bfo(4).init(params(), key=KEY),
                                     step_size_min=2.0), ValueError,
         r"Invalid step_size_min: 2\.0 is above step_size_max=1\.0"),
    Case("bfo(population_size='4')", lambda: fb.bfo("4"), ValueError,
         r"Invalid population_size: '4' \(a str, not a number\); expected an int >= 1"),
    Case("adaptive_bfo.init(params, key) positionally",
         lambda: fb.adaptive_bfo(4).init(params(), KEY), TypeError,
         r"adaptive_bfo\.init takes params and the key by keyword: .* got 2 positional"),
    Case("black_box_search.init(params, key) positionally",
         lambda: fb.black_box_search((-1.0, 1.0), max_evals=100).init(params(), KEY),
         TypeError, r"black_box_search\.init takes params and the key by keyword"),
    Case("black_box(numpy bounds of the wrong length)",
         lambda: fb.black_box(lambda p: p["x"].sum(), {"x": torch.zeros(10)},
                              (np.full(7, -1.0), np.full(7, 1.0)), max_evals=100, key=KEY),
         ValueError, r"bounds at params\['x'\] have shape \(7,\), which does not broadcast "
                     r"to the leaf's shape \(10,\)"),
]


@pytest.mark.parametrize("number", [np.int64(4), np.int32(4), torch.tensor(4)],
                         ids=["np.int64", "np.int32", "tensor"])
@pytest.mark.parametrize("factory", [fb.bfo, fb.adaptive_bfo, fb.hybrid_bfo])
def test_factories_and_run_take_numbers_as_users_write_them(factory, number):
    """numpy and 0-d tensor numbers are numbers: the same run as Python's."""
    real = dict(step_size=0.1, init_scale=0.5)
    given = dict(step_size=np.float32(0.1), init_scale=torch.tensor(0.5, dtype=torch.float64))
    if factory is fb.hybrid_bfo:
        real["grad_mask"] = given["grad_mask"] = True
    opt, same = factory(number, swim_length=number, **given), factory(4, swim_length=4, **real)
    mine = fb.run(opt, opt.init(params(), key=KEY), loss_fn, max_evals=np.int64(200),
                  max_steps=torch.tensor(3), log_every=np.int64(1))
    theirs = fb.run(same, same.init(params(), key=KEY), loss_fn, max_evals=200, max_steps=3)
    assert_trees_equal(mine, theirs)


def test_numpy_bounds_are_bounds():
    """Black-box users hold their bounds in numpy: arrays per coordinate, or scalars."""
    p = {"x": torch.zeros(4)}
    low, high = np.array([-1.0, -2.0, -3.0, -4.0]), np.array([1.0, 2.0, 3.0, 4.0])
    for bounds, like in [((low, high), (torch.from_numpy(low), torch.from_numpy(high))),
                         ((np.float64(-2), np.float32(2)), (-2.0, 2.0)),
                         ({"x": (np.int64(-2), np.array(2.0))}, {"x": (-2, 2.0)})]:
        mine = fb.black_box(lambda q: q["x"].square().sum(), p, bounds, max_evals=300, key=KEY)
        theirs = fb.black_box(lambda q: q["x"].square().sum(), p, like, max_evals=300, key=KEY)
        assert torch.equal(mine.params["x"], theirs.params["x"])
        assert_trees_equal(fb.adaptive_bfo(4, bounds=bounds).init(p, key=KEY),
                           fb.adaptive_bfo(4, bounds=like).init(p, key=KEY))


def _param(case: Case):
    marks = ()
    if case.xfail:
        marks = pytest.mark.xfail(strict=True, reason=case.xfail, raises=case.fails_with)
    return pytest.param(case.call, case.exc, case.match, id=case.id, marks=marks)


@pytest.mark.parametrize("call, exc, match", [_param(c) for c in TABLE])
def test_bad_input_raises_clear_error(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_table_ids_are_unique():
    ids = [c.id for c in TABLE]
    assert len(ids) == len(set(ids))


# ---- nothing is corrupted ---------------------------------------------------------------------


def _fails_after_mutating(p):
    p["w"].add_(100.0)  # in place on the candidates handed to loss_fn
    raise RuntimeError("loss exploded")


class _FailOnCall:
    """A loss that works for ``n`` calls and then raises (the loop evaluator fails midway)."""

    def __init__(self, n):
        self.n = n

    def __call__(self, p):
        self.n -= 1
        if self.n < 0:
            raise ZeroDivisionError("midway")
        return loss_fn(p)


FAILING_UPDATES = [
    pytest.param({}, lambda p: loss_fn(p) + torch.zeros(10), ValueError, id="shape"),
    pytest.param({}, lambda p: (loss_fn(p) > 1).long(), TypeError, id="int"),
    pytest.param({}, item_loss, RuntimeError, id="item-under-vmap"),
    pytest.param({}, _fails_after_mutating, RuntimeError, id="mutate-then-raise-vmap"),
    pytest.param({"evaluator": fb.evaluate.loop()}, _fails_after_mutating, RuntimeError,
                 id="mutate-then-raise-loop"),
    pytest.param({"evaluator": fb.evaluate.loop()}, "fail-on-7th-call", ZeroDivisionError,
                 id="midway-loop"),
    pytest.param({"bounds": (-1.0, 1.0), "swarming": True}, lambda p: 1.0, Exception,
                 id="float-bounded-swarming"),
]


@pytest.mark.parametrize("kwargs, bad_loss, exc", FAILING_UPDATES)
def test_failed_update_leaves_state_intact_and_usable(kwargs, bad_loss, exc):
    o = opt(**kwargs)
    s = o.update(o.init(params(), key=KEY), loss_fn)  # a state with known losses
    before = clone(s)
    if bad_loss == "fail-on-7th-call":  # a fresh counter per run; P=4, so the 2nd swim step
        bad_loss = _FailOnCall(6)
    with pytest.raises(exc):
        o.update(s, bad_loss)
    assert_trees_equal(s, before)
    # The state still works, and gives what it would have given with no failure in between.
    assert_trees_equal(o.update(s, loss_fn), o.update(before, loss_fn))


def test_loss_mutating_its_input_does_not_reach_the_state():
    def mutating(p):
        p["w"].mul_(0.0)
        return loss_fn(p)

    for evaluator in (fb.evaluate.vmap(), fb.evaluate.loop()):
        o = opt(evaluator=evaluator)
        s = o.init(params(), key=KEY)
        before = clone(s)
        o.update(s, mutating)
        assert_trees_equal(s, before)


@pytest.mark.parametrize("bad", [
    pytest.param(lambda p: {**p, "n": torch.zeros(2, dtype=torch.int64)}, id="int-leaf"),
    pytest.param(lambda p: {**p, "x": 1.5}, id="float-leaf"),
    pytest.param(lambda p: {**p, "m": torch.zeros(2, device="meta")}, id="meta-leaf"),
])
def test_failed_init_leaves_params_intact(bad):
    p = bad(params())
    before = optree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, p)
    with pytest.raises((TypeError, ValueError)):
        opt().init(p, key=KEY)
    for x, y in zip(optree.tree_leaves(p), optree.tree_leaves(before)):
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            assert torch.equal(x, y)


def test_load_of_a_non_checkpoint_file_on_disk(tmp_path):
    path = tmp_path / "notes.pt"
    torch.save({"format": "something/else", "leaves": []}, path)
    with pytest.raises(ValueError, match=r"Not a functional_bfo state checkpoint"):
        fb.load(path, like=state())
