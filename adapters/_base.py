"""SwarmOptimizer: the ``torch.optim.Optimizer`` shell of BFO, AdaptiveBFO and HybridBFO.

Each param group is one swarm of the pure core (``fb.bfo`` and friends) over the group's
parameters. Its state lies in ``self.state[group's first parameter]["swarm"]``, as LBFGS keeps
its state with its first parameter, so torch's own ``state_dict``, ``load_state_dict`` and
their hooks serve it; the optimizer's counters lie under ``"optimizer"`` beside the first
swarm. Settings are read from ``group[...]`` at every step, as Adam reads ``group["lr"]``.
Every operation commits fully or changes nothing.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import optree
import torch
import torch.distributed as dist
from torch import Tensor

import functional_bfo as fb
from functional_bfo._checks import check_bool, check_int, compute_dtype
from functional_bfo._chemotaxis import rank_costs
from functional_bfo._stopping import Stopping
from functional_bfo._tree import diversity

from ._candidates import CandidateEvaluator, Trace, as_loss, write

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
STOPPING = ("best_cost", "stalled", "steps", "per_update", "reason")


def _count(x: Any) -> bool:
    return type(x) is int and x >= 0


def _real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


RECORD = {  # the optimizer's own state-dict entry, and what each value must be
    "seed": (_count, "an int >= 0"), "extra_evals": (_count, "an int >= 0"),
    "best": (lambda x: x is None or _real(x), "a float or None"),
    "best_cost": (_real, "a float"), "stalled": (_count, "an int >= 0"),
    "steps": (_count, "an int >= 0"),
    "per_update": (lambda x: x is None or (_real(x) and x >= 0), "a number >= 0 or None"),
    "reason": (lambda x: x in (None, "max_fe", "target_loss", "patience"),
               "None, 'max_fe', 'target_loss' or 'patience'"),
}


@dataclasses.dataclass
class _Swarm:
    """What a group's state is stepped with, built from the settings that state follows."""

    settings: dict[str, Any]  # after a load, only those that shape the swarm: the rest apply
    core: fb.Optimizer
    evaluator: CandidateEvaluator
    scorer: Any  # the evaluator, or a distributed one around it
    update: Callable[..., Any]  # the fast path's: core.update, compiled if asked
    mask: list[bool] | None = None  # the hybrid's requires_grad flags


