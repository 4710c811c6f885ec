"""Plot and tabulate one cell's records of bench/results/<device>.json:

    python bench/plot.py [bench/results/NVIDIA_H200.json] [--cell rnn_tanh|lstm|gru]

Writes <device>.png (the Elman cell, the default) or <device>.<cell>.png
beside the JSON (us/step against batch, a panel per dtype and hidden size, a
line per impl and pass) and prints the full markdown table (bench/NOTES.md
keeps the committed run's).
"""
import argparse
import json
import os
from collections import defaultdict

STYLE = {("prnn", "fwd"): ("C0", "-"), ("cudnn", "fwd"): ("C3", "-"), ("cudnn_graph", "fwd"): ("C2", "-"),
         ("prnn", "fwdbwd"): ("C0", ":"), ("cudnn", "fwdbwd"): ("C3", ":")}


def load(path, cell):
    """The records of one cell (the file holds every cell's) and their table."""
    table = defaultdict(dict)  # (dtype, hidden) -> {(impl, pass): {batch: us}}
    records = [r for r in json.load(open(path)) if r.get("cell") == cell]
    if not records:
        raise SystemExit(f"{path} has no records of cell {cell!r}")
    for r in records:
        table[(r["dtype"], r["hidden"])].setdefault((r["impl"], r["pass"]), {})[r["batch"]] = r["us_per_step"]
    return records, table


def plot(path, table, cell):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dtypes = sorted({d for d, _ in table}, key=["float32", "bfloat16", "float16"].index)
    hiddens = sorted({h for _, h in table})
    fig, axes = plt.subplots(len(dtypes), len(hiddens), figsize=(3.2 * len(hiddens), 2.8 * len(dtypes)),
                             sharex=True, squeeze=False)
    for i, d in enumerate(dtypes):
        for j, h in enumerate(hiddens):
            ax = axes[i][j]
            for key, series in sorted(table[(d, h)].items()):
                color, ls = STYLE.get(key, ("k", "--"))
                b = sorted(series)
                ax.plot(b, [series[x] for x in b], color=color, ls=ls, marker=".", label=f"{key[0]} {key[1]}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{d} H={h}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("us / step")
            if i == len(dtypes) - 1:
                ax.set_xlabel("batch")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(os.path.basename(path).replace(".json", "") + f" {cell}: T=256, one layer, input = hidden")
    fig.tight_layout()
    out = path.replace(".json", ".png" if cell == "rnn_tanh" else f".{cell}.png")
    fig.savefig(out, dpi=80)
    return out


def markdown(table, batches=(1, 2, 4, 8, 16)):
    lines = ["| dtype | H | B | prnn fwd | cuDNN eager | cuDNN graph | x eager | x graph | prnn fwd+bwd | cuDNN fwd+bwd | x |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (d, h), s in sorted(table.items(), key=lambda kv: (["float32", "bfloat16", "float16"].index(kv[0][0]), kv[0][1])):
        if h not in (512, 1024, 1152, 2048):
            continue
        for b in batches:
            if b not in s.get(("prnn", "fwd"), {}):
                continue
            p, c, g = s[("prnn", "fwd")][b], s[("cudnn", "fwd")][b], s[("cudnn_graph", "fwd")][b]
            pb, cb = s.get(("prnn", "fwdbwd"), {}).get(b), s.get(("cudnn", "fwdbwd"), {}).get(b)
            fb = f"{pb:.2f} | {cb:.2f} | {cb / pb:.1f}" if pb and cb else "- | - | -"  # a run without backward
            lines.append(f"| {d} | {h} | {b} | {p:.2f} | {c:.2f} | {g:.2f} | {c / p:.1f} | {g / p:.1f} | {fb} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", default=os.path.join(os.path.dirname(__file__), "results", "NVIDIA_H200.json"))
    ap.add_argument("--cell", default="rnn_tanh", choices=("rnn_tanh", "lstm", "gru"))
    args = ap.parse_args()
    path = args.path
    records, table = load(path, args.cell)
    print(f"wrote {plot(path, table, args.cell)}")
    r, dates = records[0], sorted({r["date"] for r in records})
    when = " to ".join(dict.fromkeys((dates[0], dates[-1])))  # one date, or the first and the last
    print(f"\n{r['device']}, torch {r['torch']}, CUDA {r['cuda']}, {when}; us per step, median of CUDA-event timings\n")
    print(markdown(table))
