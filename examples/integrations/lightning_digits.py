"""HybridBFO trains a digits classifier in Lightning's ordinary automatic optimization.

    python examples/integrations/lightning_digits.py      # about 15 s on a laptop CPU

``configure_optimizers`` returns the optimizer; ``BFOCallback`` keeps the candidates out of
epoch means and logs the swarm's telemetry.
"""

from __future__ import annotations

import warnings

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import nn

from functional_bfo.adapters import HybridBFO
from functional_bfo.adapters.lightning import BFOCallback


class Digits(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)  # the best's loss: a step's last call
        return loss

    def configure_optimizers(self):
        return HybridBFO(self.parameters(), population_size=8, gradient_weight=0.7, lr=5.0,
                         step_size=0.5, init_scale=0.1, seed=0)


def main(epochs: int = 3) -> float:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256,
                                         shuffle=True)
    torch.manual_seed(0)
    model = Digits()
    trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False,
                        enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False, callbacks=[BFOCallback()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on data loader workers
        trainer.fit(model, loader)
    with torch.no_grad():
        accuracy = float((model.net(x).argmax(dim=1) == y).float().mean())
    loss = float(trainer.callback_metrics["train_loss"])
    print(f"step {trainer.global_step}: train loss {loss:.4f}, accuracy {accuracy:.1%}")
    return loss


if __name__ == "__main__":
    main()
