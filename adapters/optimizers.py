"""BFO, AdaptiveBFO and HybridBFO: :class:`SwarmOptimizer` over ``fb.bfo`` and friends."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, cast

import torch
import torch.distributed as dist
from torch import Tensor

import functional_bfo as fb
from functional_bfo._ask_tell import at_step
from functional_bfo._checks import check_bool, check_int, check_params
from functional_bfo._state import from_dict, to_dict
from functional_bfo._stopping import Stopping
from functional_bfo._tree import diversity

from ._candidates import CandidateEvaluator, Trace, as_loss, write

STOPPING = ("best_cost", "stalled", "steps", "per_update", "maximize")  # Stopping's counters
RECORD = {"class": str, "seed": int, "best": (int, float, type(None)), "best_cost": (int, float),
          "stalled": int, "steps": int, "per_update": (int, float, type(None)), "maximize": bool,
          "reason": (str, type(None))}  # the "optimizer" entry: what each value must be


@dataclasses.dataclass
class _Swarm:
    """A group's core, evaluators and fast-path update; the settings its state follows."""

    settings: dict[str, Any]  # those that shaped it, and the hyperparameters its state holds
    core: fb.Optimizer
    evaluator: CandidateEvaluator
    scorer: Any  # the evaluator, or fb.distributed's around it
    update: Callable[..., Any]  # core.update compiled if asked, else at_step's pick by step
    mask: list[bool] | None = None  # the hybrid's requires_grad flags


