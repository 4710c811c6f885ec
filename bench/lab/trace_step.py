"""Timeline of one eager module call, to see what the GPU waits for.

    python bench/lab/trace_step.py [dtype] [batch] [hidden] [--out DIR]

Records a forward (no_grad) and a training step (forward + backward of
output.sum()) with torch.profiler and prints, per call, every kernel, every CUDA runtime call and
every torch op of 4 µs or more in time order, relative to the call's start (µs),
and the GPU idle time between the call's start and its last kernel. The
Chrome traces go to --out (open in chrome://tracing or Perfetto).
"""
import argparse
import json
import os

import torch
from torch.profiler import ProfilerActivity, profile

import torch_prnn


def timeline(trace_path, label):
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    marks = [e for e in events if e.get("name") == label and e.get("cat") == "user_annotation"]
    start = float(marks[-1]["ts"])  # the last (warm) call
    end = start + float(marks[-1]["dur"])
    rows = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime",
                                                       "cuda_driver", "cpu_op", "python_function"):
            continue
        ts = float(e["ts"])
        host = e["cat"] not in ("kernel", "gpu_memcpy", "gpu_memset")
        if host and (not start <= ts <= end or (e["cat"] == "cpu_op" and float(e["dur"]) < 4)):
            continue
        rows.append((ts - start, float(e["dur"]), e["cat"], e["name"]))
    rows.sort()
    gpu = [r for r in rows if r[2] in ("kernel", "gpu_memcpy", "gpu_memset") and r[0] >= 0]
    # kernels launched by this call: from the first after start on
    busy, cursor, idle = 0.0, 0.0, 0.0
    for t, d, _, _ in gpu:
        if t > cursor:
            idle += t - cursor
        cursor = max(cursor, t + d)
        busy += d
    print(f"\n== {label}: host {end - start:8.1f} us; GPU busy {busy:8.1f} us, idle before/between kernels "
          f"{idle:8.1f} us, last kernel ends at {cursor:8.1f} us")
    for t, d, cat, name in rows:
        if t < -5 or (cat not in ("kernel", "gpu_memcpy", "gpu_memset") and t > cursor):
            continue
        print(f"  {t:9.1f} {d:8.1f}  {'GPU ' if cat in ('kernel', 'gpu_memcpy', 'gpu_memset') else 'host'} {name[:90]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dtype", nargs="?", default="bfloat16")
    ap.add_argument("batch", nargs="?", type=int, default=4)
    ap.add_argument("hidden", nargs="?", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--out", default="build/trace")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    model = torch_prnn.PersistentRNN(args.hidden, args.hidden, device=args.device, dtype=dtype)
    x = torch.randn(args.steps, args.batch, args.hidden, device=args.device, dtype=dtype)
    h0 = torch.randn(1, args.batch, args.hidden, device=args.device, dtype=dtype)
    params = list(model.parameters())

    def forward():
        with torch.no_grad():
            model(x, h0)

    def train_step():
        torch.autograd.grad(model(x, h0)[0].sum(), params)

    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for label, fn in (("forward", forward), ("train_step", train_step)):
        for _ in range(5):
            fn()
        sync()
        with profile(activities=activities) as prof:
            for _ in range(3):
                with torch.profiler.record_function(label):
                    fn()
                sync()
        path = os.path.join(args.out, f"{label}_{args.dtype}_B{args.batch}_H{args.hidden}.json")
        prof.export_chrome_trace(path)
        timeline(path, label)


if __name__ == "__main__":
    main()
