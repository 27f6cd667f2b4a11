"""Tune a toy model's three hyperparameters with the black box (OptunaHub's example)."""

import optuna
import optunahub


def objective(trial: optuna.Trial) -> float:
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    layers = trial.suggest_int("layers", 1, 8)
    dropout = trial.suggest_float("dropout", 0.0, 0.5, step=0.05)
    return (lr - 3e-3) ** 2 * 1e4 + (layers - 3) ** 2 + abs(dropout - 0.2) + 0.5


if __name__ == "__main__":
    module = optunahub.load_module("samplers/black_box_bfo")
    sampler = module.BlackBoxSampler(n_trials=400, seed=0)
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=400)
    print(study.best_trial.params, study.best_value)
