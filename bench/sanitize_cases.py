"""Forward and backward of every kernel family for compute-sanitizer (memcheck,
racecheck, synccheck): small T, shapes up to the on-chip limits; then whole
layers (prnn::layer) whose input projection runs in the recurrence's launch.

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 bench/sanitize_cases.py [tier ...]

With tier names (e.g. persistent_cluster) only the cases planned on those tiers run;
with "layers", only the whole layers; with "gated", only the LSTM and GRU cases (also
prnn::gated_layer's).
"""
import sys

import torch

import torch_prnn

CASES = [  # (T, B, H, dtype, with lengths)
    (3, 1, 7, torch.float32, False),
    (3, 2, 33, torch.bfloat16, True),  # a cluster of two CTAs, the second all padding
    (4, 5, 129, torch.bfloat16, True),
    (3, 12, 1024, torch.bfloat16, True),  # cluster tier: 16 CTAs x 2 clusters
    (3, 4, 1000, torch.float16, False),
    (3, 4, 1024, torch.float32, True),  # float32 cluster tier (cluster_ffma.cuh)
    (3, 17, 1024, torch.float32, True),  # float32 cluster tier, more clusters than fit at once
    (3, 3, 500, torch.float32, True),  # float32 cluster tier, all rows in registers
    (3, 3, 1100, torch.float32, True),  # the FFMA kernel at 72 rows a CTA
    (3, 4, 1152, torch.bfloat16, True),  # the tensor-core kernel at 72 rows a CTA
    (3, 2, 1025, torch.float16, False),
    (3, 12, 1100, torch.bfloat16, True),  # the same, 6 clusters of 2 sequences
    (3, 4, 2048, torch.float32, False),
    (3, 6, 2048, torch.float32, True),  # the cluster grid (cluster_grid.cuh)
    (3, 9, 1300, torch.bfloat16, True),  # the cluster grid, two groups of sequences
    (3, 4, 2304, torch.bfloat16, False),  # the grid tier
    (3, 4, 2816, torch.bfloat16, False),
    (3, 3, 2816, torch.float16, True),
    (3, 2, 64, torch.float64, True),
    (2, 2, 4096, torch.float32, False),
]

for T, B, H, dtype, with_lengths in CASES:
    tier = torch_prnn.plan(H, batch=B, steps=T, dtype=dtype, device="cuda")["tier"]
    if len(sys.argv) > 1 and (tier not in sys.argv[1:] or {"layers", "gated"} & set(sys.argv[1:])):
        continue
    xp = torch.randn(T, B, H, device="cuda", dtype=dtype)
    h0 = torch.randn(B, H, device="cuda", dtype=dtype)
    w = (torch.rand(H, H, device="cuda", dtype=dtype) * 2 - 1) * H ** -0.5
    lengths = torch.randint(0, T + 1, (B,)) if with_lengths else None
    y, _ = torch.ops.prnn.forward(xp, h0, w, lengths, "tanh")
    torch.cuda.synchronize()  # a failure here is the forward's, not the backward's
    grads = torch.ops.prnn.backward(torch.randn_like(y), y, h0, w, lengths, "tanh")
    torch.cuda.synchronize()
    print(f"T={T} B={B} H={H} {dtype} lengths={with_lengths} tier={tier}: finite={bool(torch.isfinite(y).all())}")

LAYER_CASES = [  # (T, B, I, H, dtype, with lengths): the projection fused, several chunks of steps; small, as
    # racecheck slows the producers' shared-memory traffic past the steppers' 20 s watchdog at I = 1000, T = 40
    (20, 4, 36, 1024, torch.float32, True),
    (9, 3, 33, 1100, torch.float32, False),
    (9, 3, 33, 1000, torch.bfloat16, True),  # 16-bit producers (mma), rows 2-byte aligned: plain loads
    (9, 2, 40, 1024, torch.float16, False),  # rows 16-byte aligned: cp.async
    (40, 4, 24, 1100, torch.bfloat16, True),  # the tensor-core kernel's 72-row shape; 5 chunks of 8 steps
    (70, 1, 7, 129, torch.float32, False),
    (1, 16, 999, 1024, torch.float32, False),  # the few-steps kernel: element loads, four sequence tiles
    (2, 3, 64, 520, torch.bfloat16, False),  # the few-steps kernel: 16-byte loads, two steps
]

for T, B, I, H, dtype, with_lengths in LAYER_CASES:
    plan = torch_prnn.plan(H, batch=B, steps=T, dtype=dtype, device="cuda", input_size=I)
    if len(sys.argv) > 1 and (plan["tier"] not in sys.argv[1:] and "layers" not in sys.argv[1:] or "gated" in sys.argv[1:]):
        continue
    x = torch.randn(T, B, I, device="cuda", dtype=dtype)
    w_ih = (torch.rand(H, I, device="cuda", dtype=dtype) * 2 - 1) * I ** -0.5
    b_ih, b_hh = torch.randn(H, device="cuda", dtype=dtype), torch.randn(H, device="cuda", dtype=dtype)
    h0 = torch.randn(B, H, device="cuda", dtype=dtype)
    w = (torch.rand(H, H, device="cuda", dtype=dtype) * 2 - 1) * H ** -0.5
    lengths = torch.randint(0, T + 1, (B,)) if with_lengths else None
    y, _ = torch.ops.prnn.layer(x, w_ih, b_ih, b_hh, h0, w, lengths, "tanh")
    torch.cuda.synchronize()
    print(f"layer T={T} B={B} I={I} H={H} {dtype} lengths={with_lengths} tier={plan['tier']} "
          f"fused={plan['fused_input_projection']}: finite={bool(torch.isfinite(y).all())}")

