"""Where a 16-bit gated training call's time goes (bench/NOTES.md steps 51,
55): the forward and backward ops alone, the module's forward+backward eager
and replayed in a CUDA graph, with the cluster family on ("cl") and off
("ps", PRNN_DISABLE_CLUSTER_TIER: the grid family then runs H <= 1024, as it
does at H = 1024 with the tier on; each row records the backward's tier);
T = 256, JSON into the folder named as its argument (default: the current one).

    python3 bench/lab/gated_parts.py
"""
import os, sys, json
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ["PRNN_TORCH_FALLBACK"] = "0"
import torch, torch_prnn
from bench import models, initial_state, median_ms, graphed, DTYPES
T = 256
rows = []
for cell in ("lstm", "gru"):
    for dn in ("bfloat16",):
        for B, H in ((1, 256), (4, 256), (4, 512), (16, 512), (4, 1024), (16, 1024)):
            dtype = DTYPES[dn]; G = 4 if cell == "lstm" else 3
            torch.manual_seed(0)
            xp = torch.randn(T, B, G * H, device="cuda", dtype=dtype)
            b_hh = torch.randn(G * H, device="cuda", dtype=dtype) * 0.1
            h0 = torch.randn(B, H, device="cuda", dtype=dtype)
            c0 = torch.randn(B, H, device="cuda", dtype=dtype)
            w = (torch.rand(G * H, H, device="cuda", dtype=dtype) * 2 - 1) * H ** -0.5
            r = dict(cell=cell, dtype=dn, B=B, H=H)
            ref, ours = models(H, dtype, cell)
            x = torch.randn(T, B, H, device="cuda", dtype=dtype)
            hx = initial_state(cell, B, H, dtype)
            params = list(ours.parameters())
            def fb():
                y, _ = ours(x, hx)
                return torch.autograd.grad(y.float().pow(2).sum(), params)
            for tag, env in (("cl", "0"), ("ps", "1")):
                os.environ["PRNN_DISABLE_CLUSTER_TIER"] = env
                r["bwd_tier_" + tag] = torch_prnn.plan(H, batch=B, cell=cell, dtype=dtype, device="cuda",
                                                       backward=True)["tier"]
                if cell == "lstm":
                    fwd = lambda: torch.ops.prnn.lstm(xp, b_hh, h0, c0, w, None, None, True)
                    y, h_n, c_n, saved = fwd()
                    gy, gh, gc = torch.randn_like(y), torch.randn_like(h_n), torch.randn_like(c_n)
                    bwd = lambda: torch.ops.prnn.lstm_backward(gy, gh, gc, h0, c0, y, saved, w, None, None)
                else:
                    fwd = lambda: torch.ops.prnn.gru(xp, b_hh, h0, w, None, True)
                    y, h_n, saved = fwd()
                    gy, gh = torch.randn_like(y), torch.randn_like(h_n)
                    bwd = lambda: torch.ops.prnn.gru_backward(gy, gh, h0, y, saved, w, None)
                r["fwd_op_" + tag] = 1000 * median_ms(fwd, 20) / T
                r["bwd_op_" + tag] = 1000 * median_ms(bwd, 20) / T
                r["fb_" + tag] = 1000 * median_ms(fb, 10) / T
                try:
                    replay, g = graphed(fb)
                    r["fb_graph_" + tag] = 1000 * median_ms(replay, 10) / T
                    del g
                except Exception as e:  # noqa
                    r["fb_graph_" + tag] = float("nan"); print("graph:", repr(e)[:200])
            os.environ["PRNN_DISABLE_CLUSTER_TIER"] = "0"
            with torch.no_grad():
                r["fwd_mod"] = 1000 * median_ms(lambda: ours(x, hx), 20) / T
            rows.append(r)
            print(f"{cell:4} {dn} B={B:2} H={H}: fwd op {r['fwd_op_cl']:.2f} mod {r['fwd_mod']:.2f} | bwd op cl {r['bwd_op_cl']:.2f} ps {r['bwd_op_ps']:.2f} "
                  f"({r['bwd_tier_cl'][11:]} / {r['bwd_tier_ps'][11:]}) "
                  f"| fb eager cl {r['fb_cl']:.2f} ps {r['fb_ps']:.2f} | fb graph cl {r['fb_graph_cl']:.2f} ps {r['fb_graph_ps']:.2f}", flush=True)
json.dump(rows, open(os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "gated_parts.json"), "w"), indent=1)
