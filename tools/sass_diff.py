#!/usr/bin/env python3
"""Compare every kernel's SASS between a base commit and the working tree.

Builds csrc/kernels/*.cu of both with setup.py's nvcc flags for the CUDA build,
dumps the SASS with cuobjdump and matches the functions by (architecture,
name), whichever file they are in: a kernel may move between files, its code
may not change. Prints one row per function; exits 1 on any difference.

    python3 tools/sass_diff.py [--base COMMIT]   (default: where HEAD left main)
                               [--rename REGEX=REPLACEMENT ...]

--rename matches by demangled name (c++filt), the working tree's names
rewritten first: for a change that renames a kernel or gives it a template
argument, e.g. --rename 'prnn::ElmanCell, =' for kernels newly templated on
the cell. A kernel's SASS may not change.

cuobjdump: on PATH, or from `pip install nvidia-cuda-cuobjdump`.
"""
import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# setup.py's nvcc flags, as torch.utils.cpp_extension expands them for
# TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0+PTX"; torch's own -D and -I flags
# are left out: the kernels include no torch header.
FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
         "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "--compiler-options", "-fPIC",
         "-O3", "-lineinfo", "-std=c++17", "--threads", "4", "-DWITH_CUDA",
         "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_86,code=sm_86",
         "-gencode=arch=compute_89,code=sm_89", "-gencode=arch=compute_90,code=compute_90",
         "-gencode=arch=compute_90,code=sm_90"]
ARCH = re.compile(r"code for (sm_\d+)|^Fatbin")  # a function's SASS ends at either
FUNCTION = re.compile(r"^\s*Function : (\S+)")
# Anonymous namespaces are mangled with hashes, which differ between the
# base's build of a file and the working tree's: _GLOBAL__N__9a3e38b3_8_gated_cu_687fd075.
ANONYMOUS = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}(?=\d)|_GLOBAL__N__[0-9a-f_]+")


def cuobjdump():
    """cuobjdump on PATH, else the one the nvidia-cuda-cuobjdump wheel installs."""
    if found := shutil.which("cuobjdump"):
        return found
    try:
        import nvidia
    except ImportError:
        sys.exit("sass_diff: cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    for root in nvidia.__path__:
        for found in glob.glob(os.path.join(root, "*", "bin", "cuobjdump")):
            return found
    sys.exit("sass_diff: cuobjdump not found (pip install nvidia-cuda-cuobjdump)")


def sass_of(kernels_dir, source, outdir):
    """{(arch, function): [SASS lines]} of one .cu file."""
    obj = os.path.join(outdir, os.path.basename(source) + ".o")
    nvcc = subprocess.run(["nvcc", *FLAGS, "-I", kernels_dir, "-c", source, "-o", obj], capture_output=True, text=True)
    if nvcc.returncode != 0:
        sys.exit(f"sass_diff: nvcc failed on {source}:\n{nvcc.stderr}")
    tool = cuobjdump()  # it runs nvdisasm, installed beside it
    env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
    dump = subprocess.run([tool, "-sass", obj], check=True, capture_output=True, text=True, env=env).stdout
    functions, arch, name = {}, "?", None
    for line in dump.splitlines():
        if m := ARCH.search(line):
            arch, name = m.group(1) or arch, None
        elif m := FUNCTION.match(line):
            name = (arch, ANONYMOUS.sub("_GLOBAL__N_", m.group(1)))
            functions[name] = []
        elif name is not None and line.strip():
            functions[name].append(ANONYMOUS.sub("_GLOBAL__N_", line.strip()))
    return functions


def demangled(names):
    """{mangled: demangled} by c++filt."""
    names = list(names)
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def renamed(functions, renames):
    """functions with keys (arch, demangled name), each rename applied in turn."""
    readable = demangled({name for _, name in functions})
    out = {}
    for (arch, name), value in functions.items():
        name = readable[name]
        for pattern, replacement in renames:
            name = re.sub(pattern, replacement, name)
        out[(arch, name)] = value
    return out


def build(kernels_dir, pool):
    """{(arch, function): (file, SASS)} of every .cu file in kernels_dir."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        sources = sorted(glob.glob(os.path.join(kernels_dir, "*.cu")))
        for source, functions in zip(sources, pool.map(lambda s: sass_of(kernels_dir, s, tmp), sources)):
            for key, sass in functions.items():
                if key in out:
                    sys.exit(f"sass_diff: {key} in both {out[key][0]} and {os.path.basename(source)}")
                out[key] = (os.path.basename(source), sass)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="commit to compare against (default: git merge-base main HEAD)")
    ap.add_argument("--rename", action="append", default=[], metavar="REGEX=REPLACEMENT",
                    help="rewrite the working tree's demangled names before matching (repeatable)")
    args = ap.parse_args()
    renames = []
    for rule in args.rename:
        pattern, sep, replacement = rule.partition("=")
        if not sep or not pattern:
            ap.error(f"--rename takes REGEX=REPLACEMENT, got {rule!r}")
        renames.append((pattern, replacement))
    if args.base is None:
        args.base = subprocess.run(["git", "-C", REPO, "merge-base", "main", "HEAD"], check=True,
                                   capture_output=True, text=True).stdout.strip()[:12]
    with tempfile.TemporaryDirectory() as base, concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        archive = subprocess.run(["git", "-C", REPO, "archive", args.base, "csrc/kernels"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        before = build(os.path.join(base, "csrc", "kernels"), pool)
        after = build(os.path.join(REPO, "csrc", "kernels"), pool)
    if renames:
        before, after = renamed(before, []), renamed(after, renames)

    differ = 0
    for key in sorted(set(before) | set(after), key=lambda k: (k[1], k[0])):
        arch, name = key
        if key not in before or key not in after:
            verdict = "only in " + ("the working tree" if key in after else args.base)
        elif before[key][1] != after[key][1]:
            verdict = "DIFFERENT"
        else:
            verdict = "identical"
        differ += verdict != "identical"
        files = " -> ".join(dict.fromkeys(v[0] for v in (before.get(key), after.get(key)) if v))  # moved: old -> new
        print(f"{verdict:<22} {arch:<6} {files:<34} {name}")
    print(f"sass_diff: {len(set(before) | set(after))} function(s) compared, {differ} not identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
