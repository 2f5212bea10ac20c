"""A Hugging Face ``Trainer`` run with ``advisor.integrations.transformers.AdvisorCallback``
(tests/test_integrations.py): a tiny GPT-2 built from a config (nothing downloaded) on random
tokens. Writes the Trainer's logged loss of each step and the session's id to ``--result``.
``--bare``: the same run without the callback."""

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from advisor.integrations.transformers import AdvisorCallback

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--output", required=True)
parser.add_argument("--result", required=True)
parser.add_argument("--bare", action="store_true")
args = parser.parse_args()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n, length), generator=gen)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class Losses(TrainerCallback):
    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses[state.global_step] = logs["loss"]


torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
training = TrainingArguments(output_dir=args.output, max_steps=args.steps, per_device_train_batch_size=4,
                             gradient_accumulation_steps=args.accumulate, logging_steps=1, report_to=[],
                             save_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                             seed=0, learning_rate=1e-3)
losses = Losses()
advisor_callback = AdvisorCallback(name="hf-trainer")
callbacks = [losses] if args.bare else [losses, advisor_callback]
trainer = Trainer(model=model, args=training, train_dataset=Tokens(64, 16, 64), callbacks=callbacks)
trainer.train()
session = advisor_callback.session
with open(args.result, "w") as handle:
    json.dump({"losses": losses.losses, "global_step": trainer.state.global_step,
               "session": session.id if session else None, "trainer_steps": advisor_callback.trainer_steps,
               "session_steps": len(session.report()["steps"]) if session else None}, handle)
