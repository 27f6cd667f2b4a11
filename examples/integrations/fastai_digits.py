"""HybridBFO trains a digits classifier with fastai's ``learn.fit_one_cycle``.

    python examples/integrations/fastai_digits.py         # about 15 s on a laptop CPU

``bfo_opt`` is the ``opt_func``; ``BFOCallback`` hands the optimizer each batch's closure.
"""

from __future__ import annotations

import warnings

import fastai.callback.schedule  # noqa: F401  (adds Learner.fit_one_cycle)
import torch
from fastai.data.core import DataLoaders
from fastai.data.load import DataLoader
from fastai.learner import Learner
from fastai.metrics import accuracy
from sklearn.datasets import load_digits
from torch import nn

from functional_bfo.adapters import HybridBFO
from functional_bfo.adapters.fastai import BFOCallback, bfo_opt


def main(epochs: int = 3) -> float:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    pairs = list(zip(x, y))
    dls = DataLoaders(DataLoader(pairs[:1400], bs=256, shuffle=True),
                      DataLoader(pairs[1400:], bs=256), device="cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    learn = Learner(dls, model, loss_func=nn.functional.cross_entropy, metrics=accuracy,
                    opt_func=bfo_opt(HybridBFO, population_size=8, gradient_weight=0.7,
                                     step_size=0.5, init_scale=0.1, seed=0),
                    cbs=BFOCallback())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fastai's own deprecations
        learn.fit_one_cycle(epochs, lr_max=5.0)
    train_loss, valid_loss, valid_accuracy = learn.recorder.values[-1]
    print(f"epoch {epochs}: valid loss {valid_loss:.4f}, accuracy {valid_accuracy:.1%}")
    return valid_loss


if __name__ == "__main__":
    main()
