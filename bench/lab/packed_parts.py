"""Where a packed Elman forward's extra time goes (bench/NOTES.md step 61:
packed 1.25x the padded batch at float32 B = 16 H = 1024 T = 256): the
module's forward under no_grad on the padded batch and on the same batch
packed (lengths from the sweep's seed), each timed three ways - CUDA events
around the call (what bench/sweep.py reports), the host time to the call's
return, and the GPU time of its kernels alone (torch.profiler, summed per
call) - with the kernels of the packed call listed. Hand-over off. With
--backward the call is a training step: the forward and the gradients of
<output, a fixed random tensor> for the input and the parameters.

    python3 bench/lab/packed_parts.py [--dtype float32|bfloat16] [--batch 16] [--hidden 1024] [--steps 256]
                                      [--backward]
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
    """{kernel name: GPU µs a call}, their sum, and {op: calls a call} of the
    host's ATen and autograd ops (what a call's host time is made of)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_kernel, host_ops = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name[:60]] += event.device_time_total / calls
        elif event.name.startswith(("aten::", "prnn::", "cuda")) or "Backward" in event.name:
            host_ops[event.name[:40]] += 1 / calls
    return per_kernel, sum(per_kernel.values()), host_ops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--backward", action="store_true", help="time forward + backward")
    args = ap.parse_args()
    dtype, steps = DTYPES[args.dtype], args.steps
    torch.manual_seed(0)
    module = torch_prnn.PersistentRNN(args.hidden, args.hidden, device="cuda", dtype=dtype)
    lengths = torch.randint(steps // 4, steps + 1, (args.batch,), generator=torch.Generator().manual_seed(0))
    x = torch.randn(steps, args.batch, args.hidden, device="cuda", dtype=dtype)
    x = x * (torch.arange(steps).unsqueeze(1) < lengths).to(x.device).unsqueeze(2)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    x.requires_grad_(args.backward)
    packed.data.requires_grad_(args.backward)
    grad_y = torch.randn_like(x)
    print(f"PersistentRNN {args.dtype} B={args.batch} H={args.hidden} T={steps}, mean length "
          f"{lengths.float().mean():.1f}, {'forward + backward' if args.backward else 'forward'}; µs a call")
    print(f"{'input':8} {'events':>9} {'host':>9} {'kernels':>9}")
    for name, inp in (("padded", x), ("packed", packed)):
        leaf = x if name == "padded" else packed.data
        grad = grad_y if name == "padded" else grad_y.flatten(0, 1)[:len(packed.data)]

        def call():
            if args.backward:
                out = module(inp)[0]
                out = out if name == "padded" else out.data
                torch.autograd.grad(out, [leaf, *module.parameters()], grad)
                return
            with torch.no_grad():
                module(inp)

        per_kernel, gpu, host_ops = kernels_us(call)
        print(f"{name:8} {1000 * median_ms(call, 30):9.1f} {host_us(call):9.1f} {gpu:9.1f}")
        for kernel, us in per_kernel.most_common(10):
            print(f"    {us:9.1f}  {kernel}")
        print("    host ops a call: " + ", ".join(f"{op} {n:.0f}" for op, n in host_ops.most_common(40)))


if __name__ == "__main__":
    main()