class SwarmOptimizer(torch.optim.Optimizer):
    """A ``torch.optim`` optimizer whose param groups are swarms of a pure core optimizer.

    A group's core state is ``self.state[its first param]["swarm"]``, as in LBFGS; settings
    are read from ``group[...]`` at each step, as Adam reads ``group["lr"]``. Every
    parameter given is searched, ``requires_grad=False`` or not (HybridBFO moves those
    without a gradient): to freeze a layer, leave its parameters out.

    Args:
        params: parameters, ``named_parameters()`` or param-group dicts; a swarm per group.
        seed: the swarms' key; None draws one from torch's global generator (rank 0's).
        compile: ``torch.compile(fullgraph=True)`` the fast path's update: True or a mode.
        module: the model, its buffers saved at a step's start, not at a candidate's first use.
        evaluator: ``fb.distributed.sharded()`` or ``.data_parallel(...)``: ranks share work.
        reevaluate: score the params as they stand first, so no stale best freezes them
            (False: a fixed objective and one stepping group only).
        max_fe: with ``target_loss``, ``patience``, ``min_delta``: when ``should_stop``.
        **settings: the class's ``DEFAULTS`` to change, for the groups that set no other.
    """

    factory: ClassVar[Callable[..., fb.Optimizer]]
    Hyperparams: ClassVar[Any]  # the settings a state holds as tensors: they may change
    LR: ClassVar[str]  # the core's name of torch's lr
    DEFAULTS: ClassVar[dict[str, Any]]
    uses_grads: ClassVar[bool] = False

    @property
    def best_fitness(self) -> float | None:
        """The best loss returned by the last ``step`` (None before the first)."""
        return self._best

    @property
    def best_params(self) -> list[Tensor]:
        """Copies of the parameters, the best found, in parameter order."""
        return [p.detach().clone() for group in self.param_groups for p in group["params"]]

    @property
    def population(self) -> Tensor:
        """Every bacterium's parameters flattened, shape (population_size, n_params)."""
        if not (rows := [state.population for state in self._swarm_states().values()]):
            raise ValueError("There is no population before the first step; call step first.")
        return torch.cat(rows, dim=1)  # (groups of other sizes: read each with metrics(g))

    def _compute_diversity(self) -> float:
        """Root-mean-square distance of the bacteria to their centroid, all groups."""
        return float(diversity(population := self.population, population.dtype))

    def __init__(self, params: Iterable[Any], *, seed: int | None = None,
                 compile: bool | str = False, module: torch.nn.Module | None = None,
                 evaluator: Any = None, reevaluate: bool = True, max_fe: int | None = None,
                 target_loss: float | None = None, patience: int | None = None,
                 min_delta: float = 0.0, **settings: Any) -> None:
        if unknown := sorted(set(settings) - set(self.DEFAULTS)):
            raise TypeError(f"Unexpected settings {unknown} (lr is the core's {self.LR}); "
                            f"{type(self).__name__}'s are {sorted(self.DEFAULTS)}.")
        if evaluator is not None and not callable(getattr(evaluator, "around", None)):
            raise TypeError(f"evaluator must be one of fb.distributed's; got {evaluator!r}.")
        self._mode = "default" if compile is True else compile or None  # torch checks a mode
        self._reevaluate = check_bool("reevaluate", reevaluate)
        self._stopping = Stopping(budget=max_fe, target_loss=target_loss, patience=patience,
                                  min_delta=min_delta, budget_name="max_fe")
        self._seed, self._distributed, self._trace = _agreed(seed), evaluator, Trace(module)
        self._dynamic = ["lr" if f == self.LR else f for f in self.Hyperparams._fields]
        self._swarms: dict[int, _Swarm] = {}  # the groups' cores: rebuilt after a load
        self._best, self._closure, self._loading, self._warned = cast(Any, (None,) * 3 + (False,))
        self.last_step_evals = 0  # what the last step() evaluated: 0 if paused or stopped
        super().__init__(params, {**self.DEFAULTS, **settings})
        self.register_state_dict_post_hook(type(self)._saved)  # type: ignore[arg-type]
        self.register_load_state_dict_pre_hook(type(self)._check_load)  # type: ignore[arg-type]
        self.register_load_state_dict_post_hook(type(self)._finish_load)  # type: ignore[arg-type]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (its own swarm); nothing is added unless it is valid."""
        renamed = {self.LR: "lr", "elim_prob": "elimination_prob"}
        if isinstance(param_group, dict) and (old := sorted(renamed.keys() & param_group)):
            raise TypeError(f"A param group got {old}: call them {[renamed[k] for k in old]}.")
        super().add_param_group(param_group)
        try:
            check_params(self.param_groups[-1]["params"] or [torch.zeros(0)])
            self._build(self.param_groups[-1])  # the core factory checks the settings
        except BaseException:
            self.param_groups.pop()
            raise

    def _build(self, group: dict[str, Any]) -> _Swarm:
        kwargs = {k: group[k] for k in self.DEFAULTS if k not in ("lr", "chunk_size")}
        kwargs.update(self._core_names({"lr": group["lr"]}, group))
        if group["chunk_size"] is not None:  # the shell's evaluator takes it, not the core
            check_int("chunk_size", group["chunk_size"], 1)
        if self.uses_grads:  # the mask follows requires_grad (fb.with_grad_mask at each step)
            kwargs["grad_mask"] = False
        evaluator = CandidateEvaluator(group["params"], self._trace, self.uses_grads)
        scorer = evaluator if self._distributed is None else self._distributed.around(
            evaluator, self.uses_grads)
        with self._torch_names():
            core = type(self).factory(**kwargs, evaluator=scorer)
        update = torch.compile(core.update, fullgraph=True, mode=self._mode) if self._mode else (
            lambda state, loss: at_step(core, int(state.step)).update(state, loss))
        static = {k: group[k] for k in self.DEFAULTS if k not in self._dynamic}
        return _Swarm(static, core, evaluator, scorer, update)  # hyperparameters set at a step

    def _core_names(self, values: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
        """Dynamic settings in the core's names; the floor follows an lr ceiling down."""
        out = {self.LR if k == "lr" else k: float(v) if k == "lr" else v  # a tensor lr too
               for k, v in values.items()}
        lr = float(group["lr"])
        if self.LR == "step_size_max" and values.keys() & {"lr", "step_size_min"}:
            floor = group["step_size_min"]
            out.update(step_size_max=floor if lr == 0 else lr,  # lr = 0: paused, never run
                       step_size_min=min(floor, lr) if lr > 0 else floor)
        return out

    @contextlib.contextmanager
    def _torch_names(self) -> Iterator[None]:
        """The core's errors about ``LR`` told as about ``lr``, the name the shell takes."""
        try:
            yield
        except ValueError as e:
            raise ValueError(re.sub(rf"\b{self.LR}\b", "lr", str(e))) from e

    def step(self, closure: Callable[[], Any] | None = None, *,  # type: ignore[override]
             loss_fn: Callable[[Any], Tensor] | None = None) -> float:
        """One step of every group's swarm; the parameters end at the best, its loss returned.

        ``closure()`` (a float or one-element tensor, ``backward`` optional) is called per
        candidate written into the parameters, and once more at the best; ``loss_fn(params)``
        scores them under ``vmap`` instead. A step that raises leaves everything as it was.
        """
        pending = closure is None and loss_fn is None
        closure = self._closure if pending else closure
        if (closure is None) == (loss_fn is None) or not callable(closure or loss_fn):
            raise TypeError(f"{type(self).__name__}.step needs one callable, a closure or loss_fn="
                            f"...; got {closure or loss_fn!r:.60}. Frameworks that call step() "
                            "bare need opt.set_closure first.")
        if closure is not None and self._mode is not None:
            raise ValueError("compile= compiles step(loss_fn=...); a closure runs Python per "
                             "candidate. Use compile=False with closures.")
        self.last_step_evals = 0 if self.should_stop else self._step_all(closure, loss_fn)
        self._closure = None if pending else self._closure  # used up: step() needs a new one
        return math.nan if self._best is None else self._best

    def set_closure(self, closure: Callable[[], Any] | None) -> None:
        """The closure of the next bare ``step()`` (frameworks that call it themselves)."""
        if closure is not None and not callable(closure):
            raise TypeError(f"Invalid closure: {closure!r}; expected a callable or None.")
        self._closure = closure

    @property
    def closure_pending(self) -> bool:
        """Whether a closure set by :meth:`set_closure` waits for the next ``step()``."""
        return self._closure is not None

    def _step_all(self, closure: Any, loss_fn: Any) -> int:
        """Step every group; commit all of it (the evaluations it took), or restore and raise."""
        groups, new, g = self.param_groups, {}, 0
        live = [g for g, group in enumerate(groups) if group["params"] and group["lr"] != 0]
        if not self._reevaluate and len(live) > 1:
            raise ValueError(f"{type(self).__name__}: reevaluate=False needs one stepping param "
                             f"group, and {len(live)} step: each group's best was scored with "
                             "the others' values of its own step, so without the rescore a "
                             "stale best can be kept over a better one. Use reevaluate=True.")
        # This step's cost, over the groups it steps (a group resumed or added costs more than
        # the last step did): a budget it would overrun stops before it.
        swarms_cost = sum(groups[g]["population_size"] * (groups[g]["swim_length"] + 1)
                          + self._reevaluate for g in live)
        ahead = dataclasses.replace(self._stopping, per_update=swarms_cost + (
            closure is not None or self._trace.train_buffers()))  # kept only if it stops
        if live and ahead.check(self.num_evals):
            self._stopping = ahead
            return 0
        start = [[p.detach().clone() for p in group["params"]] for group in groups]
        if len(live) < len(groups) and not self._warned:  # a schedule's end, a warmup's start
            warnings.warn(f"{type(self).__name__}: a param group with lr=0 is paused (not "
                          "evaluated) until its lr is positive.", RuntimeWarning, stacklevel=3)
            self._warned = True  # after: a warning raised as an error fails the step whole
        self._trace.begin()
        try:
            for g in live:
                new[g] = self._advance(g, groups[g], closure, loss_fn)
                if self._distributed is not None:  # ranks that scored other candidates
                    fb.distributed.check_agreement(new[g][0])
                write(groups[g]["params"], new[g][0].best_params)
            self._trace.restore()  # then one evaluation at the best, as a forward pass leaves
            if settle := bool(new) and (closure is not None or self._trace.train_buffers()):
                with torch.enable_grad() if closure else torch.no_grad():
                    as_loss(closure()) if closure else loss_fn(_loss_input(
                        [group.get("param_names") for group in groups],
                        [[p.detach() for p in group["params"]] for group in groups]))
                new[g] = new[g][0]._replace(num_evals=new[g][0].num_evals + 1), new[g][1]
        except BaseException as e:
            for group, values in zip(groups, start):
                write(group["params"], values)
            self._trace.restore()
            eager = "; compile=False runs it eagerly" if self._mode and closure is None else ""
            e.add_note(f"(raised while {type(self).__name__} stepped param group {g}{eager}; "
                       "parameters, buffers, swarms and counters restored as they were)")
            raise
        for g, (state, swarm) in new.items():
            self.state[groups[g]["params"][0]]["swarm"], self._swarms[g] = state, swarm
        if not new:
            return 0
        self._best = float(state.best_loss)  # the last group's: it saw every group's best
        self._stopping.maximize = bool(swarm.settings["maximize"])
        per_update = settle + swarms_cost
        self._stopping.record(self.num_evals, self._best, per_update)  # type: ignore[arg-type]
        return per_update

    def _advance(self, g: int, group: dict[str, Any], closure: Any,
                 loss_fn: Any) -> tuple[Any, _Swarm]:
        """The group's next state and the swarm that made it; changes nothing."""
        params, settings = group["params"], {k: group[k] for k in self.DEFAULTS}
        state, swarm = self.state.get(params[0], {}).get("swarm"), self._swarms.get(g)
        swarm = swarm or self._build(group)  # at the first step, or the first after a load
        changed = {k: float(v) if isinstance(v, Tensor) and k in self._dynamic else v  # by value:
                   for k, v in settings.items()  # a scheduler edits a tensor lr in place
                   if k not in swarm.settings or not _same(swarm.settings[k], v)}
        if fixed := sorted(changed.keys() - {*self._dynamic, "chunk_size"}):
            raise ValueError(f"param_groups[{g}]: {fixed} shape the swarm, so cannot change after "
                             f"its first step ({self._dynamic} can). Set them back.")
        if first := state is None:  # the swarm starts from the params as they are
            key = fb.random.fold_in(fb.random.key(self._seed), g).to(params[0].device)
            state = swarm.core.init([p.detach().clone() for p in params], key=key)
        with self._torch_names():
            state = fb.with_hyperparams(state, **self._core_names(
                {k: v for k, v in changed.items() if k in self._dynamic}, settings))
        swarm = dataclasses.replace(swarm, settings={**swarm.settings, **changed})
        if self.uses_grads and (mask := [p.requires_grad for p in params]) != swarm.mask:
            state, swarm.mask = fb.with_grad_mask(state, mask), mask
        values = [[p.detach() for p in group["params"]] for group in self.param_groups]
        names = [group.get("param_names") for group in self.param_groups]  # traced: no groups
        loss = closure or (lambda leaves: loss_fn(_loss_input(  # group g's, the others held
            names, [leaves if i == g else v for i, v in enumerate(values)])))
        swarm.evaluator.closure, swarm.evaluator.chunk_size = closure, settings["chunk_size"]
        try:
            if self._reevaluate:
                state = self._rescore(state, swarm, loss, first, settings["maximize"])
            with self._trace.scoring(hook=False) if closure is None else contextlib.nullcontext():
                return swarm.update(state, loss), swarm  # a closure's: never compiled
        finally:
            swarm.evaluator.closure = None

    def _rescore(self, state: Any, swarm: _Swarm, loss: Any, first: bool, maximize: bool) -> Any:
        """The parameters as they stand, scored: bacterium 0 at first, then the best to beat."""
        current = (list(state.best_params) if first  # bacterium 0: the start, inside bounds
                   else [p.detach() for p in swarm.evaluator.params])
        differing = None  # ranks whose params, scored here, are not rank 0's
        with self._trace.scoring(hook=True):
            if swarm.evaluator.closure is not None or swarm.scorer is not swarm.evaluator:
                rows = [x.unsqueeze(0) for x in current]
                report = getattr(swarm.scorer, "with_disagreement", None)
                out, differing = report(loss, rows) if report else (swarm.scorer(loss, rows), None)
                value, grads = out if self.uses_grads else (out, None)
                value, grads = value[0], grads and [x[0] for x in grads]
            elif first and self.uses_grads:  # loss_fn here: a batch of one needs no vmap
                grads, value = torch.func.grad_and_value(loss)(current)
            else:
                value, grads = loss(current), None
        if differing is not None:  # the step's agreement check then names them
            state = state._replace(disagreeing_ranks=state.disagreeing_ranks | differing)
        if first:
            return fb.with_start_loss(state, value, grad=grads)
        loss = value.detach().to(state.best_loss.dtype)  # a NaN loss is never the best
        best = torch.where(loss.isnan(), -math.inf if maximize else math.inf, loss)
        return state._replace(best_params=[x.clone() for x in current], best_loss=best,
                              num_evals=state.num_evals + 1)

    def _saved(self, state_dict: dict[str, Any]) -> dict[str, Any]:  # swarms as fb.save writes
        state = {i: {k: to_dict(v) if k == "swarm" else v for k, v in e.items()}
                 for i, e in state_dict["state"].items()}
        state.setdefault(0, {})["optimizer"] = {
            "class": type(self).__name__, "seed": self._seed, "best": self._best,
            "reason": self._stopping.reason, **{k: getattr(self._stopping, k) for k in STOPPING}}
        return {**state_dict, "state": state}

    def _check_load(self, state_dict: dict[str, Any]) -> None:
        """Check a state dict before torch changes anything; read its swarms as saved."""
        name, states, swarms = type(self).__name__, {}, {}
        try:
            entries, groups = state_dict["state"], state_dict["param_groups"]
            record = dict(entries[0]["optimizer"])
            bad = [k for k, kind in RECORD.items() if not isinstance(record.get(k), kind)]  # type: ignore[arg-type]
            if record["class"] != name or bad:
                raise TypeError(f"its record is of {record['class']!r}, invalid: {bad}")
            for g, (group, saved) in enumerate(zip(self.param_groups, groups)):
                swarms[g] = self._build({**saved, "params": group["params"]})  # checks them
                entry = entries.get((saved["params"] or [None])[0], {}).get("swarm")
                if entry is not None:  # checked against a state of the saved settings (so of
                    params = [p.detach() for p in group["params"]]  # its maximize=)
                    key = fb.random.fold_in(fb.random.key(record["seed"]), g).to(params[0].device)
                    states[g] = from_dict(entry, swarms[g].core.init(params, key=key), False)
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            raise ValueError(f"Not a state dict of {name} ({type(e).__name__}: {e}); write one "
                             f"with {name}.state_dict().") from None
        self._loading = states, record, swarms

    def _finish_load(self) -> None:
        (states, record, swarms), self._loading = self._loading, None  # of the loaded groups
        # A group saved before its first step starts at its first step, from the settings
        # then (its lr sets the first step sizes), as in the optimizer never saved.
        self._swarms = {g: swarms[g] for g in states}
        for g, swarm in self._swarms.items():  # torch copied the saved groups: their objects
            swarm.settings = {k: self.param_groups[g][k] for k in swarm.settings}  # (tensors)
        for g, state in states.items():  # as saved: torch cast them to the params' dtype
            self.state[self.param_groups[g]["params"][0]]["swarm"] = state
        self._seed, self._best = record["seed"], record["best"]
        self._stopping = dataclasses.replace(self._stopping, **{k: record[k] for k in STOPPING})
        self._stopping.check(self.num_evals)  # under this optimizer's limits, not the saved ones
        for entry in self.state.values():  # torch copied the record; the state_dict hook writes it
            entry.pop("optimizer", None)

    @property
    def should_stop(self) -> bool:
        """Whether ``max_fe``, ``target_loss`` or ``patience`` fired (``step`` then waits)."""
        return self._stopping.reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why ``should_stop``: ``"max_fe"``, ``"target_loss"``, ``"patience"`` or None."""
        return self._stopping.reason

    @property
    def num_steps(self) -> int:
        """Steps that evaluated something, over the whole run (a state dict keeps them)."""
        return self._stopping.steps

    @property
    def num_evals(self) -> int:
        """Loss evaluations (closure or loss_fn calls per candidate) so far, all groups."""
        return sum(int(state.num_evals) for state in self._swarm_states().values())

    @property
    def stepped_groups(self) -> list[int]:
        """The param groups whose swarm has started (``metrics(g)`` works for them)."""
        return list(self._swarm_states())

    def metrics(self, group: int = 0) -> dict[str, float]:
        """:func:`functional_bfo.metrics` of one group's swarm, as floats (one host transfer)."""
        if (state := self._swarm_states().get(group)) is None:
            raise ValueError(f"param group {group!r} has no swarm (yet: it starts at a step).")
        return fb.materialize(fb.metrics(state))

    def _swarm_states(self) -> dict[int, Any]:
        return {g: s for g, group in enumerate(self.param_groups) if group["params"]
                and (s := self.state.get(group["params"][0], {}).get("swarm")) is not None}


class BFO(SwarmOptimizer):
    """Canonical BFO (Passino 2002) over :func:`functional_bfo.bfo`; ``lr`` is ``step_size``.

    Examples:
        >>> import torch
        >>> from functional_bfo.adapters import BFO
        >>> w = torch.nn.Parameter(torch.zeros(3))
        >>> opt = BFO([w], population_size=8, lr=0.2, seed=0)
        >>> loss = opt.step(lambda: (w - 1).square().sum())  # a tensor, or a float
        >>> loss < 3.0 and opt.num_evals == 8 * 5 + 2
        True
    """

    factory, Hyperparams, LR = staticmethod(fb.bfo), fb.BFOHyperparams, "step_size"
    DEFAULTS: ClassVar[dict[str, Any]] = dict(
        lr=0.1, population_size=50, swim_length=4, swim_batch=1, chemotaxis_steps=100,
        reproduction_steps=4, elimination_prob=0.25, swarming=False, d_attract=0.1,
        w_attract=0.2, h_repel=0.1, w_repel=10.0, tumble="gaussian", levy_beta=1.5,
        bounds=None, boundary="reflect", init_scale=1.0, maximize=False, chunk_size=None)


class AdaptiveBFO(SwarmOptimizer):
    """Adaptive BFO over :func:`functional_bfo.adaptive_bfo`: step sizes adapt, up to ``lr``."""

    factory, Hyperparams = staticmethod(fb.adaptive_bfo), fb.AdaptiveBFOHyperparams
    LR = "step_size_max"
    DEFAULTS: ClassVar[dict[str, Any]] = dict(
        lr=1.0, population_size=32, step_size=0.1, step_size_min=1e-7, adaptation_rate=0.3,
        swim_length=4, swim_batch=1, chemotaxis_steps=10, elimination_prob=0.02,
        elimination_prob_max=0.25, stagnation_steps=20, min_population_size=None,
        tumble="gaussian", levy_beta=1.5, bounds=None, boundary="reflect",
        relative_steps=False, init_scale=1.0, maximize=False, chunk_size=None)


class HybridBFO(SwarmOptimizer):
    """Hybrid BFO over :func:`functional_bfo.hybrid_bfo`; ``lr`` is ``step_size_max``.

    Parameters with ``requires_grad`` (read at each step) bend the tumble toward their negative
    gradient (``.grad`` after the closure, or ``torch.func``'s); the others move by pure BFO.
    """

    factory, Hyperparams = staticmethod(fb.hybrid_bfo), fb.HybridBFOHyperparams
    LR, uses_grads = "step_size_max", True
    DEFAULTS: ClassVar[dict[str, Any]] = dict(
        AdaptiveBFO.DEFAULTS, gradient_weight=0.5, momentum=0.0, vanishing_threshold=1e-8,
        exploding_threshold=1e3)

def _loss_input(names: list[list[str] | None], values: list[list[Tensor]]) -> Any:
    """What ``loss_fn`` receives: ``{name: tensor}`` if built from named params, else a list."""
    if None not in names:
        return {n: v for ns, vs in zip(names, values) for n, v in zip(ns or [], vs)}
    return [v for vs in values for v in vs]


def _same(a: Any, b: Any) -> bool:
    """Equality for settings; tensors (bounds) are the same only as the same object."""
    try:
        return a is b or bool(a == b)
    except (RuntimeError, TypeError, ValueError):
        return False


def _agreed(seed: int | None) -> int:
    """``seed``, or one drawn from torch's global generator: rank 0's on every rank."""
    if seed is not None:
        return check_int("seed", seed, 0)
    box = [int(torch.randint(0, 2**31 - 1, ()).item())]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    return box[0]
