"""Where an eager T = 1 no-grad call's time goes on this machine (bench/NOTES.md
step 65): for each module, B = 1, the state carried, the median over 2000
calls of its host time (to the call's return) and wall time (through
torch.cuda.synchronize()), beside the pieces of an Elman call alone (its ops,
cuBLAS's F.linear, an allocation, a one-element add_) and nn's module; then
torch.profiler's table of 50 calls of ours. Hand-over off.

    python3 bench/lab/t1_profile.py
"""
import os
import statistics
import time

os.environ.setdefault("PRNN_TORCH_FALLBACK", "0")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import torch_prnn  # noqa: E402

CALLS, WARMUP = 2000, 200
SHAPES = (("rnn", "float32", 1024), ("rnn", "bfloat16", 1024), ("lstm", "bfloat16", 640), ("gru", "bfloat16", 1024))
MODULES = {"rnn": ("RNN", "from_rnn"), "lstm": ("LSTM", "from_lstm"), "gru": ("GRU", "from_gru")}


def host_and_wall_us(fn):
    host, wall = [], []
    for i in range(WARMUP + CALLS):
        start = time.perf_counter_ns()
        fn()
        returned = time.perf_counter_ns()
        torch.cuda.synchronize()
        done = time.perf_counter_ns()
        if i >= WARMUP:
            host.append((returned - start) / 1e3)
            wall.append((done - start) / 1e3)
    return statistics.median(host), statistics.median(wall)


def row(name, fn):
    host, wall = host_and_wall_us(fn)
    print(f"{name:40} {host:8.2f} {wall:8.2f}", flush=True)


def stepper(module, x, hx):
    state = [hx]

    def call():
        _, state[0] = module(x, state[0])

    return call


def main():
    torch.set_grad_enabled(False)
    print(f"{'call (µs, median of %d)' % CALLS:40} {'host':>8} {'wall':>8}")
    row("torch.cuda.synchronize() alone", lambda: None)
    one = torch.zeros(1, device="cuda")
    row("x.add_(0), one element", lambda: one.add_(0))
    for cell, dtype_name, hidden in SHAPES:
        dtype = getattr(torch, dtype_name)
        nn_name, convert = MODULES[cell]
        torch.manual_seed(0)
        theirs = getattr(torch.nn, nn_name)(hidden, hidden, device="cuda", dtype=dtype)
        ours = getattr(getattr(torch_prnn, "Persistent" + nn_name), convert)(theirs)
        x = torch.randn(1, 1, hidden, device="cuda", dtype=dtype)
        h = torch.randn(1, 1, hidden, device="cuda", dtype=dtype)
        hx = (h, torch.randn_like(h)) if cell == "lstm" else h
        tier = torch_prnn.plan(hidden, batch=1, steps=1, dtype=dtype, device="cuda", cell=cell, input_size=hidden)
        print(f"-- {cell} {dtype_name} B=1 H={hidden} ({tier['tier']})")
        ours_call = stepper(ours, x, hx)
        row("ours", ours_call)
        row("nn's", stepper(theirs, x, hx))
        if cell == "rnn":
            w_ih, w_hh, b_ih, b_hh = ours.weight_ih_l0, ours.weight_hh_l0, ours.bias_ih_l0, ours.bias_hh_l0
            xp = F.linear(x, w_ih, b_ih + b_hh)
            row("prnn::layer alone", lambda: torch.ops.prnn.layer(x, w_ih, b_ih, b_hh, h[0], w_hh, None, "tanh"))
            row("prnn::forward alone (xp given)", lambda: torch.ops.prnn.forward(xp, h[0], w_hh, None, "tanh"))
            row("F.linear alone", lambda: F.linear(x, w_ih, b_ih))
            row("torch.empty(1, 1, H)", lambda: torch.empty(1, 1, hidden, device="cuda", dtype=dtype))
        for _ in range(50):
            ours_call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                ours_call()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=18, max_name_column_width=48))


if __name__ == "__main__":
    main()
