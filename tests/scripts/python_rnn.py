"""A character RNN whose time loop is Python: an LSTMCell called once per time step inside
the model's forward, trained with SGD and truncated backpropagation.

Prints ``step N loss X``.
"""

import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--length", type=int, default=16)
args = parser.parse_args()
torch.manual_seed(7)
CHARS = 20


class CharRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(CHARS, 12)
        self.cell = nn.LSTMCell(12, 24)
        self.out = nn.Linear(24, CHARS)

    def forward(self, x, state):
        logits = []
        for t in range(x.size(1)):
            state = self.cell(self.embed(x[:, t]), state)
            logits.append(self.out(state[0]))
        return torch.stack(logits, dim=1), state


model = CharRNN()
opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
text = torch.randint(0, CHARS, (4, args.length * (args.steps + 1) + 1))
state = (torch.zeros(4, 24), torch.zeros(4, 24))
for step in range(args.steps):
    chunk = text[:, step * args.length:(step + 1) * args.length + 1]
    state = tuple(s.detach() for s in state)
    logits, state = model(chunk[:, :-1], state)
    loss = nn.functional.cross_entropy(logits.reshape(-1, CHARS), chunk[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