GATED_CASES = [  # (cell, T, B, H, proj_size, dtype, with lengths)
    # float32: the float32 grid family (gated_ffma.cu) forward, the persistent family backward (PRNN_GATED_FFMA=1:
    # the grid family both; =0: the persistent family both)
    ("lstm", 3, 2, 33, 0, torch.float32, True),  # grid: 5 CTAs, the last partly padding
    ("lstm", 3, 8, 1024, 0, torch.float32, True),  # grid: its largest shapes (8 sequences, KL 64)
    ("gru", 3, 12, 520, 0, torch.float32, False),  # grid: two groups of 65 CTAs
    ("lstm", 3, 9, 1024, 0, torch.float32, True),  # persistent either way: more groups than fit at once
    ("lstm", 3, 5, 1024, 0, torch.bfloat16, True),
    ("lstm", 3, 20, 512, 0, torch.float16, False),  # the cluster family: 3 clusters of 7 sequences (fewer live)
    ("gru", 3, 3, 200, 0, torch.bfloat16, True),  # the cluster family: 13 CTAs, the last partly padding
    ("lstm", 2, 9, 7, 0, torch.float16, True),  # the cluster family: two CTAs, the second all padding
    ("gru", 3, 3, 1000, 0, torch.bfloat16, True),  # the grid family: 63 CTAs, the last partly padding
    ("lstm", 3, 9, 640, 0, torch.float16, False),  # the grid family: two groups of 40 CTAs
    ("gru", 4, 17, 513, 0, torch.float16, False),  # the grid family: 4 groups of 33 CTAs, the last CTA one unit
    ("lstm", 2, 16, 1024, 0, torch.bfloat16, True),  # the grid backward's largest shape (32 k-tiles a warp), 2 groups
    ("gru", 3, 3, 129, 0, torch.float32, True),
    ("gru", 3, 4, 1024, 0, torch.float32, False),
    ("lstm", 3, 3, 40, 17, torch.float32, True),  # stepwise: a projection
    ("gru", 3, 2, 64, 0, torch.float64, True),  # stepwise: float64
]

for cell, T, B, H, P, dtype, with_lengths in GATED_CASES:
    tier, backward_tier = (torch_prnn.plan(H, batch=B, steps=T, dtype=dtype, device="cuda", cell=cell, proj_size=P,
                                           backward=backward)["tier"] for backward in (False, True))
    if len(sys.argv) > 1 and not {tier, backward_tier, "gated"} & set(sys.argv[1:]):
        continue
    G, S = (4, P or H) if cell == "lstm" else (3, H)
    xp = torch.randn(T, B, G * H, device="cuda", dtype=dtype)
    b_hh = torch.randn(G * H, device="cuda", dtype=dtype)
    h0 = torch.randn(B, S, device="cuda", dtype=dtype)
    w = (torch.rand(G * H, S, device="cuda", dtype=dtype) * 2 - 1) * S ** -0.5
    lengths = torch.randint(0, T + 1, (B,)) if with_lengths else None
    if cell == "lstm":
        c0 = torch.randn(B, H, device="cuda", dtype=dtype)
        w_hr = (torch.rand(P, H, device="cuda", dtype=dtype) * 2 - 1) * H ** -0.5 if P else None
        y, h_n, c_n, saved = torch.ops.prnn.lstm(xp, b_hh, h0, c0, w, w_hr, lengths, True)
        torch.cuda.synchronize()
        torch.ops.prnn.lstm_backward(torch.randn_like(y), torch.randn_like(h_n), torch.randn_like(c_n), h0, c0, y,
                                     saved, w, w_hr, lengths)
    else:
        y, h_n, saved = torch.ops.prnn.gru(xp, b_hh, h0, w, lengths, True)
        torch.cuda.synchronize()
        torch.ops.prnn.gru_backward(torch.randn_like(y), torch.randn_like(h_n), h0, y, saved, w, lengths)
    torch.cuda.synchronize()
    print(f"{cell} T={T} B={B} H={H} P={P} {dtype} lengths={with_lengths} tier={tier} backward={backward_tier}: "
          f"finite={bool(torch.isfinite(y).all())}")

GATED_LAYER_CASES = [  # (cell, B, I, H, dtype): prnn::gated_layer at T = 1, the few-steps kernel
    ("lstm", 16, 999, 640, torch.float32),  # element loads, four sequence tiles
    ("gru", 3, 64, 520, torch.bfloat16),  # 16-byte loads
]

for cell, B, I, H, dtype in GATED_LAYER_CASES:
    tier = torch_prnn.plan(H, batch=B, steps=1, dtype=dtype, device="cuda", cell=cell, input_size=I)["tier"]
    if len(sys.argv) > 1 and not {tier, "gated"} & set(sys.argv[1:]):
        continue
    G = 4 if cell == "lstm" else 3
    x = torch.randn(1, B, I, device="cuda", dtype=dtype)
    w_ih = (torch.rand(G * H, I, device="cuda", dtype=dtype) * 2 - 1) * I ** -0.5
    b_ih, b_hh = torch.randn(G * H, device="cuda", dtype=dtype), torch.randn(G * H, device="cuda", dtype=dtype)
    h0 = torch.randn(B, H, device="cuda", dtype=dtype)
    c0 = torch.randn(B, H, device="cuda", dtype=dtype) if cell == "lstm" else None
    w = (torch.rand(G * H, H, device="cuda", dtype=dtype) * 2 - 1) * H ** -0.5
    y, h_n, c_n = torch.ops.prnn.gated_layer(x, w_ih, b_ih, b_hh, h0, c0, w, cell.upper())
    torch.cuda.synchronize()
    print(f"gated layer {cell} B={B} I={I} H={H} {dtype} tier={tier}: finite={bool(torch.isfinite(y).all())}")
