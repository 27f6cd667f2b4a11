"""SwarmOptimizer: the ``torch.optim.Optimizer`` shell shared by BFO, AdaptiveBFO and HybridBFO.

Each param group is one swarm of the pure core (``fb.bfo`` and friends) over that group's
parameters. The shell moves values between the model and the core's state, keeps that state
between steps and turns hyperparameter edits into ``fb.with_hyperparams``; the algorithm and
the stopping rules are the core's. Every operation commits fully or changes nothing.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor

import functional_bfo as fb
from functional_bfo._checks import check_bool, check_int, compute_dtype
from functional_bfo._chemotaxis import rank_costs
from functional_bfo._stopping import Stopping
from functional_bfo._tree import diversity

from . import _layout
from ._candidates import Buffers, CandidateEvaluator, as_loss, scoring_candidates, write

logger = logging.getLogger("functional_bfo.adapters")

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
SHELL_SETTINGS = {"chunk_size": None}  # group settings the shell gives its evaluator
UNAPPLIED = object()  # a setting whose value the state may not hold: applied at the next step


class Settings(dict):
    """A param group (or ``defaults``) in which an alias and its core name are one setting.

    Writing either key writes both, so ``group["lr"] = 0.01`` is ``step_size`` (or
    ``step_size_max``) at once, whoever writes it: a scheduler, a framework or the user.
    """

    def __init__(self, aliases: dict[str, str], *sources: dict[str, Any]) -> None:
        super().__init__()
        self._partner = {**aliases, **{v: k for k, v in aliases.items()}}
        for source in sources:
            self.update(source)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        partner = getattr(self, "_partner", {}).get(key)  # absent while unpickling
        if partner is not None:
            super().__setitem__(partner, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __ior__(self, other: Any) -> Settings:
        self.update(other)
        return self


@dataclass
class _Swarm:
    """One param group's core optimizer, its evaluator and its state (None before a step)."""

    core: fb.Optimizer
    evaluator: CandidateEvaluator
    scorer: Any  # what the core evaluates with: the evaluator, or a distributed one around it
    settings: dict[str, Any]  # the core's settings the state follows
    state: Any = None
    fast_update: Callable[..., Any] | None = None  # the fast path's update (maybe compiled)
    mask: list[bool] = field(default_factory=list)  # requires_grad flags (hybrid)
    loss_cache: tuple[Any, Any] | None = None  # (user loss_fn, its per-group wrapper)


