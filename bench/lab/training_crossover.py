"""The training crossover of the 16-bit gated cells where their cluster
family runs (bench/NOTES.md step 52): PersistentLSTM / PersistentGRU with
the hand-over off against nn.LSTM / nn.GRU, eager forward+backward, T = 256,
two rounds each; JSON into the folder named
as its argument (default: the current one).

    python3 bench/lab/training_crossover.py
"""
import os, sys, json
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ["PRNN_TORCH_FALLBACK"] = "0"
import torch, torch_prnn
from bench import models, initial_state, median_ms, DTYPES
T = 256; rows = []
for cell in ("lstm", "gru"):
    for dn in ("bfloat16", "float16"):
        for H in (256, 512):
            for B in (16, 32, 56, 64):
                dtype = DTYPES[dn]
                ref, ours = models(H, dtype, cell)
                x = torch.randn(T, B, H, device="cuda", dtype=dtype)
                hx = initial_state(cell, B, H, dtype)
                def fb(m):
                    ps = list(m.parameters())
                    return lambda: torch.autograd.grad(m(x, hx)[0].float().pow(2).sum(), ps)
                r = dict(cell=cell, dtype=dn, B=B, H=H, tier=torch_prnn.plan(H, batch=B, cell=cell, dtype=dtype, device="cuda", backward=True)["tier"])
                a = fb(ours); b = fb(ref)
                r["ours"] = 1000 * median_ms(a, 7) / T; r["nn"] = 1000 * median_ms(b, 7) / T
                r["ours2"] = 1000 * median_ms(a, 7) / T; r["nn2"] = 1000 * median_ms(b, 7) / T
                rows.append(r)
                print(f"{cell:4} {dn:8} H={H:4} B={B:2} {r['tier'][-9:]:9} ours {r['ours']:6.2f} {r['ours2']:6.2f} nn {r['nn']:6.2f} {r['nn2']:6.2f} "
                      f"x{min(r['nn'], r['nn2']) / max(r['ours'], r['ours2']):4.2f}", flush=True)
json.dump(rows, open(os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "cross_fb.json"), "w"), indent=1)
