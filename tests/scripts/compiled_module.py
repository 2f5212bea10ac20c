"""``torch.compile`` of a plain ``nn.Module`` (not a container: no ``__len__``), six SGD steps.

A reproduction from the zoo (nanoGPT's train.py with compile=True, llm.c's train_gpt2.py with
--compile 1, the Hugging Face Trainer with --torch_compile). The eager backend needs no C++
compiler. Prints ``step N loss X``.
"""

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


torch.manual_seed(0)
model = torch.compile(Net(), backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(4, 8)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
