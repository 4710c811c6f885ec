"""The cost of one timestep a call: `y, h = module(x_t.unsqueeze(0), h)` under
torch.no_grad(), the state carried from call to call, as an inference server
or a robot steps a recurrent model. PersistentRNN / PersistentLSTM /
PersistentGRU against nn.RNN / nn.LSTM / nn.GRU with the same weights, in
one process.

    python bench/call_cost.py [--cell rnn lstm gru] [--dtype float32 bfloat16]
                              [--batch 1] [--hidden 1024 256] [--calls 5000]
                              [--warmup 500] [--device cuda|cpu] [--threads N]
                              [--out call_cost.json]

Each figure is the median wall time of one call, synchronised
(torch.cuda.synchronize() before the clock stops, on CUDA), over --calls
calls after --warmup untimed ones; ours and nn's alternate in rounds of
--calls / 10, so that a change of load on the machine hits both. The device
is CUDA when there is one; bfloat16 runs where the device supports it. A
tiny size (--hidden 8 --threads 1 on the CPU) leaves the per-call cost of
Python, dispatch and argument handling nearly alone.
With --out, the records go there as JSON:
{"impl": "prnn" | "cudnn" ("torch" on the CPU), "cell", "dtype", "batch",
 "hidden", "steps": 1, "pass": "forward", "us_per_call", "device", "torch",
 "cuda", "date"}.
"""
import argparse
import datetime
import json
import statistics
import time

import torch

import torch_prnn

CELLS = {"rnn": ("RNN", "from_rnn"), "lstm": ("LSTM", "from_lstm"), "gru": ("GRU", "from_gru")}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ROUNDS = 10


def supports(device, dtype):
    if device == "cuda" and dtype == torch.bfloat16:
        return torch.cuda.is_bf16_supported()
    return True


def step_timer(module, x, h, sync):
    """A function that makes `calls` timed calls, the state carried, and
    returns their wall times in µs."""
    state = [h]

    def timed(calls):
        times = []
        with torch.no_grad():
            for _ in range(calls):
                start = time.perf_counter_ns()
                _, state[0] = module(x, state[0])
                sync()
                times.append((time.perf_counter_ns() - start) / 1000)
        return times

    return timed


def bench_cell(cell, dtype, batch, hidden, device, calls, warmup):
    """{impl: median µs per call} for ours and nn's module of one shape."""
    nn_name, convert = CELLS[cell]
    torch.manual_seed(0)
    theirs = getattr(torch.nn, nn_name)(hidden, hidden, device=device, dtype=dtype).eval()
    ours = getattr(getattr(torch_prnn, "Persistent" + nn_name), convert)(theirs)
    x = torch.randn(batch, hidden, device=device, dtype=dtype).unsqueeze(0)  # x_t.unsqueeze(0): T = 1
    h = torch.randn(1, batch, hidden, device=device, dtype=dtype)
    hx = (h, torch.randn_like(h)) if cell == "lstm" else h
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    timers = {"prnn": step_timer(ours, x, hx, sync), "theirs": step_timer(theirs, x, hx, sync)}
    for timer in timers.values():
        timer(warmup)
    times = {impl: [] for impl in timers}
    per_round = max(1, calls // ROUNDS)
    for _ in range(ROUNDS):
        for impl, timer in timers.items():
            times[impl] += timer(per_round)
    return {impl: statistics.median(ts) for impl, ts in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", nargs="+", choices=sorted(CELLS), default=["rnn", "lstm", "gru"])
    ap.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1])
    ap.add_argument("--hidden", nargs="+", type=int, default=[1024, 256])
    ap.add_argument("--calls", type=int, default=5000, help="timed calls per module and shape")
    ap.add_argument("--warmup", type=int, default=500, help="untimed calls before them")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    ap.add_argument("--out", help="write the records to this JSON file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cuda = args.device == "cuda"
    theirs = "cudnn" if cuda else "torch"
    meta = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(),
    }
    print(f"one T = 1 call under no_grad, median µs ({meta['device']}, torch {meta['torch']}, "
          f"{args.calls} calls after {args.warmup})")
    print(f"{'cell':5} {'dtype':9} {'B':>3} {'H':>5} {'prnn':>8} {theirs:>8} {theirs + '/prnn':>11}")
    records = []
    for cell in args.cell:
        for dtype_name in args.dtype:
            dtype = DTYPES[dtype_name]
            if not supports(args.device, dtype):
                print(f"{cell:5} {dtype_name:9} not supported on this device")
                continue
            for batch in args.batch:
                for hidden in args.hidden:
                    us = bench_cell(cell, dtype, batch, hidden, args.device, args.calls, args.warmup)
                    print(f"{cell:5} {dtype_name:9} {batch:3} {hidden:5} {us['prnn']:8.1f} {us['theirs']:8.1f} "
                          f"{us['theirs'] / us['prnn']:11.2f}", flush=True)
                    shape = {"cell": cell, "dtype": dtype_name, "batch": batch, "hidden": hidden, "steps": 1,
                             "pass": "forward"}
                    for impl, key in (("prnn", "prnn"), (theirs, "theirs")):
                        records.append({"impl": impl, **shape, "us_per_call": round(us[key], 2), **meta})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
        print(f"wrote {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