class SwarmOptimizer(torch.optim.Optimizer):
    """A param-group-per-swarm ``torch.optim`` shell over a pure core optimizer.

    ``step(closure)`` writes each candidate into the parameters and calls the closure (float
    or one-element tensor; ``backward`` optional), then calls it once more at the best
    parameters, so what it logs, the buffers and ``.grad`` are the best's; ``step(loss_fn=f)``
    evaluates the whole population with ``torch.func.vmap`` instead. The parameters then
    hold the best values found, and ``step`` returns their loss. A step that raises (a
    closure error, Ctrl-C, an invalid setting) leaves parameters, buffers, swarms and
    counters as they were, and the exception keeps its type.

    Args:
        params: parameters, ``named_parameters()`` or param-group dicts, as for any torch
            optimizer; each group is its own swarm, the other groups held where they stand.
        seed: the swarms' random key; None draws it from torch's global generator once (so
            ``torch.manual_seed`` makes runs repeat), rank 0's draw under torch.distributed.
        compile: ``torch.compile(fullgraph=True)`` the core update of ``step(loss_fn=...)``:
            True or a mode of ``torch.compile``; a failure raises, never falls back.
        module: the model. Candidates leave no trace without it (the buffers of every module
            they run are put back); given, its buffers are also saved before any runs, and
            its train-mode normalization layers are known to the fast path from the start.
        evaluator: ``fb.distributed.sharded()`` or ``fb.distributed.data_parallel(...)``,
            so the ranks of a process group share the work and hold the same swarm.
        reevaluate: start each step by scoring the parameters as they stand (one
            evaluation), so minibatch noise or outside edits cannot freeze a stale best.
        max_fe: stop (``should_stop``) before an evaluation budget would be exceeded.
        target_loss: stop once the best loss reaches it.
        patience: stop after this many steps without the best improving by ``min_delta``.
        min_delta: the improvement that resets ``patience``.
        **settings: the class's ``DEFAULTS`` to change (every param group's unless it sets
            its own).
    """

    factory: ClassVar[Callable[..., fb.Optimizer]]
    State: ClassVar[type]  # the core's state NamedTuple
    Hyperparams: ClassVar[type]  # its hyperparameters: the settings a state holds as tensors
    LR: ClassVar[str]  # the core's name of torch's lr
    DEFAULTS: ClassVar[dict[str, Any]]
    uses_grads: ClassVar[bool] = False

    def __init__(self, params: Iterable[Any], *, seed: int | None = None,
                 compile: bool | str = False, module: torch.nn.Module | None = None,
                 evaluator: Any = None, reevaluate: bool = True, max_fe: int | None = None,
                 target_loss: float | None = None, patience: int | None = None,
                 min_delta: float = 0.0, **settings: Any) -> None:
        for key in settings:
            self._check_name(key, type(self).__name__)
        if compile not in (False, True, *COMPILE_MODES):
            raise ValueError(f"Invalid compile: {compile!r}; expected False, True or one of "
                             f"torch.compile's modes {list(COMPILE_MODES)}.")
        if evaluator is not None and not callable(getattr(evaluator, "around", None)):
            raise TypeError(f"evaluator must be fb.distributed.sharded(...) or "
                            f"fb.distributed.data_parallel(...); got {evaluator!r}.")
        self._mode = "default" if compile is True else compile or None
        self._reevaluate = check_bool("reevaluate", reevaluate)
        self._stopping = Stopping(budget=max_fe, target_loss=target_loss, patience=patience,
                                  min_delta=min_delta, budget_name="max_fe")
        self._seed, self._distributed, self._trace = _agreed(seed), evaluator, Trace(module)
        self._swarms: dict[int, _Swarm] = {}
        self._best: float | None = None
        self._extra_evals = 0  # the passes that end closure steps at the best
        self._last_step_evals = 0
        self._closure: Callable[[], Any] | None = None
        self._loading: Any = None
        self._warned_pause = False
        super().__init__(params, {**self.DEFAULTS, **settings})
        self.register_load_state_dict_pre_hook(type(self)._check_load)
        self.register_load_state_dict_post_hook(type(self)._finish_load)
        self._write_record()

    def _check_name(self, key: Any, where: str) -> None:
        if key in (self.LR, "elim_prob"):
            raise TypeError(f"{where} got {key!r}: {type(self).__name__} names it "
                            f"{'lr' if key == self.LR else 'elimination_prob'}.")
        if where == type(self).__name__ and key not in self.DEFAULTS:
            raise TypeError(f"{where} got an unexpected setting {key!r}; its settings are "
                            f"{sorted(self.DEFAULTS)}.")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (its own swarm); nothing is added unless its settings are valid."""
        for key in param_group if isinstance(param_group, dict) else ():
            self._check_name(key, "A param group")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            if len({p.device for p in group["params"]}) > 1:
                raise ValueError("A param group's parameters must share one device; put them "
                                 "in separate groups.")
            for p in group["params"]:
                if not p.is_floating_point():
                    raise TypeError(f"BFO optimizes floating parameters; got a {p.dtype} "
                                    f"tensor of shape {tuple(p.shape)}.")
            self._build(group)  # the core factory checks the settings
        except BaseException:
            self.param_groups.pop()
            raise

    def _settings(self, group: dict[str, Any]) -> dict[str, Any]:
        return {k: group[k].item() if isinstance(group[k], Tensor) and group[k].numel() == 1
                else group[k] for k in self.DEFAULTS}

    def _build(self, group: dict[str, Any], applied: bool = True) -> _Swarm:
        """The core and evaluators of a group's settings (which the core factory checks)."""
        settings = self._settings(group)
        kwargs = {self.LR if k == "lr" else k: v for k, v in settings.items()
                  if k != "chunk_size"}
        if self.uses_grads:  # the mask follows requires_grad (fb.with_grad_mask at each step)
            kwargs["grad_mask"] = False
        evaluator = CandidateEvaluator(group["params"], self._trace, self.uses_grads)
        scorer = evaluator if self._distributed is None else self._distributed.around(
            evaluator, self.uses_grads)
        core = type(self).factory(**kwargs, evaluator=scorer)
        update = core.update if self._mode is None else torch.compile(
            core.update, fullgraph=True, mode=self._mode)
        if not applied:
            settings = {k: v for k, v in settings.items() if k not in self._dynamic()}
        return _Swarm(settings, core, evaluator, scorer, update)

    def _dynamic(self) -> set[str]:
        return {"lr" if f == self.LR else f for f in self.Hyperparams._fields}

    # ----- the step -----------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None, *,
             loss_fn: Callable[[Any], Tensor] | None = None) -> float:
        """One chemotactic step of every param group's swarm; the best loss.

        Args:
            closure: evaluates the model as it stands and returns the loss (float or
                one-element tensor); it may call ``zero_grad`` and ``backward``. Called once
                per candidate, with the candidate written into the parameters.
            loss_fn: instead of a closure, ``loss_fn(params) -> 0-d tensor`` for the whole
                population at once under ``torch.func.vmap``: ``params`` is a dict
                ``{name: tensor}`` if the optimizer was built from ``named_parameters()``,
                else a list in parameter order (the fast path; compiled with ``compile``).

        Returns:
            The best loss of the last group stepped, as a float (NaN before any step).
        """
        pending = closure is None and loss_fn is None
        if pending:  # a framework's closure-less step, with the closure set beforehand
            closure = self._closure
        if (closure is None) == (loss_fn is None):
            raise TypeError(f"{type(self).__name__}.step needs exactly one of a closure "
                            "(opt.step(closure), the closure returning the loss) or "
                            "loss_fn=... (the vmapped fast path). A framework that calls "
                            "step() itself needs the closure set first: "
                            "opt.set_closure(closure), as functional_bfo.adapters' glue does.")
        if not callable(closure if closure is not None else loss_fn):
            raise TypeError(f"Invalid closure or loss_fn: {closure or loss_fn!r}; expected a "
                            "callable.")
        if closure is not None and self._mode is not None:
            raise ValueError("compile= compiles the vmapped fast path, step(loss_fn=...); a "
                             "closure runs Python per candidate. Use compile=False with "
                             "closures.")
        before = self.num_evals
        if not self.should_stop:
            self._step_all(closure, loss_fn)
        if pending:
            self._closure = None  # used up: the next closure-less step needs a new one
        self._last_step_evals = self.num_evals - before
        return math.nan if self._best is None else self._best

    def set_closure(self, closure: Callable[[], Any] | None) -> None:
        """The closure the next ``step()`` called without arguments evaluates with.

        For frameworks that call ``optimizer.step()`` themselves (Transformers, fastai, a
        ``GradScaler``). A step that succeeds uses it up; one that fails keeps it.
        """
        if closure is not None and not callable(closure):
            raise TypeError(f"Invalid closure: {closure!r}; expected a callable or None.")
        self._closure = closure

    @property
    def closure_pending(self) -> bool:
        """Whether a closure set by :meth:`set_closure` waits for the next ``step()``."""
        return self._closure is not None

    def _step_all(self, closure: Any, loss_fn: Any) -> None:
        """Step every group; commit all of it, or restore everything and raise."""
        groups = self.param_groups
        start = [[p.detach().clone() for p in group["params"]] for group in groups]
        self._trace.begin()
        new: dict[int, tuple[Any, _Swarm]] = {}
        g = 0
        try:
            for g, group in enumerate(groups):
                if group["params"] and not self._paused(g, group):
                    new[g] = self._advance(g, group, closure, loss_fn)
                    write(group["params"], new[g][0].best_params)
            settled = bool(new) and self._settle(closure, loss_fn)
        except BaseException as e:
            for group, values in zip(groups, start):
                write(group["params"], values)
            self._trace.restore()
            compiled = " (compiled: compile=False runs it eagerly)" if (
                self._mode and closure is None) else ""
            e.add_note(f"(raised while {type(self).__name__} stepped param group {g}"
                       f"{compiled}; the parameters, buffers, swarms and counters were "
                       "restored to where they were before this step)")
            raise
        if not new:
            return
        for g, (state, swarm) in new.items():
            self._put(groups[g]["params"][0], swarm=_pack(state))
            self._swarms[g] = swarm
        self._extra_evals += settled
        self._best = float(state.best_loss)  # the last group's: it saw every group's best
        self._stopping.maximize = bool(swarm.settings["maximize"])
        self._stopping.record(self.num_evals, self._best, self._per_update(closure))
        self._write_record()

    def _paused(self, g: int, group: dict[str, Any]) -> bool:
        """``lr == 0`` (a schedule's end or a warmup's start) pauses the group, warned once."""
        if group["lr"] != 0:
            return False
        if not self._warned_pause:
            self._warned_pause = True
            warnings.warn(f"{type(self).__name__}: param group {g} has lr=0, so it is paused "
                          "(no evaluations, parameters unchanged) until lr is positive again.",
                          RuntimeWarning, stacklevel=4)
        return True

    def _advance(self, g: int, group: dict[str, Any], closure: Any,
                 loss_fn: Any) -> tuple[Any, _Swarm]:
        """The group's next state and what made it; changes nothing."""
        params, settings = group["params"], self._settings(group)
        entry = self.state.get(params[0], {}).get("swarm")
        if entry is None:  # the swarm starts here, from the settings and params as they are
            swarm = self._build(group)
            key = fb.random.fold_in(fb.random.key(self._seed), g).to(params[0].device)
            state = swarm.core.init([p.detach().clone() for p in params], key=key)
        else:
            swarm, dynamic = self._swarms[g], self._dynamic()
            fixed = sorted(k for k, v in swarm.settings.items()
                           if k not in dynamic | {"chunk_size"} and not _same(v, settings[k]))
            if fixed:
                raise ValueError(f"param_groups[{g}]: {fixed} cannot change after the group's "
                                 f"first step (they shape the swarm); only {sorted(dynamic)} "
                                 "can. Set them back, or build a new optimizer.")
            state = _unpack(entry, self.State, self.Hyperparams)
            changed = {self.LR if k == "lr" else k: settings[k] for k in dynamic
                       if k not in swarm.settings or not _same(swarm.settings[k], settings[k])}
            if changed:
                state = fb.with_hyperparams(state, **changed)
            swarm = dataclasses.replace(swarm, settings=settings)
        if self.uses_grads:
            mask = [bool(p.requires_grad) for p in params]
            if mask != swarm.mask:
                state, swarm.mask = fb.with_grad_mask(state, mask), mask
        loss = closure if closure is not None else self._group_loss(g, loss_fn)
        swarm.evaluator.closure, swarm.evaluator.chunk_size = closure, settings["chunk_size"]
        try:
            if self._reevaluate:
                state = self._rescore(state, swarm, loss, entry is None, settings["maximize"])
            if closure is not None:
                return swarm.core.update(state, closure), swarm
            with self._trace.scoring(hook=False):
                return swarm.update(state, loss), swarm
        finally:
            swarm.evaluator.closure = None

    def _rescore(self, state: Any, swarm: _Swarm, loss: Any, first: bool,
                 maximize: bool) -> Any:
        """Score the parameters as they stand (one evaluation) on this step's objective.

        Before the first update they are bacterium 0 (``fb.with_start_loss``: the hybrid's
        first tumble follows the gradient there). Later they become the best to beat, so a
        lucky minibatch never freezes the model and an outside edit is scored honestly.
        """
        current = ([x[0] for x in state.population] if first  # the start, inside bounds
                   else [p.detach() for p in swarm.evaluator.params])
        with self._trace.scoring(hook=True):
            out = swarm.scorer(loss, [x.unsqueeze(0) for x in current])
        value, grads = out if self.uses_grads else (out, None)
        value = value[0]
        if first:
            return fb.with_start_loss(state, value, grad=grads and [x[0] for x in grads])
        sign = -1.0 if maximize else 1.0
        best = sign * rank_costs(value.detach().to(state.best_loss.dtype), sign)
        return state._replace(best_params=[x.clone() for x in current], best_loss=best,
                              num_evals=state.num_evals + 1)

    def _settle(self, closure: Any, loss_fn: Any) -> bool:
        """End the step as one ordinary evaluation at the best params leaves the model.

        The candidates' buffers are put back; then the closure runs once more (its logs,
        buffers and gradients are the best's), or on the fast path ``loss_fn`` does when a
        train-mode module with buffers ran (its running statistics take one pass).
        """
        self._trace.restore()
        if closure is not None:
            with torch.enable_grad():
                as_loss(closure())
        elif self._trace.train_buffers():
            with torch.no_grad():
                loss_fn(_loss_input([g.get("param_names") for g in self.param_groups],
                                    [[p.detach() for p in g["params"]] for g in self.param_groups]))
        else:
            return False
        return True

    def _group_loss(self, g: int, loss_fn: Callable[[Any], Tensor]) -> Callable[..., Tensor]:
        """``loss_fn`` as a function of group ``g``'s leaves, the other groups as they stand."""
        values = [[p.detach() for p in group["params"]] for group in self.param_groups]
        names = [group.get("param_names") for group in self.param_groups]

        def group_loss(leaves: list[Tensor]) -> Tensor:
            return loss_fn(_loss_input(names, [leaves if i == g else v
                                               for i, v in enumerate(values)]))

        return group_loss

    def _per_update(self, closure: Any) -> int:
        """The most evaluations the next step can take."""
        total = int(closure is not None or self._trace.train_buffers())
        for group in self.param_groups:
            if group["params"] and group["lr"] != 0:
                total += group["population_size"] * (group["swim_length"] + 1)
                total += self._reevaluate
        return total

    # ----- checkpoints: torch's state_dict, the swarms kept exact ----------------------------

    def _write_record(self) -> None:
        anchor = next(p for group in self.param_groups for p in group["params"])
        self._put(anchor, optimizer={
            "class": type(self).__name__, "seed": self._seed, "best": self._best,
            "extra_evals": self._extra_evals,
            **{k: getattr(self._stopping, k) for k in STOPPING}})

    def _put(self, param: Tensor, **entries: Any) -> None:
        """A new entry, not an edit: a state dict taken earlier keeps what it held."""
        self.state[param] = {**self.state.get(param, {}), **entries}

    def _check_load(self, state_dict: dict[str, Any]) -> None:
        """Check a state dict before torch changes anything, and keep its swarms exact.

        torch casts a state's floating-point tensors to its parameter's dtype (right for
        Adam's moments, lossy for a swarm's int64 key or float32 losses beside float16
        weights), so the swarms are read here and put back by :meth:`_finish_load`.
        """
        name = type(self).__name__
        try:
            entries, groups = state_dict["state"], state_dict["param_groups"]
            record = dict(entries[0]["optimizer"])
            saved = [{**g, "params": mine["params"]} for g, mine in zip(groups,
                                                                        self.param_groups)]
            sizes = [len(g["params"]) for g in groups]
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise ValueError(f"Not a functional_bfo adapter state dict ({type(e).__name__}: "
                             f"{e}); write one with {name}.state_dict().") from None
        if record.get("class") != name:
            raise ValueError(f"This state dict is from {record.get('class')}, not {name}; "
                             f"load it into a {record.get('class')}.")
        for key, (valid, what) in RECORD.items():
            if key not in record or not valid(record[key]):
                raise ValueError(f"The state dict's state[0]['optimizer'][{key!r}] is "
                                 f"{record.get(key)!r:.60} but should be {what}.")
        mine = [len(g["params"]) for g in self.param_groups]
        if sizes != mine:
            raise ValueError(f"The state dict has param groups of {sizes} parameters, this "
                             f"optimizer {mine}; build the optimizer over the same parameters.")
        swarms = {}
        for g, (group, indices) in enumerate(zip(saved, [g["params"] for g in groups])):
            entry = entries.get(indices[0], {}).get("swarm") if indices else None
            if entry is None:
                continue
            try:
                swarm = self._build(group, applied=False)
            except KeyError as e:
                raise ValueError(f"The state dict's param_groups[{g}] lacks the setting {e}; "
                                 f"it was not written by {name}.state_dict().") from None
            key = fb.random.fold_in(fb.random.key(record["seed"]), g)
            like = swarm.core.init([p.detach() for p in group["params"]],
                                   key=key.to(group["params"][0].device))
            state = _read(entry, like, f"state[{indices[0]}]['swarm']")
            swarms[g] = (state, dataclasses.replace(
                swarm, mask=[bool(m) for m in state.grad_mask] if self.uses_grads else None))
        self._loading = swarms, record

    def _finish_load(self) -> None:
        swarms, record = self._loading
        self._loading = None
        for g, group in enumerate(self.param_groups):
            if group["params"]:
                self._put(group["params"][0], swarm=_pack(swarms[g][0]) if g in swarms else None)
        self._swarms = {g: swarm for g, (_, swarm) in swarms.items()}
        self._seed, self._best = record["seed"], record["best"]
        self._extra_evals = record["extra_evals"]
        for k in STOPPING:
            setattr(self._stopping, k, record[k])
        self._write_record()

    # ----- budgets and early stopping -----------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """Whether ``max_fe``, ``target_loss`` or ``patience`` fired (``step`` then waits)."""
        return self._stopping.reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why ``should_stop`` became True: ``"max_fe"``, ``"target_loss"`` or ``"patience"``."""
        return self._stopping.reason

    @property
    def num_evals(self) -> int:
        """Loss evaluations (closure or loss_fn calls per candidate) so far, all groups."""
        return sum(int(e["num_evals"]) for e in self._entries().values()) + self._extra_evals

    @property
    def last_step_evals(self) -> int:
        """Evaluations the last ``step()`` call made (0: paused or stopped, nothing to log)."""
        return self._last_step_evals

    @property
    def stepped_groups(self) -> list[int]:
        """The param groups whose swarm has started (``metrics(g)`` works for them)."""
        return list(self._entries())

    def metrics(self, group: int = 0) -> dict[str, float]:
        """:func:`functional_bfo.metrics` of one group's swarm, as floats (one host transfer)."""
        n = len(self.param_groups)
        if not 0 <= group < n:
            raise ValueError(f"There is no param group {group}; this optimizer has {n} "
                             f"(0 to {n - 1}).")
        entry = self._entries().get(group)
        if entry is None:
            raise ValueError(f"param group {group} has not stepped yet; call step first.")
        return fb.materialize(fb.metrics(_unpack(entry, self.State, self.Hyperparams)))

    def _entries(self) -> dict[int, dict[str, Any]]:
        """The swarm of each group that has one, by group index."""
        found = {g: self.state.get(group["params"][0], {}).get("swarm") if group["params"]
                 else None for g, group in enumerate(self.param_groups)}
        return {g: entry for g, entry in found.items() if entry is not None}

    # ----- what the seeds' loops read -----------------------------------------------------

    @property
    def best_fitness(self) -> float | None:
        """The best loss returned by the last ``step`` (None before the first)."""
        return self._best

    @property
    def best_params(self) -> list[Tensor]:
        """Copies of the best parameters, in parameter order (the model holds them too)."""
        return [p.detach().clone() for group in self.param_groups for p in group["params"]]

    @property
    def population(self) -> Tensor:
        """Every bacterium's parameters flattened, shape (population_size, n_params)."""
        leaves = [x for e in self._entries().values() for x in e["population"]]
        if not leaves:
            raise ValueError("There is no population before the first step; call step first.")
        if len({x.shape[0] for x in leaves}) > 1:
            raise ValueError("The param groups have different population sizes; read each "
                             "group's swarm with opt.metrics(group).")
        dtype = compute_dtype(leaves)
        return torch.cat([x.reshape(x.shape[0], -1).to(dtype) for x in leaves], dim=1)

    def diversity(self) -> float:
        """Root-mean-square distance of the bacteria to their centroid, all groups."""
        population = self.population
        return float(diversity([population], population.dtype))

    _compute_diversity = diversity  # the seeds' name for it


