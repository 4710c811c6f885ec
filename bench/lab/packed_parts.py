"""Where a packed Elman forward's extra time goes (bench/NOTES.md step 61:
packed 1.25x the padded batch at float32 B = 16 H = 1024 T = 256): the
module's forward under no_grad on the padded batch and on the same batch
packed (lengths from the sweep's seed), each timed three ways - CUDA events
around the call (what bench/sweep.py reports), the host time to the call's
return, and the GPU time of its kernels alone (torch.profiler, summed per
call) - with the kernels of the packed call listed. Hand-over off.

    python3 bench/lab/packed_parts.py [--dtype float32|bfloat16] [--batch 16] [--hidden 1024] [--steps 256]
"""
import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ["PRNN_TORCH_FALLBACK"] = "0"
import torch  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import torch_prnn  # noqa: E402
from bench import DTYPES, median_ms  # noqa: E402


def host_us(fn, calls=50):
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e3)
    return sorted(times)[len(times) // 2]


def kernels_us(fn, calls=20):
    """{kernel name: GPU µs a call} and their sum."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_kernel = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name[:60]] += event.device_time_total / calls
    return per_kernel, sum(per_kernel.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=256)
    args = ap.parse_args()
    dtype, steps = DTYPES[args.dtype], args.steps
    torch.manual_seed(0)
    module = torch_prnn.PersistentRNN(args.hidden, args.hidden, device="cuda", dtype=dtype)
    lengths = torch.randint(steps // 4, steps + 1, (args.batch,), generator=torch.Generator().manual_seed(0))
    x = torch.randn(steps, args.batch, args.hidden, device="cuda", dtype=dtype)
    x = x * (torch.arange(steps).unsqueeze(1) < lengths).to(x.device).unsqueeze(2)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    print(f"PersistentRNN {args.dtype} B={args.batch} H={args.hidden} T={steps}, mean length "
          f"{lengths.float().mean():.1f}; µs a call")
    print(f"{'input':8} {'events':>9} {'host':>9} {'kernels':>9}")
    for name, inp in (("padded", x), ("packed", packed)):
        def call():
            with torch.no_grad():
                module(inp)

        per_kernel, gpu = kernels_us(call)
        print(f"{name:8} {1000 * median_ms(call, 30):9.1f} {host_us(call):9.1f} {gpu:9.1f}")
        for kernel, us in per_kernel.most_common(8):
            print(f"    {us:9.1f}  {kernel}")


if __name__ == "__main__":
    main()
