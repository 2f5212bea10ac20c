"""A Lightning run with ``advisor.integrations.lightning.AdvisorCallback``
(tests/test_integrations.py): a small MLP regression on random data, CPU, no logger, no
checkpoints. Writes each training step's loss (from ``training_step``'s output) and the session's
id to ``--result``. ``--bare``: the same run without the callback."""

import argparse
import json

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback

from advisor.integrations.lightning import AdvisorCallback

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--result", required=True)
parser.add_argument("--bare", action="store_true")
args = parser.parse_args()


class Regression(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16)
losses = Losses()
advisor_callback = AdvisorCallback(name="lightning")
trainer = Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=args.accumulate,
                  callbacks=[losses] if args.bare else [losses, advisor_callback])
trainer.fit(Regression(), loader)
session = advisor_callback.session
with open(args.result, "w") as handle:
    json.dump({"losses": losses.losses, "global_step": trainer.global_step,
               "session": session.id if session else None, "trainer_steps": advisor_callback.trainer_steps}, handle)
