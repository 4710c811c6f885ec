"""Times PersistentRNN / PersistentLSTM / PersistentGRU against nn.RNN / nn.LSTM /
nn.GRU (cuDNN) eager and replayed in a CUDA graph, in one process on one GPU, and
writes bench/results/<device>.json (the records of other cells already there are kept).

    python bench/bench.py [--cell rnn|lstm|gru] [--quick] [--floor build/floor] [--out DIR]
    python bench/bench.py --large [--out DIR]

--large times the Elman cell's large layers (H 1536-4096, B 1-16, float32
and bfloat16) into <device>.large.json; run with PRNN_DISABLE_CLUSTER_TIER=1
(the path of GPUs without clusters; read once a process) its records carry
"clusters": false, and each run keeps the other's records. The modules hand
the calls where cuDNN is faster to it; PRNN_TORCH_FALLBACK=0 times the kernels.

Every figure is the median of CUDA-event timings after warm-up, divided by the
number of steps. Each record:
{"impl", "cell", "dtype", "batch", "hidden", "input", "steps", "layers", "pass",
 "us_per_step", "device", "torch", "cuda", "date"}.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import torch

import torch_prnn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def time_ms(fn, device="cuda"):
    """The time of one call of fn() in ms: between CUDA events on the current
    stream on CUDA (the GPU's time, host gaps it waits through included),
    perf_counter on the CPU, where the call is synchronous."""
    if device == "cpu":
        start = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - start)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def median_ms(fn, iters, warmup=3, before=None, device="cuda"):
    """Median time_ms of fn() after warm-up; before() runs untimed ahead of each
    start event (on the stream, so GPU work it queues delays the start)."""
    for _ in range(warmup):
        fn()
    if device != "cpu":
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if before is not None:
            before()
        times.append(time_ms(fn, device))
    return statistics.median(times)


def graphed(fn):
    """fn captured in a CUDA graph; returns (replay, graph) - keep the graph alive while timing."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay, graph


CELLS = {  # --cell: (torch module, ours, converter, record name)
    "rnn": ("RNN", "PersistentRNN", "from_rnn", "rnn_tanh"),
    "lstm": ("LSTM", "PersistentLSTM", "from_lstm", "lstm"),
    "gru": ("GRU", "PersistentGRU", "from_gru", "gru"),
}


def models(hidden, dtype, cell="rnn", device="cuda"):
    """torch's module (input = hidden, one layer) and ours with its weights,
    each built as a user builds one: created on the device in the dtype, the
    weights copied into ours in place under no_grad, then flatten_parameters()
    on both. On CUDA that makes each module's parameters one buffer in
    cuDNN's layout, except nn's in bfloat16, which nn's flatten_parameters
    leaves as they are: such an nn module compacts its weights on every
    call, with cuDNN's "not part of single contiguous chunk" warning, as a
    user's does (ours flattens bfloat16 too: torch_prnn/_crossover.py)."""
    torch_name, ours_name, _, _ = CELLS[cell]
    ref = getattr(torch.nn, torch_name)(hidden, hidden, device=device, dtype=dtype)
    ours = getattr(torch_prnn, ours_name)(hidden, hidden, device=device, dtype=dtype)
    with torch.no_grad():
        for (name, mine), (ref_name, theirs) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
            assert name == ref_name, (name, ref_name)
            mine.copy_(theirs)
    ref.flatten_parameters()
    ours.flatten_parameters()
    return ref, ours


def initial_state(cell, batch, hidden, dtype, device="cuda"):
    """What the module takes as hx: h0, or (h0, c0) for an LSTM."""
    h0 = torch.randn(1, batch, hidden, device=device, dtype=dtype)
    return (h0, torch.randn_like(h0)) if cell == "lstm" else h0


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def bench_one(dtype_name, batch, hidden, steps, iters, passes, cell="rnn"):
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    ref, ours = models(hidden, dtype, cell)
    x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
    h0 = initial_state(cell, batch, hidden, dtype)
    out = {}
    with torch.no_grad():
        err = rel_err(ours(x, h0)[0], ref(x, h0)[0])
        out[("prnn", "fwd")] = median_ms(lambda: ours(x, h0), iters)
        out[("cudnn", "fwd")] = median_ms(lambda: ref(x, h0), iters)
        replay, graph = graphed(lambda: ref(x, h0))
        out[("cudnn_graph", "fwd")] = median_ms(replay, iters)
        del graph
    if "fwdbwd" in passes:
        for name, model in (("prnn", ours), ("cudnn", ref)):
            params = list(model.parameters())

            def step(model=model, params=params):
                y, _ = model(x, h0)
                torch.autograd.grad(y.sum(), params)

            out[(name, "fwdbwd")] = median_ms(step, max(5, iters // 2))
    return {k: 1000.0 * v / steps for k, v in out.items()}, err


def peak_training_memory(batch, hidden, steps, dtype):
    """Peak bytes allocated by one forward+backward beyond the inputs and weights."""
    ref, ours = models(hidden, dtype)
    x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
    result = {}
    for name, model in (("prnn", ours), ("cudnn", ref)):
        y, _ = model(x)
        torch.autograd.grad(y.sum(), list(model.parameters()))  # warm-up, workspace
        del y
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y, _ = model(x)
        torch.autograd.grad(y.sum(), list(model.parameters()))
        del y
        torch.cuda.synchronize()
        result[name] = torch.cuda.max_memory_allocated() - base
    return result


def slope_intercept(call_at):
    """(µs per step, µs per call) of call_at(steps)(), fitted through T = 64 and 1024."""
    ms = {steps: median_ms(call_at(steps), 15) for steps in (64, 1024)}
    slope = 1000 * (ms[1024] - ms[64]) / (1024 - 64)
    return slope, 1000 * ms[64] - 64 * slope


def host_us_per_call(fn, calls):
    """Host time of fn() in µs, calls back to back without synchronising (the CPU side alone)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = 1e6 * (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    return us


def diagnose():
    """Where a step's time goes: the op alone at several T (slope = per-step
    kernel time, intercept = per-call cost), the host time of a call, and the
    module replayed in a CUDA graph (no launch overhead)."""
    for dtype_name in ("float32", "bfloat16", "float16"):
        dtype = DTYPES[dtype_name]
        for batch in (1, 4, 16):
            hidden = 1024
            w = (torch.rand(hidden, hidden, device="cuda", dtype=dtype) * 2 - 1) * hidden ** -0.5
            h0 = torch.randn(batch, hidden, device="cuda", dtype=dtype)

            def forward_at(steps):
                xp = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
                return lambda: torch.ops.prnn.forward(xp, h0, w, None, "tanh")

            def backward_at(steps):
                gy = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
                y = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype).tanh()
                return lambda: torch.ops.prnn.backward(gy, y, h0, w, None, "tanh")

            slope, intercept = slope_intercept(forward_at)
            bslope, bintercept = slope_intercept(backward_at)
            one_step_us = 1000 * median_ms(forward_at(1), 15)
            host_us = host_us_per_call(forward_at(256), 50)
            ref, ours = models(hidden, dtype)
            x = torch.randn(256, batch, hidden, device="cuda", dtype=dtype)
            with torch.no_grad():
                replay, graph = graphed(lambda: ours(x))
                graph_us = 1000 * median_ms(replay, 15) / 256
                eager_us = 1000 * median_ms(lambda: ours(x), 15) / 256
            params = list(ours.parameters())

            def train_step():
                torch.autograd.grad(ours(x)[0].sum(), params)

            fb_eager_us = 1000 * median_ms(train_step, 15) / 256
            replay, graph = graphed(train_step)
            fb_graph_us = 1000 * median_ms(replay, 15) / 256
            del graph
            print(f"diag {dtype_name:8s} B={batch:2d} H={hidden}: op slope {slope:6.3f} us/step, intercept "
                  f"{intercept:7.1f} us, T=1 {one_step_us:6.1f} us; host {host_us:6.1f} us/call; module eager "
                  f"{eager_us:6.3f}, graph {graph_us:6.3f} us/step | backward op slope {bslope:6.3f}, intercept "
                  f"{bintercept:7.1f} us; module fwd+bwd eager {fb_eager_us:6.3f}, graph {fb_graph_us:6.3f} us/step",
                  flush=True)


def host_costs(dtype_name="bfloat16", batch=4, hidden=1024, steps=256, calls=50):
    """Host time per call (µs, no synchronisation: the CPU side alone) of each
    piece of an eager module forward under no_grad, on this machine's CPU."""
    import torch.nn.functional as F
    dtype = DTYPES[dtype_name]
    ref, ours = models(hidden, dtype)
    x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
    h0 = torch.randn(1, batch, hidden, device="cuda", dtype=dtype)
    xp = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
    w_ih, w_hh, b_ih, b_hh = ours.weight_ih_l0, ours.weight_hh_l0, ours.bias_ih_l0, ours.bias_hh_l0
    b = b_ih + b_hh
    pieces = {
        "module": lambda: ours(x, h0),
        "nn.RNN": lambda: ref(x, h0),
        "bias add": lambda: b_ih + b_hh,
        "F.linear": lambda: F.linear(x, w_ih, b),
        "prnn::forward": lambda: torch.ops.prnn.forward(xp, h0[0], w_hh, None, "tanh"),
        "prnn::layer": lambda: torch.ops.prnn.layer(x, w_ih, b_ih, b_hh, h0[0], w_hh, None, "tanh"),
        "stack": lambda: torch.stack([h0[0]]),
    }
    with torch.no_grad():
        costs = {name: host_us_per_call(fn, calls) for name, fn in pieces.items()}
    print(f"host us/call ({dtype_name} B={batch} H={hidden} T={steps}): "
          + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()), flush=True)


def run_floor(binary):
    if not binary or not os.path.exists(binary):
        return []
    lines = subprocess.run([binary], check=True, capture_output=True, text=True).stdout.splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def run_meta(device):
    """What every record carries about the run."""
    return {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.date.today().isoformat()}


def step_record(impl, cell, dtype_name, batch, hidden, steps, pass_name, us, meta, **extra):
    """One record of the schema above (one layer, I = H)."""
    return dict(impl=impl, cell=cell, dtype=dtype_name, batch=batch, hidden=hidden, input=hidden, steps=steps,
                layers=1, **{"pass": pass_name}, us_per_step=round(us, 4), **extra, **meta)


def write_records(path, records, keep):
    """records into the JSON file at path, after the records already there that keep(record) is true of."""
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            kept = [r for r in json.load(f) if keep(r)]
    with open(path, "w") as f:
        json.dump(kept + records, f, indent=1)


LARGE_HIDDEN = (1536, 2048, 2560, 3072, 4096)
LARGE_BATCH = (1, 2, 4, 8, 16)


def large_layers(args):
    """The Elman cell at H 1536-4096, B 1-16, float32 and bfloat16, forward
    and forward+backward against nn.RNN eager and its forward in a CUDA
    graph, with the cluster tier as the environment leaves it."""
    device = torch.cuda.get_device_properties(0).name
    meta = run_meta(device)
    clusters = os.environ.get("PRNN_DISABLE_CLUSTER_TIER", "") in ("", "0")
    extra = {} if clusters else {"clusters": False}
    steps, records = 256, []
    print(f"clusters {'on' if clusters else 'off'}\n{'dtype':8s} {'B':>3s} {'H':>5s} {'prnn':>7s} {'x eager':>7s}"
          f" {'x graph':>7s} {'prnn fb':>7s} {'x fb':>6s}  tier")
    for dtype_name in ("float32", "bfloat16"):
        for hidden in LARGE_HIDDEN:
            for batch in LARGE_BATCH:
                t, err = bench_one(dtype_name, batch, hidden, steps, args.iters, ("fwd", "fwdbwd"))
                plan = torch_prnn.plan(hidden, batch=batch, steps=steps, dtype=DTYPES[dtype_name], device="cuda")
                records += [step_record(impl, "rnn_tanh", dtype_name, batch, hidden, steps, pss, us, meta, **extra)
                            for (impl, pss), us in t.items()]
                fwd, fb = t[("prnn", "fwd")], t[("prnn", "fwdbwd")]
                print(f"{dtype_name:8s} {batch:3d} {hidden:5d} {fwd:7.2f} {t[('cudnn', 'fwd')] / fwd:7.1f} "
                      f"{t[('cudnn_graph', 'fwd')] / fwd:7.1f} {fb:7.2f} {t[('cudnn', 'fwdbwd')] / fb:6.1f}  "
                      f"{plan['tier']} ({plan['module']}) err={err:.1e}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{device.replace(' ', '_')}.large.json")
    write_records(path, records, lambda r: r.get("clusters", True) != clusters)  # the other setting's stay


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", choices=sorted(CELLS), default="rnn")
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--floor", default="", help="path of the built bench/floor.cu")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="only this dtype (repeatable)")
    ap.add_argument("--batch", action="append", type=int, help="only this batch (repeatable)")
    ap.add_argument("--hidden", action="append", type=int, help="only this hidden size (repeatable)")
    ap.add_argument("--diag", action="store_true", help="only the per-step / per-call breakdown")
    ap.add_argument("--host", metavar="DTYPE", help="only the host time of each piece of a module forward")
    ap.add_argument("--large", action="store_true", help="only the Elman cell's large layers, clusters on and off")
    args = ap.parse_args()
    if args.large:
        large_layers(args)
        return
    if args.host:
        host_costs(args.host)
        return
    if args.diag:
        host_costs()
        diagnose()
        return

    props = torch.cuda.get_device_properties(0)
    device = props.name
    meta = run_meta(device)
    steps = 256
    if args.quick:
        grid = [(d, b, h) for d in DTYPES for b in (1, 4, 16) for h in (512, 1024)]
    elif args.cell != "rnn":
        grid = [(d, b, h) for d in DTYPES for b in (1, 2, 4, 8, 16, 32, 64) for h in (256, 512, 1024)]
    else:
        grid = [(d, b, h) for d in DTYPES for b in (1, 2, 4, 8, 16, 32, 64) for h in (256, 512, 1024, 1152, 2048)]
    grid = [(d, b, h) for d, b, h in grid if (not args.dtype or d in args.dtype)
            and (not args.batch or b in args.batch) and (not args.hidden or h in args.hidden)]
    passes = ("fwd",) if args.no_backward else ("fwd", "fwdbwd")

    floor = run_floor(args.floor)
    records, rows = [], []
    for dtype_name, batch, hidden in grid:
        times, err = bench_one(dtype_name, batch, hidden, steps, args.iters, passes, args.cell)
        tier = torch_prnn.plan(hidden, batch=batch, steps=steps, dtype=DTYPES[dtype_name], device="cuda",
                               **({} if args.cell == "rnn" else {"cell": args.cell}))["tier"]
        records += [step_record(impl, CELLS[args.cell][3], dtype_name, batch, hidden, steps, pss, us, meta)
                    for (impl, pss), us in times.items()]
        rows.append((dtype_name, batch, hidden, tier, times, err))
        print(f"{dtype_name:8s} B={batch:3d} H={hidden:5d} {tier:22s} "
              + " ".join(f"{i}/{p}={v:8.2f}" for (i, p), v in times.items()) + f" err={err:.1e}", flush=True)

    memory = {}
    if "fwdbwd" in passes and args.cell == "rnn":
        for dtype_name in ("float32", "bfloat16"):
            memory[dtype_name] = peak_training_memory(4, 1024, steps, DTYPES[dtype_name])

    os.makedirs(args.out, exist_ok=True)
    slug = device.replace(" ", "_")
    path = os.path.join(args.out, f"{slug}.json")
    cell, shapes = CELLS[args.cell][3], set(grid)  # the records of this run's shapes are replaced; the others stay
    write_records(path, records, lambda r: r.get("cell") != cell or (r["dtype"], r["batch"], r["hidden"]) not in shapes)
    if args.cell == "rnn":
        with open(os.path.join(args.out, f"{slug}.extra.json"), "w") as f:
            json.dump({**meta, "floor": floor, "peak_training_bytes_B4_H1024_T256": memory}, f, indent=1)

    print("\nfloor:", ", ".join(f"{r['what']}(B={r['batch']},H={r['hidden']})={r['us_per_step']:.2f}us" for r in floor))
    for dtype_name, m in memory.items():
        print(f"peak training memory B=4 H=1024 T=256 {dtype_name}: prnn {m['prnn'] / 2**20:.1f} MiB, "
              f"cudnn {m['cudnn'] / 2**20:.1f} MiB")
    print(f"\n{'dtype':8s} {'B':>3s} {'H':>5s} {'prnn':>7s} {'cudnn':>7s} {'graph':>7s} {'x eager':>7s} {'x graph':>7s}"
          f" {'prnn fb':>7s} {'cudnn fb':>8s} {'x fb':>6s}  tier")
    for dtype_name, batch, hidden, tier, t, err in rows:
        fb = t.get(("prnn", "fwdbwd"), float("nan")), t.get(("cudnn", "fwdbwd"), float("nan"))
        print(f"{dtype_name:8s} {batch:3d} {hidden:5d} {t[('prnn', 'fwd')]:7.2f} {t[('cudnn', 'fwd')]:7.2f} "
              f"{t[('cudnn_graph', 'fwd')]:7.2f} {t[('cudnn', 'fwd')] / t[('prnn', 'fwd')]:7.1f} "
              f"{t[('cudnn_graph', 'fwd')] / t[('prnn', 'fwd')]:7.1f} {fb[0]:7.2f} {fb[1]:8.2f} {fb[1] / fb[0]:6.1f}  {tier}")


if __name__ == "__main__":
    main()
