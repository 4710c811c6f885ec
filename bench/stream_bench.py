"""Per-step latency of torch_prnn.Stream.step against nn.RNN (cuDNN) eager,
nn.RNN replayed in a CUDA graph one step at a time, and PersistentRNN eager
called once per step, in one process on one GPU; writes
bench/results/<device>.stream.json and a plot beside it.

    python bench/stream_bench.py [--quick] [--cell rnn|lstm|gru] [--steps N] [--out DIR] [--progress]
    python bench/stream_bench.py --host      # the host side of step() alone, no GPU needed

Each figure is the distribution (p50, p99) of the wall time of single calls,
host to host, after a warm-up:
  prnn_stream  stream.step(x_t): x_t a CPU tensor in, y_t a CPU tensor out
               (the transfer over the bus is in the figure);
  prnn         PersistentRNN(x_t[None], h) under no_grad, then a sync of the
               current stream (x_t already on the GPU);
  cudnn        nn.RNN(x_t[None], h) likewise;
  cudnn_graph  one step of nn.RNN captured in a CUDA graph (state carried in
               the graph), replay then sync.
The baselines run before a stream opens: device-wide synchronisation would
wait for an open stream's kernel, and so would the first launch of any
kernel while one is open (CUDA's lazy loading): with a stream open, only
CPU tensors go in and out. Each record:
{"impl", "cell", "dtype", "batch", "hidden", "p50_us", "p99_us", "device",
 "torch", "cuda", "date"} (input size = hidden size, one layer).
"""
import argparse
import os
import sys
import time

import torch

import torch_prnn
from bench import run_meta, write_records  # bench/bench.py: this file's folder is on sys.path

START = time.monotonic()
PROGRESS = False
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CELLS = {"rnn": (torch.nn.RNN, "rnn_tanh"), "lstm": (torch.nn.LSTM, "lstm"), "gru": (torch.nn.GRU, "gru")}


def percentiles(times_ns):
    ordered = sorted(times_ns)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3  # noqa: E731
    return at(0.50), at(0.99)


