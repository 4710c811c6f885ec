"""GPU time of prnn::layer (T = 256, I = H) at a few batches, with the input
projection fused or not as this process's PRNN_FUSED_PROJECTION says (0
never, 1 wherever a kernel can, unset the planner's rule): run it once per
setting and compare.

    PRNN_FUSED_PROJECTION=1 python3 bench/lab/fused_probe.py [dtype [hidden [batches...]]]
"""
import os
import sys

import torch

import torch_prnn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from bench import DTYPES, median_ms  # noqa: E402


def main():
    dtype_name = sys.argv[1] if len(sys.argv) > 1 else "float32"
    hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    batches = [int(b) for b in sys.argv[3:]] or [1, 2, 4]
    dtype, steps = DTYPES[dtype_name], 256
    setting = os.environ.get("PRNN_FUSED_PROJECTION", "rule")
    for batch in batches:
        torch.manual_seed(0)
        w_ih = torch.randn(hidden, hidden, device="cuda", dtype=dtype) * hidden ** -0.5
        w_hh = torch.randn(hidden, hidden, device="cuda", dtype=dtype) * hidden ** -0.5
        b_ih, b_hh = (torch.randn(hidden, device="cuda", dtype=dtype) for _ in range(2))
        x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
        h0 = torch.randn(batch, hidden, device="cuda", dtype=dtype)
        fused = torch_prnn.plan(hidden, batch, steps, dtype, "cuda", input_size=hidden)["fused_input_projection"]

        def call():
            return torch.ops.prnn.layer(x, w_ih, b_ih, b_hh, h0, w_hh, None, "tanh")

        # against the projection as a GEMM and the recurrence alone (prnn::forward)
        xp = torch.nn.functional.linear(x, w_ih, b_ih + b_hh)
        ref = torch.ops.prnn.forward(xp, h0, w_hh, None, "tanh")[0].double()
        err = ((call()[0].double() - ref).norm() / ref.norm()).item()
        gpu = median_ms(call, 50, before=lambda: torch.cuda._sleep(4_000_000))
        eager = median_ms(call, 50)
        print(f"fused_probe {dtype_name} B={batch} H={hidden} setting={setting} fused={fused}: GPU "
              f"{1000 * gpu / steps:.3f} us/step, eager {1000 * eager / steps:.3f} us/step (rel err vs GEMM + prnn::forward {err:.1e})",
              flush=True)


if __name__ == "__main__":
    main()
