"""Warp-stall samples of one kernel by part of its step, from ncu's source
page (bench/NOTES.md step 86). Profile with the SourceCounters section, then
export the SASS view as CSV and read it here:

    ncu --kernel-name regex:gated_grid_forward --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section SourceCounters -o prof python3 bench/lab/profile_gated.py lstm bfloat16 4
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/lab/sass_stalls.py sass.csv [TOP]

Prints the samples between block barriers (BAR.SYNC), each part's leading
stall reasons, and the TOP instructions by samples with how often each ran,
relative to the most-run instruction (a polling round's, say).
"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    rows = list(csv.reader(open(sys.argv[1], errors="replace")))
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    head = next(i for i, r in enumerate(rows) if "Source" in [c.strip() for c in r])
    names = rows[head]
    body = [r for r in rows[head + 1:] if len(r) == len(names)]
    col = {name: i for i, name in enumerate(names)}
    samples = [number(r[col["Warp Stall Sampling (All Samples)"]]) for r in body]
    runs = [number(r[col["Instructions Executed"]]) for r in body]
    source = [r[col["Source"]].strip() for r in body]
    reasons = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    total = sum(samples) or 1.0
    loop_runs = max(runs) or 1.0

    start = 0
    print(f"{'instructions':>13s} {'samples':>8s}  leading stall reasons")
    for i, text in enumerate(source):
        if "BAR.SYNC" not in text and i != len(source) - 1:
            continue
        part = sum(samples[start:i + 1])
        if part / total >= 0.005:
            by_reason = sorted(((sum(number(r[col[n]]) for r in body[start:i + 1]), n) for n in reasons), reverse=True)
            lead = "  ".join(f"{n[6:]} {100 * v / total:.1f}" for v, n in by_reason[:4])
            print(f"{start:6d}-{i:6d} {100 * part / total:7.1f}%  {lead}")
        start = i + 1

    print(f"\n{'index':>6s} {'samples':>8s} {'runs':>6s}  instruction")
    for i in sorted(sorted(range(len(body)), key=lambda k: -samples[k])[:top]):
        print(f"{i:6d} {100 * samples[i] / total:7.1f}% {runs[i] / loop_runs:6.2f}  {source[i][:90]}")


if __name__ == "__main__":
    main()