def time_calls(fn, steps, warmup):
    """Wall time of each of `steps` calls of fn() (ns), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    clock = time.perf_counter_ns
    for _ in range(steps):
        start = clock()
        fn()
        times.append(clock() - start)
    return times


def baselines(cell, dtype, batch, hidden, steps, warmup):
    """p50/p99 of the GPU-resident calls (no stream open)."""
    module_cls, _ = CELLS[cell]
    rnn = module_cls(hidden, hidden, device="cuda", dtype=dtype).eval()
    x = torch.randn(1, batch, hidden, device="cuda", dtype=dtype)
    h = torch.zeros(1, batch, hidden, device="cuda", dtype=dtype)
    state = (h, h.clone()) if cell == "lstm" else h
    sync = torch.cuda.current_stream().synchronize
    results = {}
    with torch.no_grad():
        def cudnn():
            rnn(x, state)
            sync()
        results["cudnn"] = time_calls(cudnn, steps, warmup)

        # One step in a graph, the state carried in its static buffers.
        static = tuple(t.clone() for t in (state if cell == "lstm" else (state,)))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                rnn(x, static if cell == "lstm" else static[0])
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _, new = rnn(x, static if cell == "lstm" else static[0])
            for buf, value in zip(static, new if cell == "lstm" else (new,)):
                buf.copy_(value)

        def cudnn_graph():
            graph.replay()
            sync()
        results["cudnn_graph"] = time_calls(cudnn_graph, steps, warmup)

        if cell == "rnn":
            ours = torch_prnn.PersistentRNN.from_rnn(rnn)

            def prnn():
                ours(x, h)
                sync()
            results["prnn"] = time_calls(prnn, steps, warmup)
    torch.cuda.synchronize()
    return rnn, results


def stream_calls(rnn, dtype, batch, hidden, steps, warmup):
    """(step(x) times, step(x, out=) times, relative error of 16 steps against the module).

    Nothing here launches a CUDA kernel or waits for the device while the
    stream is open: under CUDA's lazy loading (the default) the first launch
    of a kernel not yet used in the process waits for the GPU to be idle,
    which it never is while the stream's kernel runs - the reference is on
    the CPU before the stream opens, and only CPU tensors go in and out."""
    xs = [torch.randn(batch, hidden, dtype=dtype) for _ in range(16)]
    with torch.no_grad():
        y_ref, _ = rnn(torch.stack(xs).cuda())
    y_ref = y_ref.cpu().double()  # before the stream opens: .double() on the GPU may be a first launch
    progress("open the stream")
    with torch_prnn.Stream(rnn, batch=batch) as stream:
        progress("16 steps against the module")
        ys = torch.stack([stream.step(x) for x in xs])
        stream.reset()
        x, out = xs[0], torch.empty(batch, hidden, dtype=dtype)
        progress(f"time {steps} steps, twice")
        fresh = time_calls(lambda: stream.step(x), steps, warmup)
        into = time_calls(lambda: stream.step(x, out=out), steps, warmup)
        sms = stream.sms
    progress("closed")
    err = ((ys.double() - y_ref).norm() / y_ref.norm()).item()
    return fresh, into, err, sms


def progress(what):
    """A phase of the run on stderr at once (--progress), so that a run stopped by a time limit says where."""
    if PROGRESS:
        print(f"[stream_bench {time.monotonic() - START:7.2f} s] {what}", file=sys.stderr, flush=True)


class HostOnly(torch_prnn.Stream):
    """A Stream on the CPU without a kernel: whoever holds it answers its
    mailbox (here: the answer is written before each call)."""

    _device_for = staticmethod(lambda weight_device, device: torch.device("cpu"))

    def _launch(self, weights, bias, device, max_sms, start_timeout):
        self.mailbox = self._port.buffers()[0].numpy().view("uint32")
        self.mailbox[32] = 1  # ready
        return [0, 0, 0, 0]

    def answer_next(self):
        """The answer to the STEP about to be posted (prnn.h: the number after the last posted, skipping the one
        its input words carry), in the one answer word a stream without a kernel waits for."""
        posted, x_tag = int(self.mailbox[2]), int(self.mailbox[3])
        seq = (posted + 1) & 0xFFFFFFFF
        self.mailbox[64] = seq + 1 if seq == x_tag else seq


def host_overhead(steps=20000):
    """The host side of Stream.step alone: the Python call, the checks, the
    copies and one look at an answer that is already there (no GPU)."""
    import torch_prnn.stream as stream_module

    print("host side of one step (its answer already there), p50 us:")
    for batch, hidden, dtype in [(1, 1024, torch.float32), (8, 1024, torch.float32), (1, 1024, torch.bfloat16)]:
        stream = HostOnly(torch_prnn.PersistentRNN(hidden, hidden, dtype=dtype), batch=batch)
        x, out = torch.randn(batch, hidden).to(dtype), torch.empty(batch, hidden, dtype=dtype)
        answer, raw, port = stream.answer_next, stream_module._step_raw, stream._port
        forms = {
            "answer alone": answer,
            "_C._stream_step": lambda: (answer(), raw(stream._handle, x._cdata, out._cdata)),
            "step(x, out=)": lambda: (answer(), stream.step(x, out=out)),
            "step(x)": lambda: (answer(), stream.step(x)),
            "ScriptObject method step(x)": lambda: (answer(), port.step(x)),
        }
        p50 = {name: percentiles(time_calls(fn, steps, 1000))[0] for name, fn in forms.items()}
        base = p50.pop("answer alone")
        print(f"  {str(dtype).split('.')[-1]:8s} B={batch} H={hidden}: "
              + ", ".join(f"{name} {v - base:.2f}" for name, v in p50.items()) + f" (answer write {base:.2f})")
        answer()
        stream.close()


def plot(records, path):
    try:
        import matplotlib
    except ImportError:
        print(f"no plot ({path}): matplotlib is not installed")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["dtype"], r["batch"]) for r in records})
    impls = ["prnn_stream", "cudnn_graph", "prnn", "cudnn"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (dtype, batch) in zip(axes[0], panels):
        for impl in impls:
            rows = sorted((r for r in records if r["impl"] == impl and r["dtype"] == dtype and r["batch"] == batch),
                          key=lambda r: r["hidden"])
            if not rows:
                continue
            hs = [r["hidden"] for r in rows]
            line, = ax.plot(hs, [r["p50_us"] for r in rows], marker="o", label=f"{impl} p50")
            ax.plot(hs, [r["p99_us"] for r in rows], linestyle=":", color=line.get_color(), label=f"{impl} p99")
        ax.set_yscale("log")
        ax.set_title(f"{records[0]['cell']} {dtype} B={batch}")
        ax.set_xlabel("hidden size (= input size)")
        ax.set_ylabel("us per step, host to host")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"one timestep a call on an {records[0]['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B = 1, H 256 and 1024, fewer calls")
    ap.add_argument("--cell", choices=sorted(CELLS), default="rnn")
    ap.add_argument("--steps", type=int, default=0, help="timed calls per figure (default 5000, --quick 1000)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--host", action="store_true", help="only the host side of step(), on the CPU")
    ap.add_argument("--progress", action="store_true", help="each phase on stderr as it starts")
    args = ap.parse_args()
    global PROGRESS
    PROGRESS = args.progress
    if args.host:
        host_overhead()
        return

    props = torch.cuda.get_device_properties(0)
    meta = run_meta(props.name)
    steps = args.steps or (1000 if args.quick else 5000)
    warmup = max(100, steps // 10)
    batches, hiddens = ((1,), (256, 1024)) if args.quick else ((1, 8), (256, 640, 1024))
    _, cell_name = CELLS[args.cell]
    records = []
    print(f"{'dtype':8s} {'B':>2s} {'H':>5s} {'sms':>4s} {'err':>8s}  p50/p99 us: "
          f"{'stream':>13s} {'stream out=':>13s} {'cudnn graph':>13s} {'prnn':>13s} {'cudnn':>13s}")
    for dtype_name, dtype in DTYPES.items():
        for batch in batches:
            for hidden in hiddens:
                progress(f"{dtype_name} B={batch} H={hidden}: baselines (no stream open)")
                rnn, times = baselines(args.cell, dtype, batch, hidden, steps, warmup)
                try:
                    fresh, into, err, sms = stream_calls(rnn, dtype, batch, hidden, steps, warmup)
                except NotImplementedError as error:
                    print(f"{dtype_name:8s} {batch:2d} {hidden:5d}: no stream: {error}")
                    fresh = into = None
                if fresh is not None:
                    times["prnn_stream"] = fresh
                stats = {impl: percentiles(t) for impl, t in times.items()}
                for impl, (p50, p99) in stats.items():
                    records.append(dict(impl=impl, cell=cell_name, dtype=dtype_name, batch=batch, hidden=hidden,
                                        p50_us=round(p50, 2), p99_us=round(p99, 2), **meta))
                show = lambda name: "%6.1f/%6.1f" % stats[name] if name in stats else " " * 13  # noqa: E731
                into_s = "%6.1f/%6.1f" % percentiles(into) if into is not None else " " * 13
                print(f"{dtype_name:8s} {batch:2d} {hidden:5d} {sms if fresh else 0:4d} "
                      f"{err if fresh else float('nan'):8.1e}  {'':11s} {show('prnn_stream')} {into_s} "
                      f"{show('cudnn_graph')} {show('prnn')} {show('cudnn')}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    slug = props.name.replace(" ", "_")
    path = os.path.join(args.out, f"{slug}.stream.json")
    write_records(path, records, lambda r: r.get("cell") != cell_name)  # other cells' records stay
    plot(records, os.path.join(args.out, f"{slug}.stream.{cell_name}.png" if args.cell != "rnn" else
                               f"{slug}.stream.png"))
    print(f"wrote {path}")

    # The latency goals at B = 1, H = 1024: step p50 <= 5 us, p99 <= 10 us, >= 3x the CUDA graph; eager <= 20 us.
    def get(impl, dtype_name):
        return next((r for r in records if r["impl"] == impl and r["dtype"] == dtype_name and r["batch"] == 1
                     and r["hidden"] == 1024), None)
    for dtype_name in DTYPES:
        s, g, p = get("prnn_stream", dtype_name), get("cudnn_graph", dtype_name), get("prnn", dtype_name)
        if s and g:
            print(f"{dtype_name} B=1 H=1024: step p50 {s['p50_us']} us (bar 5), p99 {s['p99_us']} us (bar 10), "
                  f"{g['p50_us'] / s['p50_us']:.1f}x the CUDA graph's p50 (bar 3x)"
                  + (f"; PersistentRNN eager p50 {p['p50_us']} us (bar 20)" if p else ""))


if __name__ == "__main__":
    main()
