# zoo: source https://github.com/pytorch/examples time_sequence_prediction/generate_sine_wave.py at commit 77f55b912142e11fcfdf5b530231fb9c52f181e8
# zoo: kept as its authors wrote it; every line changed for an offline CPU run says "# zoo:"
import numpy as np
import torch

np.random.seed(2)

T = 20
L = 40  # zoo: changed: 1000 time steps make each LBFGS step take seconds on 2 cores
N = 100

x = np.empty((N, L), 'int64')
x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
data = np.sin(x / 1.0 / T).astype('float64')
torch.save(data, open('traindata.pt', 'wb'))
