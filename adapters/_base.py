"""SwarmOptimizer: the ``torch.optim.Optimizer`` shell shared by BFO, AdaptiveBFO and HybridBFO.

Each param group is one swarm of the pure core (``fb.bfo`` and friends) over that group's
parameters; the shell only moves values between the model and the core's state, keeps the
core's state between steps, and turns hyperparameter edits into ``fb.with_hyperparams``.
It never implements any part of the algorithm itself.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import optree
import torch
from torch import Tensor

import functional_bfo as fb
from functional_bfo._checks import check_bool, check_int, compute_dtype
from functional_bfo._chemotaxis import rank_costs
from functional_bfo._state import from_dict, to_dict
from functional_bfo._stopping import Stopping
from functional_bfo._tree import diversity

from ._closure import ClosureEvaluator, as_loss, stack_losses, write

logger = logging.getLogger("functional_bfo.adapters")

FORMAT = "functional_bfo.adapters/1"
ADAPTER_ONLY = ("chunk_size",)  # group settings the shell turns into an evaluator


@dataclass
class _Swarm:
    """One param group's core optimizer and state, and what the shell remembers of it."""

    closure_core: fb.Optimizer  # evaluates with the closure, one call per bacterium
    evaluator: ClosureEvaluator
    state: Any
    update_fast: Callable[..., Any]  # the vmapped core's update (compiled with compile=True)
    updates: int = 0
    loss_cache: tuple[Any, Any] | None = None  # (user loss_fn, its per-group wrapper)
    mask: list[bool] = field(default_factory=list)


