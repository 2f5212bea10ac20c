"""A word-level LSTM language model trained with a hand-written SGD update and no optimizer
object: ``model.zero_grad()``, ``loss.backward()``, clipping, ``p.data.add_(p.grad, alpha=-lr)``,
hidden state carried (detached) from batch to batch, and a test pass under no_grad at the end.

Prints ``step N loss X`` per batch and ``test loss X`` at the end.
"""

import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--bptt", type=int, default=8)
parser.add_argument("--lr", type=float, default=5.0)
parser.add_argument("--no-grad-update", action="store_true",
                    help="update with `with torch.no_grad(): p -= lr * p.grad` instead of p.data")
args = parser.parse_args()
torch.manual_seed(1111)
NTOKENS = 50


class RNNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(NTOKENS, 16)
        self.rnn = nn.LSTM(16, 24, num_layers=2)
        self.decoder = nn.Linear(24, NTOKENS)

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.encoder(x), hidden)
        return torch.log_softmax(self.decoder(output), dim=-1), hidden

    def init_hidden(self, batch):
        return (torch.zeros(2, batch, 24), torch.zeros(2, batch, 24))


def repackage(h):
    return tuple(v.detach() for v in h)


corpus = torch.randint(0, NTOKENS, (args.bptt * (args.steps + 2) + 1, 4))
model = RNNModel()
criterion = nn.NLLLoss()
hidden = model.init_hidden(4)
for step, i in enumerate(range(0, args.bptt * args.steps, args.bptt)):
    data, targets = corpus[i:i + args.bptt], corpus[i + 1:i + 1 + args.bptt]
    hidden = repackage(hidden)
    model.zero_grad()
    output, hidden = model(data, hidden)
    loss = criterion(output.view(-1, NTOKENS), targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    if args.no_grad_update:
        with torch.no_grad():
            for p in model.parameters():
                p -= args.lr * p.grad
    else:
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-args.lr)
    print(f"step {step} loss {loss.item()!r}", flush=True)

model.eval()
with torch.no_grad():
    tail = corpus[-args.bptt - 1:]
    output, _ = model(tail[:-1], model.init_hidden(4))
    print(f"test loss {criterion(output.view(-1, NTOKENS), tail[1:].reshape(-1)).item()!r}", flush=True)
