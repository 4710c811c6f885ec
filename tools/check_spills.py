#!/usr/bin/env python3
"""Compile every CUDA file of the kernels with `ptxas -v` and fail on local memory.

Persistent kernels keep W_hh in registers for the whole sequence; a spill, or an
array indexed at run time (a stack frame without spills), turns every step's
reads into local-memory traffic, so both are build failures.
Prints one row per function and architecture; exits 1 on any spill store or
load, any stack frame, or any nvcc failure.
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FLAGS = ("-c -std=c++17 -O3 -Xptxas -v "
                 "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90")

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
PROPERTIES = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGISTERS = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")


def compile_one(nvcc, flags, include, source, outdir):
    """Returns (source, returncode, nvcc's stdout + stderr)."""
    obj = os.path.join(outdir, os.path.basename(source) + ".o")
    cmd = [nvcc, *flags, "-I", include, "-o", obj, source]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return source, proc.returncode, proc.stdout


def parse(output):
    """ptxas -v output -> list of dicts (name, arch, regs, smem, stack, spill_st, spill_ld).

    Non-inlined device functions get properties but no 'Compiling entry' line;
    they are attributed to the architecture of the last entry function seen.
    """
    rows, arch, row = [], "?", None
    for line in output.splitlines():
        if m := ENTRY.search(line):
            arch = m.group(2)
        elif m := PROPERTIES.search(line):
            row = {"name": m.group(1), "arch": arch, "regs": "-", "smem": 0,
                   "stack": 0, "spill_st": 0, "spill_ld": 0}
            rows.append(row)
        elif row is not None and (m := FRAME.search(line)):
            row["stack"], row["spill_st"], row["spill_ld"] = map(int, m.groups())
        elif row is not None and (m := REGISTERS.search(line)):
            row["regs"] = int(m.group(1))
            if s := SMEM.search(line):
                row["smem"] = int(s.group(1))
    return rows


def demangle(names):
    """Demangled names via c++filt when it is installed, else the names as they are."""
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return names
    out = subprocess.run([cxxfilt], input="\n".join(names), stdout=subprocess.PIPE,
                         text=True).stdout.splitlines()
    return out if len(out) == len(names) else names


def shorten(name, width=60):
    """Drops a template's 'void ' and the parameter list; elides the middle of long names."""
    name = name.removeprefix("void ")
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i] or name
                break
    return name if len(name) <= width else name[:width // 2 - 2] + "..." + name[-(width // 2 - 1):]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(REPO, "csrc", "kernels"),
                    help="directory of .cu files (also passed as -I)")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    ap.add_argument("--flags", default=os.environ.get("NVCC_FLAGS", DEFAULT_FLAGS),
                    help="nvcc flags (default: %(default)s)")
    ap.add_argument("--require-nvcc", action="store_true",
                    help="fail instead of skipping when nvcc is not found")
    args = ap.parse_args()

    sources = sorted(os.path.join(args.dir, f) for f in os.listdir(args.dir) if f.endswith(".cu"))
    if not sources:
        print(f"check_spills: no .cu files in {args.dir}; nothing to check")
        return 0
    nvcc = shutil.which(args.nvcc)
    if nvcc is None:
        print(f"check_spills: {args.nvcc} not found; "
              + ("failing (--require-nvcc)" if args.require_nvcc else "skipping"))
        return 1 if args.require_nvcc else 0

    flags = shlex.split(args.flags)
    failed, rows = [], []
    with tempfile.TemporaryDirectory() as outdir, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        jobs = [pool.submit(compile_one, nvcc, flags, args.dir, s, outdir) for s in sources]
        for job in jobs:
            source, rc, output = job.result()
            if rc != 0:
                failed.append(source)
                print(f"check_spills: nvcc failed on {source} (exit {rc}):\n{output}")
            for row in parse(output):
                row["file"] = os.path.basename(source)
                rows.append(row)

    for row, pretty in zip(rows, demangle([r["name"] for r in rows])):
        row["name"] = shorten(pretty)
    width = max([len(r["name"]) for r in rows] + [6])
    print(f"{'function':<{width}}  {'file':<20} {'arch':<6} {'regs':>4} {'smem':>6} "
          f"{'stack':>6} {'spill st':>8} {'spill ld':>8}")
    for r in rows:
        local = r["stack"] or r["spill_st"] or r["spill_ld"]
        print(f"{r['name']:<{width}}  {r['file']:<20} {r['arch']:<6} {r['regs']:>4} "
              f"{r['smem']:>6} {r['stack']:>6} {r['spill_st']:>8} {r['spill_ld']:>8}"
              + ("  LOCAL MEMORY" if local else ""))

    spills = [r for r in rows if r["stack"] or r["spill_st"] or r["spill_ld"]]
    print(f"check_spills: {len(sources)} file(s), {len(rows)} function(s), "
          f"{len(spills)} using local memory, {len(failed)} nvcc failure(s)")
    return 1 if spills or failed else 0


if __name__ == "__main__":
    sys.exit(main())