class SwarmOptimizer(torch.optim.Optimizer):
    """A param-group-per-swarm ``torch.optim`` shell over a pure core optimizer.

    Each param group is its own swarm over that group's parameters (the other groups held at
    their current values). ``step(closure)`` writes each candidate into the parameters and
    calls the closure (float or one-element tensor; ``backward`` optional); ``step(loss_fn=f)``
    evaluates the whole population with ``torch.func.vmap`` instead. After ``step`` the
    parameters hold the best values found and the best loss is returned.

    Args:
        params: parameters or ``named_parameters()`` or param-group dicts, as for any
            ``torch.optim`` optimizer.
        seed: the swarm's random key; None draws it from torch's global generator once, so
            ``torch.manual_seed`` makes runs repeat.
        compile: compile the core update of ``step(loss_fn=...)`` with
            ``torch.compile(fullgraph=True)`` (logged; a failure raises, never falls back).
        device: where the parameters must be (checked; they are never moved).
        reevaluate: start each step by scoring the parameters as they stand (one extra
            evaluation), so minibatch noise or outside edits cannot freeze a stale best.
        max_fe: stop (``should_stop``) before an evaluation budget would be exceeded.
        target_loss: stop once the best loss reaches it.
        patience: stop after this many steps without the best improving by ``min_delta``.
        min_delta: the improvement that resets ``patience``.
        **hyperparams: every other keyword argument of the core factory (``chunk_size``
            bounds the vmapped fast path's batch).
    """

    factory: ClassVar[Callable[..., fb.Optimizer]]
    core_hyperparams: ClassVar[type]  # the core's Hyperparams NamedTuple: its fields are dynamic
    aliases: ClassVar[dict[str, str]]  # seed / torch.optim name -> core name
    uses_grads: ClassVar[bool] = False

    def __init__(
        self,
        params: Iterable[Any],
        *,
        seed: int | None = None,
        compile: bool = False,
        device: torch.device | str | None = None,
        reevaluate: bool = True,
        max_fe: int | None = None,
        target_loss: float | None = None,
        patience: int | None = None,
        min_delta: float = 0.0,
        **hyperparams: Any,
    ) -> None:
        name = type(self).__name__
        check_bool("compile", compile)
        check_bool("reevaluate", reevaluate)
        # The stopping rules fb.run uses too (validated there).
        self._stopping = Stopping(budget=max_fe, target_loss=target_loss, patience=patience,
                                  min_delta=min_delta, budget_name="max_fe")
        if seed is None:  # one draw from torch's generator: torch.manual_seed governs it
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        check_int("seed", seed, 0)
        self._seed, self._compile, self._reevaluate = seed, compile, reevaluate
        self._device = None if device is None else torch.device(device)
        defaults = self._defaults(hyperparams, name)
        self._swarms: list[_Swarm | None] = []
        self._seen: list[dict[str, Any]] = []
        self._defaults_seen = dict(defaults)
        self._best: float | None = None
        super().__init__(params, defaults)

    # ----- construction -------------------------------------------------------------------

    @classmethod
    def _signature(cls) -> dict[str, Any]:
        """The core factory's keyword defaults (hybrid: with adaptive_bfo's), minus evaluator."""
        out: dict[str, Any] = {}
        for fn in (fb.adaptive_bfo, cls.factory) if cls.uses_grads else (cls.factory,):
            for p in inspect.signature(fn).parameters.values():
                if p.kind is not p.VAR_KEYWORD and p.name not in ("evaluator", "grad_mask"):
                    out[p.name] = p.default
        out.setdefault("chunk_size", None)
        return out

    def _defaults(self, given: dict[str, Any], name: str) -> dict[str, Any]:
        defaults = self._signature()
        unknown = sorted(set(given) - set(defaults) - set(self.aliases))
        if unknown:
            raise TypeError(f"{name} got unexpected hyperparameters {unknown}; valid ones are "
                            f"{sorted(defaults) + sorted(self.aliases)}.")
        defaults.update(given)
        self._settle_aliases(defaults, set(given), name)
        return defaults

    def _settle_aliases(self, d: dict[str, Any], given: set[str], where: str) -> None:
        """Make each alias and its core name agree in ``d``; the one in ``given`` wins."""
        for alias, canonical in self.aliases.items():
            if alias in given and canonical in given and not _same(d[alias], d[canonical]):
                raise ValueError(f"{where} sets {alias}={d[alias]!r} and {canonical}="
                                 f"{d[canonical]!r}; they are the same setting, pass one.")
            if alias in given:
                d[canonical] = d[alias]
            else:
                d[alias] = d[canonical]

    def _core(self, values: dict[str, Any], evaluator: Any) -> fb.Optimizer:
        """The pure core optimizer for one group's settings (validates them)."""
        kwargs = {k: v for k, v in values.items() if k not in ADAPTER_ONLY}
        chunk = values.get("chunk_size")
        if self.uses_grads:
            if evaluator is None:
                return type(self).factory(**kwargs, chunk_size=chunk)
            return type(self).factory(**kwargs, evaluator=evaluator)
        if evaluator is None:
            evaluator = fb.evaluate.vmap(chunk)
        return type(self).factory(**kwargs, evaluator=evaluator)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (its own swarm); its settings are validated now."""
        given = set(param_group) if isinstance(param_group, dict) else set()
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self._settle_aliases(group, given, "A param group")
        params = group["params"]
        devices = {p.device for p in params}
        if len(devices) > 1:
            raise ValueError(f"A param group's parameters must share one device; got "
                             f"{sorted(map(str, devices))}. Put them in separate groups.")
        want = self._device
        for device in devices:
            if want is not None and (device.type != want.type or (
                    want.index is not None and device.index != want.index)):
                raise ValueError(f"device={want} but the parameters are on {device}; move "
                                 "the model first (model.to(device)).")
        for p in params:
            if not p.is_floating_point():
                raise TypeError(f"BFO optimizes floating parameters; got a {p.dtype} tensor "
                                f"of shape {tuple(p.shape)}.")
        self._core(self._values(group), None)  # raises on invalid settings
        self._swarms.append(None)
        self._seen.append(dict(group))

    # ----- hyperparameters ----------------------------------------------------------------

    def _values(self, group: dict[str, Any]) -> dict[str, Any]:
        return {k: group[k] for k in self._signature()}

    def _reconcile(self, d: dict[str, Any], seen: dict[str, Any], where: str) -> set[str]:
        """Make aliases agree in ``d`` (the one edited since ``seen`` wins); return edits."""
        changed = {k for k in self.defaults if k in d and not _same(d[k], seen.get(k))}
        for alias, canonical in self.aliases.items():
            if alias in changed and canonical in changed and not _same(d[alias], d[canonical]):
                raise ValueError(f"{where}: {alias}={d[alias]!r} and {canonical}="
                                 f"{d[canonical]!r} were both changed; they are the same "
                                 "setting, change one.")
            if alias in changed:
                d[canonical] = d[alias]
                changed.add(canonical)
            elif canonical in changed:
                d[alias] = d[canonical]
        return {self.aliases.get(k, k) for k in changed}

    def _sync(self, g: int, group: dict[str, Any]) -> dict[str, Any]:
        """Apply edits of ``defaults`` and of this group since its last step; return them.

        An edit of ``defaults`` reaches every group, as the seed's BFOScheduler expects.
        """
        from_defaults = self._reconcile(self.defaults, self._defaults_seen, "defaults")
        if from_defaults:
            for other in self.param_groups:
                for k in from_defaults:
                    other[k] = self.defaults[k]
                for alias, canonical in self.aliases.items():
                    other[alias] = other[canonical]
            self._defaults_seen = dict(self.defaults)
        edits = self._reconcile(group, self._seen[g], f"param_groups[{g}]")
        return {k: group[k] for k in edits}

    def _apply(self, g: int, swarm: _Swarm, edits: dict[str, Any]) -> None:
        if not edits:
            return
        dynamic = set(self.core_hyperparams._fields)
        fixed = sorted(set(edits) - dynamic)
        if fixed:
            raise ValueError(f"param_groups[{g}]: {fixed} cannot change after the group's first "
                             f"step (they shape the swarm); only {sorted(dynamic)} can. Build a "
                             "new optimizer to change them.")
        swarm.state = fb.with_hyperparams(swarm.state, **edits)

    # ----- the step -----------------------------------------------------------------------

    def _swarm(self, g: int, group: dict[str, Any]) -> _Swarm:
        swarm = self._swarms[g]
        if swarm is not None:
            return swarm
        params = group["params"]
        values = self._values(group)
        fast = self._core(values, None)  # vmapped: step(loss_fn=...)
        evaluator = ClosureEvaluator(params, with_grads=self.uses_grads)
        key = fb.random.fold_in(fb.random.key(self._seed), g)
        if params:
            key = key.to(params[0].device)
        state = fast.init([p.detach().clone() for p in params], key=key)
        update = fast.update
        if self._compile:
            logger.info("%s: compiling the update of param group %d with "
                        "torch.compile(fullgraph=True); the first step(loss_fn=...) pays "
                        "the compile time.", type(self).__name__, g)
            update = torch.compile(fast.update, fullgraph=True)
        swarm = _Swarm(self._core(values, evaluator), evaluator, state, update)
        self._swarms[g] = swarm
        return swarm

    def step(self, closure: Callable[[], Any] | None = None, *,
             loss_fn: Callable[[Any], Tensor] | None = None,
             max_fe: int | None = None) -> float:
        """One chemotactic step of every param group's swarm; returns the best loss.

        Args:
            closure: evaluates the model as it stands and returns the loss (float or
                one-element tensor); it may call ``zero_grad`` and ``backward``. Called once
                per candidate, with the candidate written into the parameters.
            loss_fn: instead of a closure, ``loss_fn(params) -> 0-d tensor`` for a whole
                population at once under ``torch.func.vmap``: ``params`` is a dict
                ``{name: tensor}`` if the optimizer was built from ``named_parameters()``,
                else a list in parameter order (the fast path; compiled with ``compile=True``).
            max_fe: run steps until the next would take this call past ``max_fe``
                evaluations (at least one step), instead of exactly one.

        Returns:
            The best loss of the last group stepped, as a float; the parameters hold the
            best values found.
        """
        if (closure is None) == (loss_fn is None):
            raise TypeError(f"{type(self).__name__}.step needs exactly one of a closure "
                            "(opt.step(closure), the closure returning the loss) or "
                            "loss_fn=... (the vmapped fast path); BFO cannot step without "
                            "evaluating candidates.")
        if not callable(closure if closure is not None else loss_fn):
            raise TypeError(f"Invalid {'closure' if closure is not None else 'loss_fn'}: "
                            f"{(closure if closure is not None else loss_fn)!r}; expected a "
                            "callable.")
        if closure is not None and self._compile:
            raise ValueError("compile=True compiles the vmapped fast path, step(loss_fn=...); "
                             "a closure runs Python per candidate (.item(), backward) and "
                             "cannot be captured in one graph. Use compile=False with "
                             "closures.")
        if max_fe is not None:
            check_int("max_fe", max_fe, 1)
        spent, per_update = 0, None
        while not self.should_stop:
            if max_fe is not None and per_update is not None and spent + per_update > max_fe:
                break
            before = self.num_evals
            for g, group in enumerate(self.param_groups):
                self._best = self._step_group(g, group, closure, loss_fn)
            per_update = self.num_evals - before
            spent += per_update
            self._stopping.maximize = bool(self.defaults.get("maximize"))
            self._stopping.record(self.num_evals,
                                  math.nan if self._best is None else self._best, per_update)
            if max_fe is None:
                break
        return math.nan if self._best is None else self._best

    def _step_group(self, g: int, group: dict[str, Any], closure: Any, loss_fn: Any) -> float:
        params = group["params"]
        if not params:
            return math.nan if self._best is None else self._best
        edits = self._sync(g, group)
        built_now = self._swarms[g] is None  # then built from the settings as they are now
        swarm = self._swarm(g, group)
        if not built_now:
            self._apply(g, swarm, edits)
        self._seen[g] = dict(group)
        if self.uses_grads:
            mask = [bool(p.requires_grad) for p in params]
            if mask != swarm.mask:
                swarm.state, swarm.mask = fb.with_grad_mask(swarm.state, mask), mask
        start = [p.detach().clone() for p in params]
        if closure is not None:
            swarm.evaluator.closure = closure
            update, loss = swarm.closure_core.update, closure
        else:
            update, loss = swarm.update_fast, self._group_loss(g, swarm, loss_fn)
        try:
            state = swarm.state
            if self._reevaluate and swarm.updates > 0:
                sign = -1.0 if group["maximize"] else 1.0
                state = self._reanchor(state, swarm, start, closure, loss, sign)
            state = self._call(update, state, loss)
        except BaseException as e:
            write(params, start)  # a failed step leaves the model as it found it
            if hasattr(e, "add_note"):
                e.add_note(f"(raised while {type(self).__name__} evaluated candidates of "
                           f"param group {g}, step {swarm.updates}; the parameters were "
                           "restored to their values before the step)")
            raise
        finally:
            swarm.evaluator.closure = None
        swarm.state, swarm.updates = state, swarm.updates + 1
        write(params, state.best_params)
        return float(state.best_loss)

    def _call(self, update: Callable[..., Any], state: Any, loss: Any) -> Any:
        try:
            return update(state, loss)
        except Exception as e:  # its type kept; compiled, a note says what ran
            if self._compile:
                e.add_note(f"{type(self).__name__}(compile=True): the update ran under "
                           "torch.compile(fullgraph=True), with this loss_fn; nothing falls "
                           "back to eager. Pass compile=False to run eagerly.")
            raise

    def _reanchor(self, state: Any, swarm: _Swarm, current: list[Tensor], closure: Any,
                  loss: Any, sign: float) -> Any:
        """The model's current parameters become the best, scored on this step's objective.

        A fixed objective gives the stored best loss back; a new minibatch, an edit of the
        model, or another group's move gives an honest one, so a lucky batch never freezes
        the model.
        """
        if closure is not None:
            write(swarm.evaluator.params, current)
            with torch.enable_grad():
                value = stack_losses([as_loss(closure())], current[0].device)[0]
        else:
            with torch.no_grad():
                value = loss(current)
        dtype = state.best_loss.dtype
        best = sign * rank_costs(torch.as_tensor(value).to(dtype), sign)
        return state._replace(best_params=[x.clone() for x in current], best_loss=best,
                              num_evals=state.num_evals + 1)

    def _group_loss(self, g: int, swarm: _Swarm, loss_fn: Callable[[Any], Tensor]):
        """``loss_fn`` as a function of group ``g``'s leaves, other groups as they stand.

        Cached per user ``loss_fn`` so a compiled update sees the same function each step.
        """
        if swarm.loss_cache is not None and swarm.loss_cache[0] is loss_fn:
            return swarm.loss_cache[1]
        groups = [[p.detach() for p in group["params"]] for group in self.param_groups]
        names = [group.get("param_names") for group in self.param_groups]

        def group_loss(leaves: list[Tensor]) -> Tensor:
            values = [leaves if i == g else other for i, other in enumerate(groups)]
            if all(n is not None for n in names):
                return loss_fn({n: v for ns, vs in zip(names, values) for n, v in zip(ns, vs)})
            return loss_fn([v for vs in values for v in vs])

        swarm.loss_cache = (loss_fn, group_loss)
        return group_loss

    # ----- budgets and early stopping -----------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """True once ``max_fe``, ``target_loss`` or ``patience`` fired (``stop_reason``).

        ``step`` then evaluates nothing and returns the best loss.
        """
        return self._stopping.reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why ``should_stop`` became True: ``"max_fe"``, ``"target_loss"`` or ``"patience"``."""
        return self._stopping.reason

    @property
    def num_evals(self) -> int:
        """Loss evaluations (closure or loss_fn calls per candidate) so far, all groups."""
        states = [s.state.num_evals for s in self._swarms if s is not None]
        return int(sum(int(n) for n in states))

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
        swarms = self._stepped("population")
        dtype = compute_dtype([x for s in swarms for x in s.state.population])
        rows = [torch.cat([x.reshape(x.shape[0], -1).to(dtype) for x in s.state.population], 1)
                for s in swarms]
        if len({r.shape[0] for r in rows}) > 1:
            raise ValueError("The param groups have different population sizes; read each "
                             "group's swarm with opt.metrics(group).")
        return torch.cat(rows, dim=1)

    def diversity(self) -> float:
        """Root-mean-square distance of the bacteria to their centroid, all groups."""
        population = self.population
        return float(diversity([population], population.dtype))

    _compute_diversity = diversity  # the seeds' name for it

    def metrics(self, group: int = 0) -> dict[str, float]:
        """:func:`functional_bfo.metrics` of one group's swarm, as floats (one host transfer)."""
        swarm = self._swarms[group] if group < len(self._swarms) else None
        if swarm is None:
            raise ValueError(f"param group {group} has not stepped yet; call step first.")
        return fb.materialize(fb.metrics(swarm.state))

    def _stepped(self, what: str) -> list[_Swarm]:
        swarms = [s for s in self._swarms if s is not None]
        if not swarms:
            raise ValueError(f"There is no {what} before the first step; call step first.")
        return swarms

    # ----- checkpoints --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly, as plain values and tensors.

        It loads with ``torch.load(weights_only=True)``; the parameters are the model's.
        """
        groups, start = [], 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(packed)
        return {
            "state": {g: to_dict(s.state) | {"updates": s.updates}
                      for g, s in enumerate(self._swarms) if s is not None},
            "param_groups": groups,
            "adapter": {"format": FORMAT, "class": type(self).__name__, "seed": self._seed,
                        "best": self._best, "best_seen": self._stopping.best_cost,
                        "stalled": self._stopping.stalled,
                        "steps": self._stopping.steps,
                        "per_update": self._stopping.per_update,
                        "stop_reason": self._stopping.reason},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`, onto these parameters' device.

        Raises:
            ValueError: it is not this class's state dict, or its groups or shapes differ.
        """
        name = type(self).__name__
        meta = state_dict.get("adapter") if isinstance(state_dict, dict) else None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"Not a functional_bfo adapter state dict (expected "
                             f"format {FORMAT}); write one with {name}.state_dict().")
        if meta["class"] != name:
            raise ValueError(f"This state dict is from {meta['class']}, not {name}.")
        saved = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in self.param_groups]
        if [len(g["params"]) for g in saved] != sizes:
            raise ValueError(f"The state dict has param groups of "
                             f"{[len(g['params']) for g in saved]} parameters, this optimizer "
                             f"{sizes}; build the optimizer over the same parameters.")
        self._seed = meta["seed"]
        for g, (group, packed) in enumerate(zip(self.param_groups, saved)):
            group.update({k: v for k, v in packed.items() if k != "params"})
            self._seen[g] = dict(group)
            self._swarms[g] = None
            data = state_dict["state"].get(g)
            if data is None:
                continue
            swarm = self._swarm(g, group)
            swarm.state = from_dict({k: v for k, v in data.items() if k != "updates"},
                                    swarm.state)
            swarm.updates = data["updates"]
            if self.uses_grads:
                swarm.mask = optree.tree_leaves(swarm.state.grad_mask)
                swarm.mask = [bool(m) for m in swarm.mask]
        self._best = meta["best"]
        self._stopping.best_cost, self._stopping.stalled = meta["best_seen"], meta["stalled"]
        self._stopping.steps = meta.get("steps", 0)
        self._stopping.per_update, self._stopping.reason = meta["per_update"], meta["stop_reason"]


def _same(a: Any, b: Any) -> bool:
    """Equality for settings: tensors by value, everything else by ``==``."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and bool(
            torch.equal(a.cpu(), b.cpu()))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return a is b
