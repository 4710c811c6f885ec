"""Two builds side by side (bench/NOTES.md step 63): module calls of the
torch_prnn on PYTHONPATH, µs a step at T = 256 (AB_STEPS sets T) - eager forward under no_grad,
the same forward replayed in a CUDA graph, eager forward+backward - with the
hand-over off. Timed with this checkout's bench.py, so an old checkout's
build can run it; run it once a build, in alternating processes:

    PYTHONPATH=/path/to/old python3 bench/lab/ab_builds.py old OUTDIR
    PYTHONPATH=$PWD python3 bench/lab/ab_builds.py new OUTDIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ["PRNN_TORCH_FALLBACK"] = "0"
import torch  # noqa: E402

import torch_prnn  # noqa: E402
from bench import graphed, median_ms  # noqa: E402

T = int(os.environ.get("AB_STEPS", 256))
CASES = [("rnn", dt, B, H) for dt in ("float32", "bfloat16")
         for (B, H) in ((1, 1024), (4, 1024), (16, 1024), (4, 512), (4, 2048), (64, 256))]
CASES += [(cell, dt, 4, 1024) for cell in ("lstm", "gru") for dt in ("float32", "bfloat16")]
CASES += [(cell, "bfloat16", 4, 512) for cell in ("lstm", "gru")]
# AB_CASES="cell:dtype:batch:hidden ..." runs those instead
if os.environ.get("AB_CASES"):
    CASES = [(c, d, int(b), int(h)) for c, d, b, h in (case.split(":") for case in os.environ["AB_CASES"].split())]
MODULES = {"rnn": "PersistentRNN", "lstm": "PersistentLSTM", "gru": "PersistentGRU"}


def main():
    tag, out = sys.argv[1], sys.argv[2]
    rows = {}
    for cell, dtype_name, batch, hidden in CASES:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        module = getattr(torch_prnn, MODULES[cell])(hidden, hidden, device="cuda", dtype=dtype)
        x = torch.randn(T, batch, hidden, device="cuda", dtype=dtype)
        x_grad = x.clone().requires_grad_()
        grad_y = torch.randn(T, batch, hidden, device="cuda", dtype=dtype)

        def forward():
            with torch.no_grad():
                module(x)

        def training():
            torch.autograd.backward(module(x_grad)[0], grad_y)

        replay, graph = graphed(forward)  # noqa: F841 (the graph lives while it is timed)
        us = [1000 * median_ms(fn, n) / T for fn, n in ((forward, 30), (replay, 30), (training, 15))]
        name = f"{cell} {dtype_name} B={batch} H={hidden} T={T}"
        rows[name] = us
        print(f"{tag} {name:34} fwd {us[0]:6.2f} graph {us[1]:6.2f} f+b {us[2]:6.2f}", flush=True)
    with open(os.path.join(out, f"ab_{tag}_T{T}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
