"""The gated grid family's forward (bench/NOTES.md step 53): H 640 and 1024,
and H 256 / 512 with the cluster tier disabled (the path of GPUs without
clusters), eager and replayed in a CUDA graph, against nn.LSTM / nn.GRU
likewise in the same process; T = 256, JSON into the folder named as its argument
(default: the current one).

    python3 bench/lab/gated_grid_bench.py
"""
import os, sys, json
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ["PRNN_TORCH_FALLBACK"] = "0"
import torch, torch_prnn
from bench import models, initial_state, median_ms, graphed, rel_err, DTYPES
T = 256; rows = []
grid = [(c, d, b, h, "0") for c in ("lstm", "gru") for d in ("bfloat16", "float16") for h in (640, 1024) for b in (1, 4, 16)]
grid += [(c, "bfloat16", b, h, "1") for c in ("lstm", "gru") for h in (256, 512) for b in (1, 4, 16)]
for cell, dn, B, H, off in grid:
    if dn == "float16" and B != 4: continue
    os.environ["PRNN_DISABLE_CLUSTER_TIER"] = off
    dtype = DTYPES[dn]
    torch.manual_seed(0)
    ref, ours = models(H, dtype, cell)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype)
    hx = initial_state(cell, B, H, dtype)
    r = dict(cell=cell, dtype=dn, B=B, H=H, clusters=off == "0",
             tier=torch_prnn.plan(H, batch=B, cell=cell, dtype=dtype, device="cuda")["tier"])
    with torch.no_grad():
        r["err"] = rel_err(ours(x, hx)[0], ref(x, hx)[0])
        r["ours"] = 1000 * median_ms(lambda: ours(x, hx), 20) / T
        rp, g = graphed(lambda: ours(x, hx)); r["ours_graph"] = 1000 * median_ms(rp, 20) / T; del g
        r["nn"] = 1000 * median_ms(lambda: ref(x, hx), 20) / T
        rp, g = graphed(lambda: ref(x, hx)); r["graph"] = 1000 * median_ms(rp, 20) / T; del g
    rows.append(r)
    print(f"{cell:4} {dn:8} B={B:2} H={H:4} clusters={'on ' if off == '0' else 'off'} {r['tier'][-10:]:10} ours {r['ours']:5.2f} (graph {r['ours_graph']:5.2f}) "
          f"nn {r['nn']:6.2f} graph {r['graph']:5.2f}  x{r['graph']/r['ours_graph']:4.1f} graph, x{r['nn']/r['ours']:4.1f} eager  err {r['err']:.1e}", flush=True)
os.environ["PRNN_DISABLE_CLUSTER_TIER"] = "0"
json.dump(rows, open(os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "grid_bench.json"), "w"), indent=1)
