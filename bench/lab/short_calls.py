"""Where a short call's time goes (bench/NOTES.md step 74): PersistentRNN
against nn.RNN with the same weights, eager, T from 1 to 64, forward under
no_grad and forward+backward (the gradients of <output, a fixed tensor> for
the input and every parameter, as bench/sweep.py times them). Each figure is
a median over 100 calls: the host time to the call's return, the time
between CUDA events around it (what sweep.py records: the host's time and
the GPU's tail), and the GPU time of the same call replayed in a CUDA graph.
Then the floor of a training call on this host: one elementwise op and its
autograd.grad, and the timeline of one call of ours (torch.profiler, CPU
side: each op's start and duration). Hand-over off.

    python3 bench/lab/short_calls.py
"""
import os
import statistics
import sys
import time

os.environ.setdefault("PRNN_TORCH_FALLBACK", "0")
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import torch_prnn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench import graphed  # noqa: E402

CASES = (("float16", 32, 256, False, (1, 2, 4, 8, 16, 32, 64)),
         ("float32", 16, 1024, False, (1, 2, 4, 8, 16, 64)),
         ("float32", 16, 1024, True, (1, 4, 8, 16, 64)))


def calls(dtype, batch, hidden, steps, train):
    """{impl: fn} of one eager call each, ours and nn's."""
    torch.manual_seed(0)
    ref = torch.nn.RNN(hidden, hidden, device="cuda", dtype=dtype)
    ours = torch_prnn.PersistentRNN.from_rnn(ref)
    x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype, requires_grad=train)
    grad_y = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)

    def call(module):
        if not train:
            with torch.no_grad():
                return module(x)[0]
        return torch.autograd.grad(module(x)[0], [x, *module.parameters()], grad_y)
    return {"prnn": lambda: call(ours), "nn": lambda: call(ref)}


def host_and_event_us(fn, n=100):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    host, event = [], []
    for _ in range(n):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        stop.record()
        stop.synchronize()
        host.append((t1 - t0) * 1e6)
        event.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(host), statistics.median(event)


def graph_us(fn, n=50):
    replay, graph = graphed(fn)
    for _ in range(5):
        replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        replay()
    stop.record()
    stop.synchronize()
    del graph
    return start.elapsed_time(stop) * 1e3 / n


def training_floor(batch=16, hidden=1024, steps=8):
    """host and event µs of y = x * w and its autograd.grad for x and w."""
    x = torch.randn(steps, batch, hidden, device="cuda", requires_grad=True)
    w = torch.randn(hidden, device="cuda", requires_grad=True)
    grad_y = torch.randn(steps, batch, hidden, device="cuda")
    return host_and_event_us(lambda: torch.autograd.grad(x * w, [x, w], grad_y))


def timeline(dtype, batch, hidden, steps, train):
    """The CPU-side events of the second of three calls of ours, in order."""
    fn = calls(dtype, batch, hidden, steps, train)["prnn"]
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CPU"), key=lambda e: e.time_range.start)
    marks = [e.time_range.start for e in events if e.name == "prnn::layers"]
    lo, hi = marks[1], marks[2]
    print(f"\ntimeline: {hi - lo:.0f} us from one call's prnn::layers to the next's (profiled)")
    for e in events:
        if lo <= e.time_range.start < hi:
            print(f"{e.time_range.start - lo:8.1f} {e.time_range.elapsed_us():7.1f}  {e.name[:70]}")


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us a call")
    print(f"{'case':36s} {'impl':5s} {'host':>7s} {'event':>7s} {'graph':>7s}")
    for dtype_name, batch, hidden, train, all_steps in CASES:
        for steps in all_steps:
            for impl, fn in calls(getattr(torch, dtype_name), batch, hidden, steps, train).items():
                host, event = host_and_event_us(fn)
                graph = float("nan") if train else graph_us(fn)
                label = f"{dtype_name} B={batch} H={hidden} T={steps} {'fwdbwd' if train else 'fwd'}"
                print(f"{label:36s} {impl:5s} {host:7.1f} {event:7.1f} {graph:7.1f}", flush=True)
    host, event = training_floor()
    print(f"{'floor: x * w and its grad, T=8':36s} {'-':5s} {host:7.1f} {event:7.1f}")
    timeline(torch.float32, 16, 1024, 8, True)


if __name__ == "__main__":
    main()
