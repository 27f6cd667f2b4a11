"""The black box as an Optuna sampler: each trial is one row of a round of ``black_box_search``.

``BlackBoxSampler`` hands the rows of the open round to trials in turn, tells the round once
every row's trial has ended (failed and pruned trials as the worst), and asks the next. Each
trial records its search, round and row, so a process that shares the study's storage (or
resumes it) rebuilds the state exactly by replaying the told rounds in order.
"""

from __future__ import annotations

import itertools
import math
import secrets
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
import torch
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.samplers._base import _INDEPENDENT_SAMPLING_WARNING_TEMPLATE
from optuna.trial import FrozenTrial, TrialState

import functional_bfo as fb

CLAIM = "functional_bfo:claim"  # a trial's [search, round, row]
SEED, SPACE = "functional_bfo:seed", "functional_bfo:space"  # the study's, shared by processes
ENDED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
_logger = optuna.logging.get_logger(__name__)


class BlackBoxSampler(optuna.samplers.BaseSampler):
    """Optuna's sampler over :func:`functional_bfo.black_box_search`.

    Float and int parameters (log-scaled and stepped too) form the search's box; the rest
    (categoricals) go to ``independent_sampler`` with Optuna's warning. Without
    ``search_space`` the first trials, until one completes, are sampled independently and the
    space is then fixed, once, from the completed trials (a range that varies between trials
    is named in a warning). A row whose value Optuna draws aside, outside the range its trial
    asks for, is told as the worst. A trial
    that finds every row of the open round out waits for the round to end, so parallel
    workers (``n_jobs``, processes on one storage) waste no trial; a trial asked in the same
    thread as every open row's (a batch of ``study.ask()`` before any ``tell``) is sampled
    independently instead, with a warning, since waiting would never end.

    Args:
        search_space: the parameters' distributions; None infers them as above.
        n_trials: the budget of one search (its ``max_evals``); once spent, a new search
            starts from the best point so far on the next key.
        seed: the same seed (and settings) gives the same trials; None takes the study's
            seed if another process stored one, else draws one and stores it.
        independent_sampler: for the parameters outside the box (default ``RandomSampler``).
        warn_independent_sampling: warn when a parameter is sampled independently.
        **settings: :func:`functional_bfo.black_box_search`'s (``population_size``, ...).

    Examples:
        >>> import optuna
        >>> from functional_bfo.adapters.optuna import BlackBoxSampler
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> space = {"x": optuna.distributions.FloatDistribution(-5, 5),
        ...          "n": optuna.distributions.IntDistribution(1, 64, log=True)}
        >>> study = optuna.create_study(sampler=BlackBoxSampler(space, n_trials=500, seed=0))
        >>> study.optimize(lambda t: (t.suggest_float("x", -5, 5) - 1) ** 2
        ...                + abs(t.suggest_int("n", 1, 64, log=True) - 8), n_trials=500)
        >>> round(study.best_params["x"], 3), study.best_params["n"]
        (1.0, 8)
    """

    def __init__(self, search_space: dict[str, BaseDistribution] | None = None, *,
                 n_trials: int = 1000, seed: int | None = None,
                 independent_sampler: optuna.samplers.BaseSampler | None = None,
                 warn_independent_sampling: bool = True, **settings: Any):
        given = None if search_space is None else _box_space(search_space)
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
            raise ValueError(f"Invalid n_trials: {n_trials!r}; expected an int >= 1, the trials "
                             "of one search.")
        self._n_trials, self._seed, self._settings = n_trials, seed, settings
        try:  # bad settings fail here, not at the first trial
            fb.black_box_search((0.0, 1.0), max_evals=n_trials, **settings)
        except ValueError as error:  # a budget below one round: say it of n_trials
            if not str(error).startswith("Invalid max_evals"):
                raise
            raise ValueError(f"Invalid n_trials: {n_trials};{str(error).split(';', 1)[1]}"
                             ) from None
        self._independent = independent_sampler or optuna.samplers.RandomSampler(seed=seed)
        self._warn = warn_independent_sampling
        self._lock = threading.RLock()
        self._space = None if given is None else _Space(given)
        self._ledger: _Ledger | None = None

    def reseed_rng(self) -> None:
        """Reseed the independent sampler; the search's rounds follow the seed alone."""
        self._independent.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """The box's distributions once fixed; ``{}`` (all independent) until then."""
        self._raise_error_if_multi_objective(study)
        with self._lock:
            space = self._fixed_space(study)
            return {} if space is None else dict(space.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """The params of a free row of the open round, waiting for one if none is free."""
        if not search_space:
            return {}
        for waited in itertools.count():
            with self._lock:
                ledger = self._synced(study)
                row = ledger.free_row()
                if row is not None:
                    claim = [ledger.search, ledger.round, row]
                    ledger.claim(row, trial.number, threading.get_ident())
                    study._storage.set_trial_system_attr(trial._trial_id, CLAIM, claim)
                    rival = self._rival(study, trial, claim)
                    if rival is None:
                        return ledger.space.params(ledger.rows[row])
                    ledger.claim(row, rival, -1)  # another process took it first: take another
                    continue
                if ledger.all_claimed_by(threading.get_ident()):
                    _logger.warning(
                        f"Trial#{trial.number} is sampled independently: every point of the open "
                        f"round ({len(ledger.rows)} rows) is out with a trial of this thread not "
                        "yet told. Tell them before asking more, or ask at most a round's rows "
                        "at a time.")
                    return {}
            if waited % 500 == 499:  # each second: a dead worker's trial ends (heartbeat)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    optuna.storages.fail_stale_trials(study)
            time.sleep(0.002)
        raise AssertionError("unreachable")

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        """``independent_sampler``'s value, with Optuna's warning for a searched study."""
        if self._warn and self._space is not None and not param_distribution.single():
            _logger.warning(_INDEPENDENT_SAMPLING_WARNING_TEMPLATE.format(
                param_name=param_name, trial_number=trial.number,
                independent_sampler_name=type(self._independent).__name__,
                sampler_name=type(self).__name__,
                fallback_reason="the black box searches float and int parameters of a fixed "
                                "search space only"))
        return self._independent.sample_independent(study, trial, param_name,
                                                     param_distribution)

    def _fixed_space(self, study: optuna.Study) -> _Space | None:
        """The box, fixed once: given, stored by another process, or from completed trials."""
        if self._space is None:
            stored = study._storage.get_study_system_attrs(study._study_id).get(SPACE)
            if stored is None:
                completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                space = optuna.search_space.intersection_search_space(completed)
                if not _box_space(space, strict=False):
                    return None
                stored = {k: optuna.distributions.distribution_to_json(v)
                          for k, v in _box_space(space, strict=False).items()}
                study._storage.set_study_system_attr(study._study_id, SPACE, stored)
            self._space = _Space({k: optuna.distributions.json_to_distribution(v)
                                  for k, v in stored.items()})
        return self._space

    def _search(self, space: _Space) -> Any:
        return fb.black_box_search((torch.tensor(space.low), torch.tensor(space.high)),
                                   max_evals=self._n_trials, **self._settings)

    def _rival(self, study: optuna.Study, trial: FrozenTrial, claim: list[int]) -> int | None:
        """A trial of another process with a lower number that claimed the same row."""
        if isinstance(study._storage, optuna.storages.InMemoryStorage):
            return None  # one process: the lock serves
        trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        assert self._ledger is not None
        return next((t.number for t in trials[self._ledger.seen:] if t.number < trial.number
                     and t.system_attrs.get(CLAIM) == claim), None)

    def _synced(self, study: optuna.Study) -> _Ledger:
        """The ledger, with every trial ended since the last look told."""
        if self._ledger is None:
            attrs = study._storage.get_study_system_attrs(study._study_id)
            seed = attrs.get(SEED) if self._seed is None else self._seed
            if seed is None:
                seed = secrets.randbits(32)  # numpy seeds the independent sampler
                study._storage.set_study_system_attr(study._study_id, SEED, seed)
            elif attrs.get(SEED, seed) != seed:
                raise ValueError(f"BlackBoxSampler got seed={seed}, but the study was run with "
                                 f"seed={attrs[SEED]}; pass that seed (or None) to resume it.")
            assert self._space is not None
            self._ledger = _Ledger(self._search(self._space), self._space, fb.random.key(seed),
                                   -1.0 if study.direction.name == "MAXIMIZE" else 1.0)
        trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        self._ledger.read(trials)
        return self._ledger


class _Space:
    """The box of float and int parameters: a float64 row <-> Optuna's params."""

    def __init__(self, distributions: dict[str, BaseDistribution]):
        self.distributions = dict(sorted(distributions.items()))
        bounds = [_coordinate_box(d) for d in self.distributions.values()]
        self.low = np.array([b[0] for b in bounds], dtype=np.float64)
        self.high = np.array([b[1] for b in bounds], dtype=np.float64)

    def params(self, row: np.ndarray) -> dict[str, Any]:
        return {name: _value(d, float(x)) for (name, d), x in zip(self.distributions.items(), row)}


def _box_space(space: dict[str, BaseDistribution], strict: bool = True
               ) -> dict[str, BaseDistribution]:
    """The float and int distributions of ``space`` with more than one value."""
    if strict and not isinstance(space, dict):
        raise TypeError(f"Invalid search_space: {space!r}; expected a dict of parameter names "
                        "to optuna.distributions (or None to infer it).")
    kept: dict[str, BaseDistribution] = {k: d for k, d in space.items()
            if isinstance(d, (FloatDistribution, IntDistribution)) and not d.single()}
    if strict and not kept:
        raise ValueError("Invalid search_space: no float or int distribution with more than one "
                         "value; BlackBoxSampler searches those (pass None to infer them).")
    return kept


def _coordinate_box(d: BaseDistribution) -> tuple[float, float]:
    """The coordinate's interval: log for log scales, widened by half a step for steps."""
    assert isinstance(d, (FloatDistribution, IntDistribution))
    half = 0.0 if d.step is None else d.step / 2
    if d.log:
        half = 0.5 if isinstance(d, IntDistribution) else 0.0
        return math.log(d.low - half), math.log(d.high + half)
    return d.low - half, d.high + half


def _value(d: BaseDistribution, x: float) -> Any:
    """The parameter at coordinate ``x``, on its distribution's grid."""
    assert isinstance(d, (FloatDistribution, IntDistribution))
    value = math.exp(x) if d.log else x
    if d.step is not None and not d.log:
        value = d.low + round((value - d.low) / d.step) * d.step
    elif isinstance(d, IntDistribution):
        value = round(value)
    value = min(max(value, d.low), d.high)
    return int(value) if isinstance(d, IntDistribution) else float(value)


class _Ledger:
    """The open round of the search: its rows, who holds them, and the losses told so far."""

    def __init__(self, search: Any, space: _Space, key: torch.Tensor, sign: float):
        self.optimizer, self.space, self.key, self.sign = search, space, key, sign
        self.search, self.seen = 0, 0  # the trials before `seen` have ended and been read
        self.ranges_checked = False  # a range differing from the box was named
        # (search, round) -> row -> (cost, params): ended trials of the open round and ahead
        self.ended: dict[tuple[int, int], dict[int, tuple[float, dict]]] = {}
        self.start = (space.low + space.high) / 2
        self.begin(self.start)

    def begin(self, start: np.ndarray) -> None:
        key = self.key if self.search == 0 else fb.random.fold_in(self.key, self.search)
        self.state = self.optimizer.init({"x": torch.from_numpy(start.copy())}, key=key)
        self.ask()

    def ask(self) -> None:
        self.round = int(self.state.step)
        self.asked = self.optimizer.ask(self.state)
        self.rows = self.asked.params["x"].numpy()
        self.open = self.asked.mask.numpy().copy()  # rows still to be handed out or told
        self.costs = np.full(len(self.rows), np.nan)
        self.holders: dict[int, tuple[int, int]] = {}  # row -> (trial number, thread)

    def read(self, trials: Sequence[FrozenTrial]) -> None:
        """Take in the claims and ends of ``trials[seen:]``; tell every round they complete."""
        for trial in trials[self.seen:]:
            self.check_ranges(trial)
            claim = trial.system_attrs.get(CLAIM)
            if claim is None or (claim[0], claim[1]) < (self.search, self.round):
                continue
            if trial.state in ENDED:
                value = trial.value if trial.state == TrialState.COMPLETE else None
                value = math.nan if value is None else value
                self.ended.setdefault((claim[0], claim[1]), {}).setdefault(
                    claim[2], (self.sign * value, trial.params))
            elif (claim[0], claim[1]) == (self.search, self.round):
                self.holders.setdefault(claim[2], (trial.number, -1))
        while self.seen < len(trials) and trials[self.seen].state in ENDED:
            self.seen += 1
        self.tell_ended()

    def check_ranges(self, trial: FrozenTrial) -> None:
        """Warn once if a trial asked for a parameter of the box over another range."""
        if self.ranges_checked or trial.state not in ENDED:
            return
        box = self.space.distributions
        for name, asked in trial.distributions.items():
            if name in box and asked != box[name]:
                self.ranges_checked = True
                _logger.warning(
                    f"BlackBoxSampler searches `{name}` in {box[name]}, but Trial#{trial.number} "
                    f"asked for {asked}: a range that varies between trials keeps the search's "
                    "box, and a value outside a trial's range is drawn aside and counts as the "
                    "worst. Pass search_space with each parameter's widest range.")
                return

    def tell_ended(self) -> None:
        while True:
            for row, (cost, params) in self.ended.pop((self.search, self.round), {}).items():
                # A value Optuna drew aside (the row's lay outside what the objective asked
                # for): the loss is another point's, so the row counts as the worst.
                drawn = self.space.params(self.rows[row])
                aside = any(params.get(k, v) != v for k, v in drawn.items())
                self.costs[row], self.open[row] = math.nan if aside else cost, False
                self.holders.pop(row, None)
            if self.open.any():
                return
            self.state = self.optimizer.tell(self.state, self.asked, self.costs, check=False)
            if self.state.phase == "done":
                self.search += 1
                self.begin(self.state.best_row.numpy())
            else:
                self.ask()

    def free_row(self) -> int | None:
        free = [row for row in np.flatnonzero(self.open) if row not in self.holders]
        return int(free[0]) if free else None

    def claim(self, row: int, number: int, thread: int) -> None:
        self.holders[row] = (number, thread)

    def all_claimed_by(self, thread: int) -> bool:
        return all(holder[1] == thread for holder in self.holders.values())
