"""Forward and backward launches of a gated layer, for ncu (float32, the grid
family's both passes with PRNN_GATED_FFMA=1):
    PRNN_GATED_FFMA=1 PRNN_TORCH_FALLBACK=0 ncu --kernel-name regex:gated_ffma --launch-skip 2 --launch-count 2 \
        python3 bench/lab/profile_gated.py lstm float32 4
"""
import sys

import torch

import torch_prnn

cell = sys.argv[1] if len(sys.argv) > 1 else "lstm"
dtype = getattr(torch, sys.argv[2]) if len(sys.argv) > 2 else torch.float32
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 4
hidden, steps = 1024, 256
module = {"lstm": torch_prnn.PersistentLSTM, "gru": torch_prnn.PersistentGRU}[cell]
rnn = module(hidden, hidden, device="cuda", dtype=dtype)
x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype, requires_grad=True)
for _ in range(3):
    y, _ = rnn(x)
    y.sum().backward()
torch.cuda.synchronize()
print(torch_prnn.plan(hidden, batch=batch, cell=cell, dtype=dtype, device="cuda"))
