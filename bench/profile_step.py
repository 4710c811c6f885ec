"""One op launch at H = 1024, T = 256, for ncu (the third call is the warm one):
    ncu --kernel-name regex:rnn_kernel --launch-skip 2 --launch-count 1 python3 bench/profile_step.py [dtype] [batch]
    python3 bench/profile_step.py float32 4 layer   # prnn::layer: x W_ih^T in the same launch where planned
"""
import sys

import torch

import torch_prnn  # noqa: F401

dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 4
layer = len(sys.argv) > 3 and sys.argv[3] == "layer"
hidden, steps = 1024, 256
w = (torch.rand(hidden, hidden, device="cuda", dtype=dtype) * 2 - 1) * hidden ** -0.5
h0 = torch.randn(batch, hidden, device="cuda", dtype=dtype)
x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
for _ in range(3):
    if layer:
        torch.ops.prnn.layer(x, w, None, None, h0, w, None, "tanh")
    else:
        torch.ops.prnn.forward(x, h0, w, None, "tanh")
torch.cuda.synchronize()
