"""Times PersistentRNN / PersistentLSTM / PersistentGRU against nn.RNN / nn.LSTM /
nn.GRU on the CPU, in one process, and writes the records as JSON.

    python bench/cpu_bench.py [--cell rnn lstm gru] [--batch 1 4 16] [--hidden 256 1024]
                              [--reps 5] [--threads 2] [--out bench/results/cpu.json]

Each figure is the median over --reps runs of one call, ours and torch's
alternating so that a load change on the machine hits both, divided by the
number of steps. Passes: "fwd" (under no_grad) and "fwdbwd" (forward, then
autograd.grad of output.sum() for the parameters). Each record:
{"impl", "cell", "dtype", "batch", "hidden", "steps", "pass", "us_per_step",
 "device", "torch", "date"}.
"""
import argparse
import datetime
import json
import os
import statistics
import time

import torch

import torch_prnn

CELLS = {  # --cell: (torch module, ours, converter)
    "rnn": ("RNN", "PersistentRNN", "from_rnn"),
    "lstm": ("LSTM", "PersistentLSTM", "from_lstm"),
    "gru": ("GRU", "PersistentGRU", "from_gru"),
}


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_shape(cell, batch, hidden, steps, reps):
    """{(impl, pass): us_per_step} and our output's relative error against torch's."""
    torch_name, ours_name, convert = CELLS[cell]
    torch.manual_seed(0)
    ref = getattr(torch.nn, torch_name)(hidden, hidden)
    ours = getattr(getattr(torch_prnn, ours_name), convert)(ref)
    x = torch.randn(steps, batch, hidden)
    h0 = torch.randn(1, batch, hidden)
    hx = (h0, torch.randn_like(h0)) if cell == "lstm" else h0

    def forward(model):
        with torch.no_grad():
            model(x, hx)

    def forward_backward(model):
        y, _ = model(x, hx)
        torch.autograd.grad(y.sum(), list(model.parameters()))

    with torch.no_grad():
        y_ours, y_ref = ours(x, hx)[0].double(), ref(x, hx)[0].double()
        err = ((y_ours - y_ref).norm() / y_ref.norm()).item()
    out = {}
    for pass_name, fn in (("fwd", forward), ("fwdbwd", forward_backward)):
        fn(ours), fn(ref)  # warm-up
        times = {"prnn": [], "torch": []}
        for _ in range(reps):
            times["prnn"].append(seconds(lambda: fn(ours)))
            times["torch"].append(seconds(lambda: fn(ref)))
        for impl, ts in times.items():
            out[(impl, pass_name)] = 1e6 * statistics.median(ts) / steps
    return out, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", nargs="+", choices=sorted(CELLS), default=["rnn", "lstm", "gru"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--hidden", nargs="+", type=int, default=[256, 1024])
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    date = datetime.date.today().isoformat()
    records = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, T={args.steps}, float32, "
          f"median of {args.reps}; ratio = torch / ours (> 1: ours faster)")
    print(f"{'cell':5} {'B':>3} {'H':>5} | {'fwd ours':>9} {'torch':>9} {'ratio':>6} | "
          f"{'f+b ours':>9} {'torch':>9} {'ratio':>6} | rel err")
    for cell in args.cell:
        for hidden in args.hidden:
            for batch in args.batch:
                us, err = bench_shape(cell, batch, hidden, args.steps, args.reps)
                row = f"{cell:5} {batch:>3} {hidden:>5} |"
                for pass_name in ("fwd", "fwdbwd"):
                    ours, ref = us[("prnn", pass_name)], us[("torch", pass_name)]
                    row += f" {ours:9.1f} {ref:9.1f} {ref / ours:6.2f} |"
                print(row + f" {err:.1e}", flush=True)
                for (impl, pass_name), value in us.items():
                    records.append({
                        "impl": impl, "cell": cell, "dtype": "float32", "batch": batch,
                        "hidden": hidden, "steps": args.steps, "pass": pass_name,
                        "us_per_step": round(value, 2), "device": "cpu",
                        "torch": torch.__version__, "date": date,
                    })
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
