import torch

model = torch.nn.Linear(4, 4)
print("evaluating only", model(torch.randn(2, 4)).sum().item())
