"""functional_bfo.adapters.optuna.BlackBoxSampler: the black box as an Optuna sampler."""

import math
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

optuna = pytest.importorskip("optuna")
from optuna.distributions import (  # noqa: E402
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

import functional_bfo as fb  # noqa: E402
from functional_bfo.adapters.optuna import CLAIM, BlackBoxSampler, _coordinate_box, _value  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = {"x": FloatDistribution(-5, 5), "y": FloatDistribution(-2, 3)}


def bowl(x, y):
    return (x - 1) ** 2 + 10 * (y - 2) ** 2 + 3  # minimum 3, not 0


def objective(trial):
    return bowl(trial.suggest_float("x", -5, 5), trial.suggest_float("y", -2, 3))


def by_claim(study):
    """Each trial's params by its recorded (search, round, row)."""
    return {tuple(t.system_attrs[CLAIM]): t.params for t in study.trials}


def test_the_trials_are_the_rows_of_black_box_search_on_the_same_key_in_order():
    study = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=400, seed=5))
    study.optimize(objective, n_trials=400)
    search = fb.black_box_search((torch.tensor([-5.0, -2.0]), torch.tensor([5.0, 3.0])),
                                 max_evals=400)
    state = search.init({"x": torch.tensor([0.0, 0.5], dtype=torch.float64)},
                        key=fb.random.key(5))
    rows = []
    while state.phase != "done":
        asked = search.ask(state)
        x = asked.params["x"].numpy()[asked.mask.numpy()]  # the names sort x, y
        rows.extend(x)
        losses = np.full(len(asked.mask), np.nan)
        losses[asked.mask.numpy()] = [bowl(*r) for r in x]
        state = search.tell(state, asked, losses)
    first = study.trials[:len(rows)]  # the rest start the next search: its rounds overrun 400
    assert [[t.params["x"], t.params["y"]] for t in first] == [list(r) for r in rows]
    assert study.trials[len(rows)].system_attrs[CLAIM] == [1, 0, 0]
    assert min(t.value for t in first) == float(state.best_loss)


@settings(max_examples=60, deadline=None)
@given(st.integers(-50, 50), st.integers(0, 80), st.sampled_from([1, 2, 3]), st.booleans(),
       st.floats(0, 1))
def test_int_float_log_and_stepped_values_land_on_their_distribution(low, width, step, log, u):
    for d in (IntDistribution(low, low + width * step, step=step),
              FloatDistribution(low, low + (width + 1) * step / 4, step=step / 4),
              IntDistribution(max(low, 1), max(low, 1) + width, log=log),
              FloatDistribution(max(low, 1) / 7, max(low, 1) + width + 1, log=log)):
        lo, hi = _coordinate_box(d)
        value = _value(d, lo + u * (hi - lo))
        assert d._contains(d.to_internal_repr(value)), (d, value)
        assert isinstance(value, int if isinstance(d, IntDistribution) else float)


def test_each_int_value_has_a_share_of_the_coordinate_box():
    d = IntDistribution(1, 4)
    lo, hi = _coordinate_box(d)
    values = [_value(d, x) for x in np.linspace(lo, hi, 4001)]
    assert sorted(set(values)) == [1, 2, 3, 4]
    assert all(900 < values.count(v) < 1100 for v in (1, 2, 3, 4))


def test_categoricals_go_to_the_independent_sampler_with_optunas_warning(caplog):
    space = {**SPACE, "kind": CategoricalDistribution(["a", "b"])}
    study = optuna.create_study(sampler=BlackBoxSampler(space, n_trials=100, seed=0))
    optuna.logging.enable_propagation()
    try:
        study.optimize(lambda t: objective(t) + (t.suggest_categorical("kind", ["a", "b"]) == "b"),
                       n_trials=3)
    finally:
        optuna.logging.disable_propagation()
    assert "The parameter `kind` in Trial#0 is sampled independently" in caplog.text
    assert {t.params["kind"] for t in study.trials} <= {"a", "b"}
    assert [tuple(t.system_attrs[CLAIM]) for t in study.trials] == [(0, 0, 0), (0, 0, 1), (0, 0, 2)]


def test_failed_and_pruned_trials_are_told_as_the_worst():
    def flaky(trial):
        value = objective(trial)
        if trial.number % 7 == 3:
            raise optuna.TrialPruned()
        if trial.number % 7 == 5:
            raise ArithmeticError("the simulator diverged")
        return value

    study = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=300, seed=1))
    study.optimize(flaky, n_trials=120, catch=(ArithmeticError,))
    worst = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=300, seed=1))
    worst.optimize(lambda t: (objective(t), math.nan)[t.number % 7 in (3, 5)], n_trials=120)
    assert {s.name for s in (t.state for t in study.trials)} == {"COMPLETE", "PRUNED", "FAIL"}
    assert by_claim(study) == by_claim(worst)  # the same rounds followed: NaN is the worst