class SwarmOptimizer(torch.optim.Optimizer):
    """A param-group-per-swarm ``torch.optim`` shell over a pure core optimizer.

    Each param group is its own swarm over that group's parameters (the other groups held at
    their current values). ``step(closure)`` writes each candidate into the parameters and
    calls the closure (float or one-element tensor; ``backward`` optional); ``step(loss_fn=f)``
    evaluates the whole population with ``torch.func.vmap`` instead. After ``step`` the
    parameters hold the best values found and the best loss is returned. A step that raises
    (a closure error, Ctrl-C, an invalid setting) leaves parameters, buffers, swarms,
    settings and counters exactly as they were.

    Args:
        params: parameters or ``named_parameters()`` or param-group dicts, as for any
            ``torch.optim`` optimizer.
        seed: the swarm's random key; None draws it from torch's global generator once, so
            ``torch.manual_seed`` makes runs repeat (under ``torch.distributed``, rank 0's
            draw, broadcast once, so every rank runs the same swarm).
        compile: compile the core update of ``step(loss_fn=...)`` with
            ``torch.compile(fullgraph=True)``: True or a mode (``"default"``,
            ``"reduce-overhead"``, ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``);
            logged with the time it took, and a failure raises, never falls back.
        device: where the parameters must be (checked; they are never moved).
        module: the model, to keep candidates free of side effects: its buffers (BatchNorm
            running statistics and counters) are put back after every candidate and, in
            train mode, a step ends with one forward pass at the best params (one
            evaluation); on the fast path its train-mode normalization layers use batch
            statistics. ``DataParallel`` / ``DistributedDataParallel`` are unwrapped.
        evaluator: ``fb.distributed.sharded()`` (each rank scores its share of the
            candidates: the closure or ``loss_fn`` must not communicate) or
            ``fb.distributed.data_parallel(weight=...)`` (each rank scores every candidate on
            its own batch; the losses are averaged across ranks), so every rank holds the
            same swarm.
        check_replicas: after every step, check that every rank of the process group
            holds the same swarms (``fb.distributed.check_replicas``; it raises naming the
            ranks that drifted, after the step has committed).
        reevaluate: start each step by scoring the parameters as they stand (one extra
            evaluation), so minibatch noise or outside edits cannot freeze a stale best; the
            first step's score gives HybridBFO the gradient where it starts.
        max_fe: stop (``should_stop``) before an evaluation budget would be exceeded.
        target_loss: stop once the best loss reaches it.
        patience: stop after this many steps without the best improving by ``min_delta``.
        min_delta: the improvement that resets ``patience``.
        **hyperparams: every other keyword argument of the core factory (``chunk_size``
            bounds the vmapped fast path's batch).
    """

    factory: ClassVar[Callable[..., fb.Optimizer]]
    core_hyperparams: ClassVar[type]  # the core's Hyperparams NamedTuple: its fields are dynamic
    aliases: ClassVar[dict[str, str]]  # torch / seed name -> core name
    uses_grads: ClassVar[bool] = False

    def __init__(
        self,
        params: Iterable[Any],
        *,
        seed: int | None = None,
        compile: bool | str = False,
        device: torch.device | str | None = None,
        module: torch.nn.Module | None = None,
        evaluator: Any = None,
        check_replicas: bool = False,
        reevaluate: bool = True,
        max_fe: int | None = None,
        target_loss: float | None = None,
        patience: int | None = None,
        min_delta: float = 0.0,
        **hyperparams: Any,
    ) -> None:
        name = type(self).__name__
        self._mode = _compile_mode(compile)
        check_bool("reevaluate", reevaluate)
        self._stopping = Stopping(budget=max_fe, target_loss=target_loss, patience=patience,
                                  min_delta=min_delta, budget_name="max_fe")
        if seed is None:  # one draw from torch's generator: torch.manual_seed governs it
            seed = _agreed(int(torch.randint(0, 2**31 - 1, ()).item()))
        check_int("seed", seed, 0)
        self._seed, self._reevaluate = seed, reevaluate
        self._device = None if device is None else torch.device(device)
        self._buffers = Buffers(module)
        if evaluator is not None and not callable(getattr(evaluator, "around", None)):
            raise TypeError(f"evaluator must be fb.distributed.sharded(...) or "
                            f"fb.distributed.data_parallel(...); got {evaluator!r}. The "
                            "shell scores candidates itself (closure or loss_fn).")
        self._distributed = evaluator
        self._check_replicas = check_bool("check_replicas", check_replicas)
        if check_replicas and not (dist.is_available() and dist.is_initialized()):
            raise ValueError("check_replicas=True compares the swarms across the ranks of a "
                             "process group; call torch.distributed.init_process_group first.")
        signature = self._signature()
        unknown = sorted(set(hyperparams) - set(signature) - set(self.aliases))
        if unknown:
            raise TypeError(f"{name} got unexpected hyperparameters {unknown}; valid ones are "
                            f"{sorted(signature) + sorted(self.aliases)}.")
        self._check_aliases(hyperparams, name)
        defaults = Settings(self.aliases, signature, hyperparams)
        self._swarms: list[_Swarm] = []
        self._defaults_applied = dict(defaults)
        self._best: float | None = None
        self._settle_evals = 0  # the forward passes that settle buffers, in num_evals
        self._warned_pause = False
        self._pending: Callable[[], Any] | None = None  # set_closure's, for the next step()
        self._last_step_evals = 0  # what the last step() call evaluated (step post-hooks)
        super().__init__(params, defaults)

    # ----- settings -----------------------------------------------------------------------

    @classmethod
    @functools.cache
    def _signature(cls) -> dict[str, Any]:
        """The core factory's keyword defaults (hybrid: with adaptive_bfo's), minus evaluator."""
        out: dict[str, Any] = {}
        for fn in (fb.adaptive_bfo, cls.factory) if cls.uses_grads else (cls.factory,):
            for p in inspect.signature(fn).parameters.values():
                if p.kind is not p.VAR_KEYWORD and p.name not in ("evaluator", "grad_mask"):
                    out[p.name] = p.default
        return out | SHELL_SETTINGS

    def _check_typos(self, group: dict[str, Any], where: str) -> None:
        """Refuse a group key that looks like a misspelt setting.

        Other extra keys are kept, as torch keeps them (Lightning's ``name``, a scheduler's
        ``initial_lr``, Transformers' ``weight_decay``).
        """
        known = [*self._signature(), *self.aliases]
        for key in sorted(k for k in group if isinstance(k, str) and k not in known):
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
            if close:
                raise TypeError(f"{where} got {key!r}, which is not a setting; did you mean "
                                f"{close[0]!r}?")

    def _check_aliases(self, given: dict[str, Any], where: str) -> None:
        for alias, canonical in self.aliases.items():
            if alias in given and canonical in given and not _same(given[alias],
                                                                   given[canonical]):
                raise ValueError(f"{where} sets {alias}={given[alias]!r} and {canonical}="
                                 f"{given[canonical]!r}; they are the same setting, pass one.")

    def _settings(self, group: dict[str, Any]) -> dict[str, Any]:
        """The core's settings of a group, by core name.

        One-element tensors become numbers: torch optimizers take a tensor ``lr``.
        """
        return {k: v.item() if isinstance(v, Tensor) and v.numel() == 1 else v
                for k, v in ((k, group[k]) for k in self._signature())}

    def _core(self, settings: dict[str, Any], evaluator: CandidateEvaluator) -> fb.Optimizer:
        """The pure core optimizer for one group's settings (validates them)."""
        kwargs = {k: v for k, v in settings.items() if k not in SHELL_SETTINGS}
        if self.uses_grads:  # the mask follows requires_grad (fb.with_grad_mask in step)
            kwargs["grad_mask"] = False
        return type(self).factory(**kwargs, evaluator=evaluator)

    def _paused(self, g: int, settings: dict[str, Any]) -> bool:
        """``lr == 0`` (a schedule's end or a warmup's start) pauses the group, warned once."""
        if settings[self.aliases["lr"]] != 0:
            return False
        if not self._warned_pause:
            self._warned_pause = True
            warnings.warn(f"{type(self).__name__}: param group {g} has lr=0, so it is paused "
                          "(no evaluations, parameters unchanged) until lr is positive again.",
                          RuntimeWarning, stacklevel=4)
        return True

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (its own swarm); nothing is added unless its settings are valid."""
        if not isinstance(param_group, dict):
            raise TypeError(f"A param group must be a dict; got {type(param_group).__name__}.")
        self._check_typos(param_group, f"{type(self).__name__}'s param group "
                          f"{len(self.param_groups)}")
        self._check_aliases(param_group, "A param group")
        super().add_param_group(Settings(self.aliases, param_group))  # torch's checks, append
        try:
            self._swarms.append(self._new_swarm(self.param_groups[-1]))
        except BaseException:
            self.param_groups.pop()
            raise
        for swarm in self._swarms:  # their loss_fn wrappers hold the groups as they were
            swarm.loss_cache = None

    def _new_swarm(self, group: dict[str, Any]) -> _Swarm:
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
        settings = self._settings(group)
        evaluator = CandidateEvaluator(params, self._buffers, self.uses_grads,
                                       settings["chunk_size"])
        scorer = evaluator if self._distributed is None else self._distributed.around(
            evaluator, self.uses_grads)
        return _Swarm(self._core(settings, scorer), evaluator, scorer, settings)

    # ----- the step -----------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None, *,
             loss_fn: Callable[[Any], Tensor] | None = None,
             max_fe: int | None = None, steps: int = 1) -> float:
        """Chemotactic steps of every param group's swarm (one by default); the best loss.

        Args:
            closure: evaluates the model as it stands and returns the loss (float or
                one-element tensor); it may call ``zero_grad`` and ``backward``. Called once
                per candidate, with the candidate written into the parameters.
            loss_fn: instead of a closure, ``loss_fn(params) -> 0-d tensor`` for a whole
                population at once under ``torch.func.vmap``: ``params`` is a dict
                ``{name: tensor}`` if the optimizer was built from ``named_parameters()``,
                else a list in parameter order (the fast path; compiled with ``compile``).
            max_fe: run steps until the next would take this call past ``max_fe``
                evaluations (at least one step), instead of ``steps``.
            steps: how many chemotactic steps this call runs (fewer if ``should_stop``
                fires); each commits on its own.

        Returns:
            The best loss of the last group stepped, as a float; the parameters hold the
            best values found.
        """
        pending = closure is None and loss_fn is None and self._pending is not None
        if pending:  # a framework's closure-less step, with the closure set beforehand
            closure = self._pending
        if (closure is None) == (loss_fn is None):
            raise TypeError(f"{type(self).__name__}.step needs exactly one of a closure "
                            "(opt.step(closure), the closure returning the loss) or "
                            "loss_fn=... (the vmapped fast path); BFO cannot step without "
                            "evaluating candidates. A framework that calls step() itself "
                            "needs the closure set first: opt.set_closure(closure), which "
                            "the glue in functional_bfo.adapters does (docs/integrations.md).")
        if not callable(closure if closure is not None else loss_fn):
            raise TypeError(f"Invalid {'closure' if closure is not None else 'loss_fn'}: "
                            f"{(closure if closure is not None else loss_fn)!r}; expected a "
                            "callable.")
        if closure is not None and self._mode is not None:
            raise ValueError("compile= compiles the vmapped fast path, step(loss_fn=...); "
                             "a closure runs Python per candidate (.item(), backward) and "
                             "cannot be captured in one graph. Use compile=False with "
                             "closures.")
        if max_fe is not None:
            check_int("max_fe", max_fe, 1)
        check_int("steps", steps, 1)
        spent, done = 0, 0
        while not self.should_stop and (max_fe is not None or done < steps):
            per_update = self._stopping.per_update
            if max_fe is not None and spent and spent + per_update > max_fe:
                break
            before = self.num_evals
            stepped = self._step_all(closure, loss_fn, done)
            spent, done = spent + self.num_evals - before, done + 1
            if not stepped:
                break
        if pending:
            self._pending = None  # used: the next closure-less step needs a new one
        self._last_step_evals = spent
        return math.nan if self._best is None else self._best

    def set_closure(self, closure: Callable[[], Any] | None) -> None:
        """The closure the next ``step()`` called without arguments evaluates with.

        For frameworks that call ``optimizer.step()`` themselves (Transformers, fastai, a
        ``GradScaler``): their glue sets the closure before that call. A step that succeeds
        uses it up; one that fails keeps it, as it keeps everything else. None clears it.
        """
        if closure is not None and not callable(closure):
            raise TypeError(f"Invalid closure: {closure!r}; expected a callable or None.")
        self._pending = closure

    @property
    def closure_pending(self) -> bool:
        """Whether a closure set by :meth:`set_closure` waits for the next ``step()``."""
        return self._pending is not None

    def _step_all(self, closure: Any, loss_fn: Any, done: int = 0) -> bool:
        """Step every group; commit all of it, or restore everything and raise.

        Returns whether any group stepped (False: every group paused or empty).
        """
        edited = {k: v for k, v in self.defaults.items()
                  if not _same(v, self._defaults_applied.get(k))}  # reach every group
        start = [[p.detach().clone() for p in group["params"]] for group in self.param_groups]
        self._buffers.save()
        new: list[tuple[dict[str, Any], Any, Any, fb.Optimizer] | None] = []
        g = 0
        try:
            for g, (group, swarm) in enumerate(zip(self.param_groups, self._swarms)):
                settings = self._settings({**group, **edited})
                if not group["params"] or self._paused(g, settings):
                    new.append(None)
                    continue
                new.append(self._step_group(g, swarm, settings, closure, loss_fn))
                write(group["params"], new[-1][1].best_params)
            settled = self._settle(closure, loss_fn) if any(new) else 0
        except BaseException as e:
            for group, values in zip(self.param_groups, start):
                write(group["params"], values)
            self._buffers.restore()
            kept = f"; the {done} steps this call made before it are kept" if done else ""
            e.add_note(f"(raised while {type(self).__name__} stepped param group {g}; the "
                       "parameters, buffers, swarms, settings and counters were restored to "
                       f"where they were before this step{kept})")
            raise
        for group, swarm, step in zip(self.param_groups, self._swarms, new):
            group.update(edited)
            if step is not None:
                swarm.settings, swarm.state, swarm.fast_update, swarm.core = step
                if self.uses_grads:
                    swarm.mask = [bool(p.requires_grad) for p in group["params"]]
        self._defaults_applied = dict(self.defaults)
        self._settle_evals += settled
        stepped = [step for step in new if step is not None]
        if not stepped:
            return False
        last_settings, last_state = stepped[-1][:2]  # step returns the last group's best
        self._best = float(last_state.best_loss)
        self._stopping.maximize = bool(last_settings["maximize"])
        self._stopping.record(self.num_evals, self._best, self._per_update())
        if self._check_replicas:
            fb.distributed.check_replicas([s.state for s in self._swarms],
                                          getattr(self._distributed, "group", None))
        return True

    def _step_group(self, g: int, swarm: _Swarm, settings: dict[str, Any], closure: Any,
                    loss_fn: Any) -> tuple[dict[str, Any], Any, Any, fb.Optimizer]:
        """The group's next (settings, state, fast update, core); changes nothing."""
        params = swarm.evaluator.params
        state, fast, core = swarm.state, swarm.fast_update, swarm.core
        first = state is None
        if first:  # the swarm starts here, from the settings and parameters as they are now
            if any(not _same(v, swarm.settings[k]) for k, v in settings.items()):
                core = self._core(settings, swarm.scorer)
            key = fb.random.fold_in(fb.random.key(self._seed), g).to(params[0].device)
            state = core.init([p.detach().clone() for p in params], key=key)
            fast = core.update if self._mode is None else self._compiled(g, core)
        else:
            changed = {k: v for k, v in settings.items() if not _same(v, swarm.settings[k])}
            fixed = sorted(set(changed) - set(self.core_hyperparams._fields)
                           - set(SHELL_SETTINGS))
            if fixed:
                raise ValueError(f"param_groups[{g}]: {fixed} cannot change after the group's "
                                 "first step (they shape the swarm); only "
                                 f"{sorted(self.core_hyperparams._fields)} can. Set them back, "
                                 "or build a new optimizer to change them.")
            dynamic = {k: v for k, v in changed.items() if k not in SHELL_SETTINGS}
            if dynamic:
                state = fb.with_hyperparams(state, **dynamic)
        if self.uses_grads:
            mask = [bool(p.requires_grad) for p in params]
            if first or mask != swarm.mask:
                state = fb.with_grad_mask(state, mask)
        if closure is not None:
            update, loss = core.update, closure
        else:
            update, loss = fast, self._group_loss(g, swarm, loss_fn)
        swarm.evaluator.closure, swarm.evaluator.chunk_size = closure, settings["chunk_size"]
        try:
            if self._reevaluate:
                state = self._score_current(state, swarm, loss, first,
                                            settings["maximize"])
            with self._buffers.batch_statistics(), scoring_candidates():
                state = update(state, loss)
        except Exception as e:  # its type kept; notes say what ran and what to do
            if closure is None and "Batch norm" in str(e) and self.module is None:
                e.add_note(f"step(loss_fn=...) with a train-mode BatchNorm: build the "
                           f"optimizer with module=model ({type(self).__name__}(..., "
                           "module=model)); it then normalizes candidates by batch "
                           "statistics and updates the running ones once, at the best.")
            if closure is None and "DataParallel" in str(e):
                e.add_note("step(loss_fn=...): torch.func.functional_call cannot call a "
                           "DataParallel / DistributedDataParallel wrapper; call it on the "
                           "wrapped model, model.module, with that model's parameter names "
                           "(build the optimizer from model.module.named_parameters()).")
            if self._mode is not None and closure is None:
                e.add_note(f"{type(self).__name__}(compile={self._mode!r}): the update ran "
                           "under torch.compile(fullgraph=True), with this loss_fn; nothing "
                           "falls back to eager. Pass compile=False to run eagerly.")
            raise
        finally:
            swarm.evaluator.closure = None
        return settings, state, fast, core

    def _score_current(self, state: Any, swarm: _Swarm, loss: Any, first: bool,
                       maximize: bool) -> Any:
        """Score the parameters as they stand (one evaluation) on this step's objective.

        Before the first update they are bacterium 0 (``fb.with_start_loss``: the hybrid's
        first tumble follows the gradient there). Later they become the best to beat, so a
        lucky minibatch never freezes the model and an outside edit is scored honestly.
        """
        evaluator = swarm.evaluator
        current = ([x[0] for x in state.population] if first  # the start, inside bounds
                   else [p.detach() for p in evaluator.params])
        grads = None
        with self._buffers.batch_statistics(), scoring_candidates():
            # One candidate through the core's evaluator (a distributed one: all ranks agree).
            if evaluator.closure is not None or swarm.scorer is not evaluator:
                out = swarm.scorer(loss, [x.unsqueeze(0) for x in current])
                value, grads = out if self.uses_grads else (out, None)
                value, grads = value[0], grads and [g[0] for g in grads]
            elif first and self.uses_grads:  # where the hybrid starts, with its gradient
                grads, value = torch.func.grad_and_value(loss)(current)
            else:
                with torch.no_grad():
                    value = loss(current)
        if first:
            return fb.with_start_loss(state, value, grad=grads)
        sign = -1.0 if maximize else 1.0
        best = sign * rank_costs(torch.as_tensor(value).detach().to(state.best_loss.dtype), sign)
        return state._replace(best_params=[x.clone() for x in current], best_loss=best,
                              num_evals=state.num_evals + 1)

    def _settle(self, closure: Any, loss_fn: Any) -> int:
        """Buffers as before the step, then (train mode) as one forward pass at the best."""
        self._buffers.restore()
        if not self._buffers.settle:
            return 0
        if closure is not None:
            with torch.enable_grad():
                as_loss(closure())
        else:
            with torch.no_grad():
                loss_fn(_loss_input(self._names(), [[p.detach() for p in group["params"]]
                                                    for group in self.param_groups]))
        return 1

    def _compiled(self, g: int, core: fb.Optimizer) -> Callable[..., Any]:
        """``core.update`` under torch.compile; the first call's time is logged once."""
        compiled = torch.compile(core.update, fullgraph=True, mode=self._mode)
        calls = [0]

        def update(state: Any, loss: Any) -> Any:
            if calls[0]:
                return compiled(state, loss)
            began = time.perf_counter()
            out = compiled(state, loss)
            calls[0] = 1
            logger.info("%s: compiled the update of param group %d with torch.compile("
                        "mode=%r, fullgraph=True) in %.1f s (the first step(loss_fn=...) "
                        "pays it).", type(self).__name__, g, self._mode,
                        time.perf_counter() - began)
            return out

        return update


    def _group_loss(self, g: int, swarm: _Swarm, loss_fn: Callable[[Any], Tensor]):
        """``loss_fn`` as a function of group ``g``'s leaves, other groups as they stand.

        Cached per user ``loss_fn`` so a compiled update sees the same function each step.
        """
        if swarm.loss_cache is not None and swarm.loss_cache[0] is loss_fn:
            return swarm.loss_cache[1]
        groups = [[p.detach() for p in group["params"]] for group in self.param_groups]
        names = self._names()

        def group_loss(leaves: list[Tensor]) -> Tensor:
            return loss_fn(_loss_input(names, [leaves if i == g else other
                                               for i, other in enumerate(groups)]))

        swarm.loss_cache = (loss_fn, group_loss)
        return group_loss

    def _names(self) -> list[list[str]] | None:
        names = [group.get("param_names") for group in self.param_groups]
        return names if all(n is not None for n in names) else None

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
    def last_step_evals(self) -> int:
        """Evaluations the last ``step()`` call made (0: it did nothing).

        Every group paused at ``lr=0``, or ``should_stop`` set: a step post-hook can skip it.
        """
        return self._last_step_evals

    @property
    def num_evals(self) -> int:
        """Loss evaluations (closure or loss_fn calls per candidate) so far, all groups."""
        states = [int(s.state.num_evals) for s in self._swarms if s.state is not None]
        return sum(states) + self._settle_evals

    def _per_update(self) -> int:
        """The most evaluations the next step can take."""
        total = int(self._buffers.settle)
        for group, swarm in zip(self.param_groups, self._swarms):
            if group["params"] and swarm.settings[self.aliases["lr"]] != 0:
                s = swarm.settings
                total += s["population_size"] * (s["swim_length"] + 1) + self._reevaluate
        return total

    @property
    def module(self) -> torch.nn.Module | None:
        """The model given as ``module=`` (unwrapped from DataParallel / DDP), or None."""
        return self._buffers.module

    @property
    def stepped_groups(self) -> list[int]:
        """The param groups whose swarm has started (``metrics(g)`` works for them)."""
        return [g for g, swarm in enumerate(self._swarms) if swarm.state is not None]

    # ----- what the seeds' loops read -----------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Where the parameters are (``device=`` if given)."""
        params = [p for group in self.param_groups for p in group["params"]]
        return self._device if self._device is not None else params[0].device

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
        if not 0 <= group < len(self._swarms):
            raise ValueError(f"There is no param group {group}; this optimizer has "
                             f"{len(self._swarms)} (0 to {len(self._swarms) - 1}).")
        swarm = self._swarms[group]
        if swarm.state is None:
            raise ValueError(f"param group {group} has not stepped yet; call step first.")
        return fb.materialize(fb.metrics(swarm.state))

    def _stepped(self, what: str) -> list[_Swarm]:
        swarms = [s for s in self._swarms if s.state is not None]
        if not swarms:
            raise ValueError(f"There is no {what} before the first step; call step first.")
        return swarms

    # ----- checkpoints --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: ``state`` by parameter index, ``param_groups`` with indices.

        A group's swarm lies with its parameters: each parameter's population and best
        values in its own entry, the swarm's shared fields under ``"swarm"`` in the entry of
        the group's first parameter, and the optimizer's own under ``"optimizer"`` in entry
        0 (as LBFGS keeps its counters with its first parameter). It loads with
        ``torch.load(weights_only=True)``. Hooks registered with torch's
        ``register_state_dict_pre_hook`` / ``register_state_dict_post_hook`` run as for any
        torch optimizer.
        """
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        groups, state, first = [], {}, 0
        for group, swarm in zip(self.param_groups, self._swarms):
            size = len(group["params"])
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": list(range(first, first + size))})
            if swarm.state is not None:
                for i, entry in _layout.pack(swarm.state, first).items():
                    state.setdefault(i, {}).update(entry)
            first += size
        state.setdefault(0, {})["optimizer"] = {
            "format": _layout.FORMAT, "class": type(self).__name__, "seed": self._seed,
            "best": self._best, "settle_evals": self._settle_evals,
            **_layout.stopping_fields(self._stopping)}
        state_dict = {"state": state, "param_groups": groups}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            state_dict = state_dict if result is None else result
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (this format or the previous one) onto these params.

        Everything is checked before anything changes; a rejected state dict leaves the
        optimizer as it was. Hooks registered with torch's
        ``register_load_state_dict_pre_hook`` (which may return a replacement) and
        ``register_load_state_dict_post_hook`` run as for any torch optimizer.

        Raises:
            ValueError: it is not this class's state dict, or its groups, settings or shapes
                differ from this optimizer's.
        """
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            state_dict = state_dict if result is None else result
        name = type(self).__name__
        saved = _layout.read(state_dict, name, [len(g["params"]) for g in self.param_groups])
        swarms = []
        for g, (group, packed, entries) in enumerate(zip(self.param_groups, saved.groups,
                                                         saved.states)):
            self._check_aliases(packed, f"The state dict's param_groups[{g}]")
            restored = Settings(self.aliases, group, packed)
            swarm = self._new_swarm({**restored, "params": group["params"]})
            if entries is not None:
                key = fb.random.fold_in(fb.random.key(saved.seed), g)
                like = swarm.core.init([p.detach() for p in group["params"]],
                                       key=key.to(group["params"][0].device))
                swarm.state = entries(like)
                # The saved group may hold edits (a scheduler's lr) its state has not taken
                # yet: the next step applies every dynamic setting from the group.
                swarm.settings = {k: UNAPPLIED if k in self.core_hyperparams._fields else v
                                  for k, v in swarm.settings.items()}
                swarm.fast_update = (swarm.core.update if self._mode is None
                                     else self._compiled(g, swarm.core))
                if self.uses_grads:
                    swarm.mask = [bool(m) for m in swarm.state.grad_mask]
            swarms.append((restored, swarm))
        for group, (restored, _) in zip(self.param_groups, swarms):  # commit
            group.update({k: v for k, v in restored.items() if k != "params"})
        self._swarms = [swarm for _, swarm in swarms]
        self._seed, self._best, self._settle_evals = saved.seed, saved.best, saved.settle_evals
        _layout.set_stopping(self._stopping, saved.stopping)
        self._defaults_applied = dict(self.defaults)
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)


