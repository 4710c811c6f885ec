"""One forward launch of the persistent kernel, for ncu:
    ncu --kernel-name regex:persistent --launch-skip 2 --launch-count 1 python3 bench/lab/profile_step.py
"""
import sys

import torch

import torch_prnn  # noqa: F401

dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 4
hidden, steps = 1024, 256
w = (torch.rand(hidden, hidden, device="cuda", dtype=dtype) * 2 - 1) * hidden ** -0.5
h0 = torch.randn(batch, hidden, device="cuda", dtype=dtype)
xp = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
for _ in range(3):
    torch.ops.prnn.forward(xp, h0, w, None, "tanh")
torch.cuda.synchronize()