def test_a_trial_whose_params_are_not_its_rows_is_told_as_the_worst():
    """Optuna samples a parameter independently when the sampler's value lies outside the
    range the objective suggests: that loss is not the row's, so the row is told as the worst
    (the search then follows the rounds of an objective that is NaN there)."""
    def narrow(trial):
        return (trial.suggest_float("x", 0, 1) - 0.5) ** 2 + trial.suggest_float("y", -2, 3) ** 2

    def nan_outside(trial):
        x, y = trial.suggest_float("x", -5, 5), trial.suggest_float("y", -2, 3)
        return (x - 0.5) ** 2 + y**2 if 0 <= x <= 1 else math.nan

    study, twin = (optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=300, seed=2))
                   for _ in range(2))
    study.optimize(narrow, n_trials=150)
    twin.optimize(nan_outside, n_trials=150)
    rows, got = by_claim(twin), by_claim(study)
    assert rows.keys() == got.keys()
    inside = [claim for claim, row in rows.items() if 0 <= row["x"] <= 1]
    assert len(inside) > 20 and all(got[c] == rows[c] for c in inside)


def test_maximize_follows_the_same_trials_as_minimizing_the_negation():
    low = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=200, seed=2))
    low.optimize(objective, n_trials=100)
    high = optuna.create_study(direction="maximize",
                               sampler=BlackBoxSampler(SPACE, n_trials=200, seed=2))
    high.optimize(lambda t: -objective(t), n_trials=100)
    assert [t.params for t in low.trials] == [t.params for t in high.trials]


def test_four_threads_waste_no_trial_and_follow_the_sequential_rounds():
    sequential = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=500, seed=3))
    sequential.optimize(objective, n_trials=200)
    parallel = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=500, seed=3))
    parallel.optimize(objective, n_trials=200, n_jobs=4)
    claims = [tuple(t.system_attrs[CLAIM]) for t in parallel.trials]
    assert len(set(claims)) == 200  # every trial holds its own row: none sampled aside
    reference = by_claim(sequential)
    assert all(reference[c] == t.params for c, t in zip(claims, parallel.trials))


def test_asking_past_the_open_round_in_one_thread_samples_aside_instead_of_hanging():
    study = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=200, seed=0))
    done = threading.Event()

    def ask_twenty():
        trials = [study.ask() for _ in range(20)]  # rounds hold 16 rows
        for trial in trials:
            trial.suggest_float("x", -5, 5), trial.suggest_float("y", -2, 3)
        done.set()

    worker = threading.Thread(target=ask_twenty, daemon=True)
    worker.start()
    assert done.wait(60), "a batch of asks past the open round hung"
    claimed = [CLAIM in t.system_attrs for t in study.trials]
    assert claimed == [True] * 16 + [False] * 4


RESUMABLE = textwrap.dedent("""
    import sys, optuna
    from optuna.distributions import FloatDistribution
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from functional_bfo.adapters.optuna import BlackBoxSampler
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {"x": FloatDistribution(-5, 5), "y": FloatDistribution(-2, 3)}
    storage = JournalStorage(JournalFileBackend(sys.argv[1]))
    study = optuna.load_study(study_name="s", storage=storage,
                              sampler=BlackBoxSampler(space, n_trials=500))
    study.optimize(lambda t: (t.suggest_float("x", -5, 5) - 1) ** 2
                   + 10 * (t.suggest_float("y", -2, 3) - 2) ** 2 + 3, n_trials=int(sys.argv[2]))
""")


def run_worker(path, n_trials):
    return subprocess.Popen([sys.executable, "-c", RESUMABLE, str(path), str(n_trials)])


def journal_study(path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return optuna.create_study(study_name="s", storage=JournalStorage(JournalFileBackend(
        str(path))), sampler=BlackBoxSampler(SPACE, n_trials=500), load_if_exists=True)


def stored_seed(study):
    return study._storage.get_study_system_attrs(study._study_id)["functional_bfo:seed"]


def test_a_resumed_study_continues_where_an_uninterrupted_one_would_be(tmp_path):
    path = tmp_path / "journal.log"
    study = journal_study(path)  # no seed: the first process draws one and stores it
    study.optimize(objective, n_trials=70)
    assert run_worker(path, 70).wait(timeout=120) == 0  # a new process resumes it
    seed = stored_seed(study)
    uninterrupted = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=500, seed=seed))
    uninterrupted.optimize(objective, n_trials=140)
    resumed = optuna.load_study(study_name="s", storage=study._storage)
    assert [t.params for t in resumed.trials] == [t.params for t in uninterrupted.trials]