def _agreed(seed: int) -> int:
    """Rank 0's ``seed`` on every rank of an initialized process group (else ``seed``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return seed
    nccl = dist.get_backend() == "nccl"
    value = torch.tensor([seed], dtype=torch.int64,
                         device=torch.device("cuda", torch.cuda.current_device()) if nccl
                         else "cpu")
    dist.broadcast(value, src=0)
    return int(value.item())


def _loss_input(names: list[list[str]] | None, values: list[list[Tensor]]) -> Any:
    """What ``loss_fn`` receives: ``{name: tensor}`` if built from named params, else a list."""
    if names is not None:
        return {n: v for ns, vs in zip(names, values) for n, v in zip(ns, vs)}
    return [v for vs in values for v in vs]


def _compile_mode(compile: Any) -> str | None:
    """``compile=`` as a torch.compile mode, or None for eager."""
    if compile is True:
        return "default"
    if compile is False:
        return None
    if compile in COMPILE_MODES:
        return compile
    raise ValueError(f"Invalid compile: {compile!r}; expected False, True (\"default\") or one "
                     f"of torch.compile's modes {list(COMPILE_MODES)}.")


def _same(a: Any, b: Any) -> bool:
    """Equality for settings: tensors by value, everything else by ``==``."""
    if a is b:  # most settings, most steps
        return True
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and bool(
            torch.equal(a.cpu(), b.cpu()))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return a is b
