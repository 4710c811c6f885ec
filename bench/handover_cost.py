"""What a call handed over to torch's recurrence (torch_prnn/_crossover.py)
costs on top of nn's own call: PersistentRNN / PersistentLSTM / PersistentGRU
with every call handed over, against nn.RNN / nn.LSTM / nn.GRU with the same
weights and against the bare torch._VF call both make (nn's _flat_weights), in
one process.

    python bench/handover_cost.py [--cell rnn lstm gru] [--hidden 8 256] [--batch 1]
                                  [--steps 1] [--calls 2000] [--rounds 10]
                                  [--device cpu|cuda] [--dtype float32] [--threads 1]

Passes: "fwd" (under no_grad) and "fwdbwd" (the forward, then the gradients
of <output, a fixed random tensor> for the input and the parameters, as
bench/sweep.py times them). Each figure is the median over --rounds rounds of
the mean wall time of --calls calls (synchronised at the end of a round on
CUDA); the three callables alternate round by round, so a change of load on
the machine hits all three. A tiny size (--hidden 8 --threads 1) leaves the
host cost of Python, dispatch and argument handling nearly alone. The
hand-over is forced for every batch and hidden size by widening
_crossover's tables, so the modules still run the real torch_runs.
"""
import argparse
import os
import statistics
import sys
import time

import torch

# torch_prnn from this checkout when it is not installed (after the installed one on the path).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_prnn  # noqa: E402
from torch_prnn import _crossover  # noqa: E402

CELLS = {"rnn": ("RNN", "from_rnn", "rnn_tanh"), "lstm": ("LSTM", "from_lstm", "lstm"), "gru": ("GRU", "from_gru", "gru")}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hand_everything_over():
    """Every module call of a float dtype on the CPU or CUDA goes to torch."""
    _crossover.enabled = True
    _crossover.cpu_torch_runs = lambda *args: True
    _crossover._FEW_STEPS_MAX_BATCH = 0  # one timestep a call too
    for limits in (_crossover._CUDA_LIMITS, _crossover._CLUSTER_LIMITS):
        for key in limits:
            limits[key] = ((float("inf"), 0),)


def callables(cell, dtype, batch, hidden, steps, device):
    """{name: fn} for each pass: nn's module, ours, and the bare _VF call."""
    nn_name, convert, vf_name = CELLS[cell]
    torch.manual_seed(0)
    theirs = getattr(torch.nn, nn_name)(hidden, hidden, device=device, dtype=dtype)
    ours = getattr(getattr(torch_prnn, "Persistent" + nn_name), convert)(theirs)
    x = torch.randn(steps, batch, hidden, device=device, dtype=dtype, requires_grad=True)
    h = torch.randn(1, batch, hidden, device=device, dtype=dtype)
    hx = (h, torch.randn_like(h)) if cell == "lstm" else h
    grad_y = torch.randn(steps, batch, hidden, device=device, dtype=dtype)
    assert _crossover.torch_runs(cell, dtype, device, batch, hidden, training=True)
    vf = getattr(torch._VF, vf_name)

    def bare(x, hx):
        return vf(x, hx, theirs._flat_weights, True, 1, 0.0, theirs.training, False, False)

    calls = {"_VF": bare, "nn": theirs, "ours": ours}
    passes = {}
    passes["fwd"] = {}
    for name, fn in calls.items():
        def forward(fn=fn):
            with torch.no_grad():
                fn(x, hx)
        passes["fwd"][name] = forward
    passes["fwdbwd"] = {}
    params = list(theirs.parameters())  # the bare call's leaves are nn's
    for name, fn in calls.items():
        leaves = [x, *(ours.parameters() if name == "ours" else params)]

        def forward_backward(fn=fn, leaves=leaves):
            torch.autograd.grad(fn(x, hx)[0], leaves, grad_y)
        passes["fwdbwd"][name] = forward_backward
    return passes


def time_rounds(fns, calls, rounds, sync):
    """{name: median over rounds of µs per call}, the fns alternating round by round."""
    for fn in fns.values():
        for _ in range(max(10, calls // 10)):
            fn()
    sync()
    times = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for name in order:
            fn = fns[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            times[name].append(1e6 * (time.perf_counter() - start) / calls)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", nargs="+", choices=list(CELLS), default=list(CELLS))
    ap.add_argument("--hidden", nargs="+", type=int, default=[8, 256])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--calls", type=int, default=2000, help="calls a round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--passes", nargs="+", choices=("fwd", "fwdbwd"), default=["fwd", "fwdbwd"])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hand_everything_over()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    print(f"{args.device}, torch {torch.__version__}, {args.threads} threads, {args.dtype}, B={args.batch} "
          f"T={args.steps}; µs a call, median of {args.rounds} rounds of {args.calls} calls")
    print(f"{'cell':5} {'H':>5} {'pass':6} {'_VF':>8} {'nn':>8} {'ours':>8} {'nn-_VF':>7} {'ours-_VF':>8} {'ours-nn':>7}")
    for cell in args.cell:
        for hidden in args.hidden:
            passes = callables(cell, DTYPES[args.dtype], args.batch, hidden, args.steps, args.device)
            for pass_name in args.passes:
                us = time_rounds(passes[pass_name], args.calls, args.rounds, sync)
                print(f"{cell:5} {hidden:5} {pass_name:6} {us['_VF']:8.2f} {us['nn']:8.2f} {us['ours']:8.2f} "
                      f"{us['nn'] - us['_VF']:7.2f} {us['ours'] - us['_VF']:8.2f} {us['ours'] - us['nn']:7.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
