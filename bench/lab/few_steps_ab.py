"""Where the few-steps kernel (a launch a step, the input projection in it)
should hand over to the persistent kernels: PersistentRNN forwards under
no_grad at small T, µs a call - eager (CUDA events around the call, the
host's time included where the GPU waits for it) and replayed in a CUDA
graph (the GPU's time) - beside nn.RNN in the same process, with the
hand-over off. Run once a build, in alternating processes, the build before
the kernel as `old`:

    PYTHONPATH=/path/to/old python3 bench/lab/few_steps_ab.py old OUTDIR
    PYTHONPATH=$PWD python3 bench/lab/few_steps_ab.py new OUTDIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ["PRNN_TORCH_FALLBACK"] = "0"
import torch  # noqa: E402
from torch import nn  # noqa: E402

import torch_prnn  # noqa: E402
from bench import graphed, median_ms  # noqa: E402

CASES = [(dt, B, H, T) for dt in ("float32", "bfloat16") for H in (256, 1024, 2048) for B in (1, 4, 16)
         for T in (1, 2, 4, 8)]
CASES += [(dt, 4, 1024, 256) for dt in ("float32", "bfloat16")]


def main():
    tag, out = sys.argv[1], sys.argv[2]
    rows = {}
    for dtype_name, batch, hidden, steps in CASES:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        reference = nn.RNN(hidden, hidden, device="cuda", dtype=dtype)
        module = torch_prnn.PersistentRNN.from_rnn(reference)
        x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
        h = torch.randn(1, batch, hidden, device="cuda", dtype=dtype)
        figures = []
        for m in (module, reference):
            def forward(m=m):
                with torch.no_grad():
                    m(x, h)

            replay, graph = graphed(forward)  # noqa: F841 (the graph lives while it is timed)
            figures += [1000 * median_ms(forward, 200), 1000 * median_ms(replay, 200)]
        name = f"{dtype_name} B={batch} H={hidden} T={steps}"
        rows[name] = figures
        print(f"{tag} {name:26} eager {figures[0]:7.1f} graph {figures[1]:7.1f}   "
              f"nn {figures[2]:7.1f} {figures[3]:7.1f}", flush=True)
    with open(os.path.join(out, f"few_steps_{tag}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
