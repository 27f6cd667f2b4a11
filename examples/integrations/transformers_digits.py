"""BFOTrainer trains a digits classifier with the Hugging Face Trainer's ordinary loop.

    python examples/integrations/transformers_digits.py   # about 15 s on a laptop CPU

HybridBFO is the default optimizer, ``learning_rate`` its largest step; gradient
accumulation scores every candidate of a step on the same two batches.
"""

from __future__ import annotations

import tempfile
import warnings

import torch
from sklearn.datasets import load_digits
from torch import nn
from transformers import TrainingArguments

from functional_bfo.adapters.transformers import BFOTrainer


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Digits(torch.utils.data.Dataset):
    def __init__(self):
        digits = load_digits()
        self.x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        self.y = torch.tensor(digits.target)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def main(steps: int = 40) -> float:
    torch.manual_seed(0)
    model, data = Classifier(), Digits()
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Trainer's advice for plain nn.Modules
        args = TrainingArguments(output_dir=out, max_steps=steps, learning_rate=5.0,
                                 lr_scheduler_type="constant", per_device_train_batch_size=128,
                                 gradient_accumulation_steps=2, logging_steps=max(1, steps // 4),
                                 save_strategy="no", report_to=[], use_cpu=True, seed=0,
                                 remove_unused_columns=False, disable_tqdm=True)
        trainer = BFOTrainer(model=model, args=args, train_dataset=data)
        trainer.train()
    with torch.no_grad():
        accuracy = float((model.net(data.x).argmax(dim=1) == data.y).float().mean())
    loss = [e["loss"] for e in trainer.state.log_history if "loss" in e][-1]
    print(f"step {trainer.state.global_step}: train loss {loss:.4f}, accuracy {accuracy:.1%}")
    return loss


if __name__ == "__main__":
    main()