def test_two_processes_on_one_journal_share_the_rounds(tmp_path):
    path = tmp_path / "journal.log"
    journal_study(path).optimize(objective, n_trials=1)  # stores the seed
    workers = [run_worker(path, 60), run_worker(path, 60)]
    assert [w.wait(timeout=180) for w in workers] == [0, 0]
    study = optuna.load_study(study_name="s", storage=journal_study(path)._storage)
    seed = stored_seed(study)
    reference = optuna.create_study(sampler=BlackBoxSampler(SPACE, n_trials=500, seed=seed))
    reference.optimize(objective, n_trials=160)
    expected = by_claim(reference)
    claims = [tuple(t.system_attrs[CLAIM]) for t in study.trials]
    assert len(claims) == 121 and all(expected[c] == t.params
                                      for c, t in zip(claims, study.trials))
    assert len(set(claims)) >= 112  # two processes rarely take one row at once (3 in 121)


def test_a_different_seed_cannot_resume_a_study(tmp_path):
    study = journal_study(tmp_path / "journal.log")
    study.optimize(objective, n_trials=2)
    stored = stored_seed(study)
    other = optuna.load_study(study_name="s", storage=study._storage,
                              sampler=BlackBoxSampler(SPACE, n_trials=500, seed=stored + 1))
    with pytest.raises(ValueError, match="pass that seed"):
        other.optimize(objective, n_trials=1)


def test_without_a_search_space_the_first_completed_trial_fixes_it():
    study = optuna.create_study(sampler=BlackBoxSampler(n_trials=300, seed=4))
    study.optimize(objective, n_trials=60)
    assert CLAIM not in study.trials[0].system_attrs  # sampled before any trial completed
    assert all(CLAIM in t.system_attrs for t in study.trials[1:])
    assert study.trials[1].system_attrs[CLAIM] == [0, 0, 0]


def test_an_inferred_range_that_varies_between_trials_is_named_once(caplog):
    """The inferred box is fixed; a range that depends on another parameter (y in [0, n])
    keeps the first trial's, so a warning says to pass search_space with the widest."""
    def nested(trial):
        n = trial.suggest_int("n", 1, 10)
        return (n - 7) ** 2 + (trial.suggest_float("y", 0, n) - 6.5) ** 2

    study = optuna.create_study(sampler=BlackBoxSampler(n_trials=300, seed=4))
    optuna.logging.enable_propagation()
    try:
        study.optimize(nested, n_trials=60)
    finally:
        optuna.logging.disable_propagation()
    assert caplog.text.count("varies between trials") == 1
    assert "`y`" in caplog.text and "search_space" in caplog.text


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(search_space={"k": CategoricalDistribution([1, 2])}), ValueError, "no float or int"),
    (dict(search_space=[("x", FloatDistribution(0, 1))]), TypeError, "a dict of parameter"),
    (dict(search_space=SPACE, n_trials=0), ValueError, "Invalid n_trials"),
    (dict(search_space=SPACE, n_trials=10), ValueError, "Invalid n_trials: 10; one update"),
    (dict(search_space=SPACE, population_size=0), ValueError, "population_size"),
])
def test_bad_settings_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        BlackBoxSampler(**kwargs)


def test_a_multi_objective_study_is_refused():
    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=BlackBoxSampler(SPACE, seed=0))
    with pytest.raises(ValueError, match="multi-objective"):
        study.optimize(lambda t: (objective(t), 1.0), n_trials=1)


def test_the_optunahub_package_loads_and_its_example_runs(monkeypatch):
    """examples/optunahub/black_box_bfo as optunahub.load_module would hand it over."""
    import importlib.util
    import pathlib
    import types

    folder = pathlib.Path(__file__).parents[1] / "examples" / "optunahub" / "black_box_bfo"
    spec = importlib.util.spec_from_file_location("black_box_bfo", folder / "__init__.py")
    package = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)
    assert package.BlackBoxSampler is BlackBoxSampler
    front = (folder / "README.md").read_text().split("---")[1]
    assert {line.split(":")[0] for line in front.strip().splitlines()} == {
        "author", "title", "description", "tags", "optuna_versions", "license"}
    assert "sampler" in front and (folder / "LICENSE").exists()
    hub = types.SimpleNamespace(load_module=lambda name: package)
    monkeypatch.setitem(sys.modules, "optunahub", hub)
    example = (folder / "example.py").read_text().replace("400", "40").replace("print(", "(")
    space = {"__name__": "__main__"}
    exec(compile(example, str(folder / "example.py"), "exec"), space)
    assert len(space["study"].trials) == 40
