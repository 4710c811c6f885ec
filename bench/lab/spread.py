"""How much an eager figure moves between rounds, and how much of it is host time.

    python bench/lab/spread.py [rounds [dtype:batch:hidden ...]]

For bf16/fp16/fp32 at B = 4, H = 1024 (or the shapes given), T = 256, per round (each a median of
CUDA-event timings): the eager module forward, the same calls issued behind a
GPU spin (torch.cuda._sleep) so the GPU never waits for the host (what the
calls cost on the GPU alone), the forward replayed in a CUDA graph, and the
training step (output.sum() backward) eager and behind the spin. The gap
between "eager" and "behind spin" is the host time the GPU waited for.
"""
import os
import sys

import torch

import torch_prnn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from bench import DTYPES, graphed, median_ms  # noqa: E402


def median_ms_behind_spin(fn, iters, spin_cycles=4_000_000):
    """Median GPU time of fn()'s work with the host's issuing hidden: the
    start event is queued behind a ~2 ms spin kernel, long enough for the
    host to issue all of fn() before the GPU reaches it."""
    return median_ms(fn, iters, warmup=1, before=lambda: torch.cuda._sleep(spin_cycles))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    shapes = [(name, 4, 1024) for name in ("bfloat16", "float16", "float32")]
    if len(sys.argv) > 2:
        shapes = [(d, int(b), int(h)) for d, b, h in (arg.split(":") for arg in sys.argv[2:])]
    steps = 256
    for dtype_name, batch, hidden in shapes:
        dtype = DTYPES[dtype_name]
        torch.manual_seed(0)
        model = torch_prnn.PersistentRNN(hidden, hidden, device="cuda", dtype=dtype)
        x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
        h0 = torch.randn(1, batch, hidden, device="cuda", dtype=dtype)
        params = list(model.parameters())

        def train_step():
            torch.autograd.grad(model(x, h0)[0].sum(), params)

        with torch.no_grad():
            replay, graph = graphed(lambda: model(x, h0))
        rows = []
        for _ in range(rounds):
            with torch.no_grad():
                row = [median_ms(lambda: model(x, h0), 30), median_ms_behind_spin(lambda: model(x, h0), 30),
                       median_ms(replay, 30)]
            row += [median_ms(train_step, 15), median_ms_behind_spin(train_step, 15)]
            rows.append([1000 * v / steps for v in row])
        for row in rows:
            print(f"spread {dtype_name:8s} B={batch} H={hidden} us/step: fwd eager {row[0]:5.2f}, behind spin "
                  f"{row[1]:5.2f}, graph {row[2]:5.2f} | fwd+bwd eager {row[3]:5.2f}, behind spin {row[4]:5.2f}",
                  flush=True)
        del graph


if __name__ == "__main__":
    main()