def _pack(state: Any) -> dict[str, Any]:
    """A core state as plain dicts and lists of tensors (``torch.load(weights_only=True)``)."""
    return {**state._asdict(), "hyperparams": state.hyperparams._asdict()}


def _unpack(entry: dict[str, Any], state_type: type, hyperparams_type: type) -> Any:
    return state_type(**{**entry, "hyperparams": hyperparams_type(**entry["hyperparams"])})


def _read(entry: Any, like: Any, where: str) -> Any:
    """The state packed in ``entry``, checked against ``like`` and put on its device."""
    refs, spec = optree.tree_flatten(_pack(like))
    try:
        leaves = spec.flatten_up_to(entry)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where} does not hold this optimizer's swarm ({e}); it was not "
                         "written by state_dict() of this optimizer.") from None
    for x, ref in zip(leaves, refs):
        if not isinstance(x, Tensor) or x.shape != ref.shape or x.dtype != ref.dtype:
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, Tensor) else repr(x)[:40]
            raise ValueError(f"{where} holds {got} where this optimizer's swarm has {ref.dtype} "
                             f"{tuple(ref.shape)}; the population size or the parameters differ.")
    return _unpack(spec.unflatten([x.to(r.device) for x, r in zip(leaves, refs)]),
                   type(like), type(like.hyperparams))


def _loss_input(names: list[list[str] | None], values: list[list[Tensor]]) -> Any:
    """What ``loss_fn`` receives: ``{name: tensor}`` if built from named params, else a list."""
    if all(n is not None for n in names):
        return {n: v for ns, vs in zip(names, values) for n, v in zip(ns, vs)}
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
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    if not (dist.is_available() and dist.is_initialized()):
        return seed
    nccl = dist.get_backend() == "nccl"
    value = torch.tensor([seed], device=torch.device("cuda", torch.cuda.current_device())
                         if nccl else "cpu")
    dist.broadcast(value, src=0)
    return int(value.item())
