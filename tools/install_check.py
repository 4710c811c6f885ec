#!/usr/bin/env python3
"""Installs torch_prnn as users do and runs it from outside the source tree.

1. `pip wheel --no-build-isolation .`, the wheel installed into a temporary
   folder with `pip install --target`; then, from /, with only that folder on
   PYTHONPATH: import, check the files the wheel must hold, run a PersistentRNN
   against nn.RNN.
2. `pip install --no-build-isolation -e .` into a temporary venv that sees
   this Python's packages (torch); the same run from /. Skipped for a build
   with CUDA kernels: an editable build always compiles from scratch in a
   fresh folder, minutes of nvcc.

Everything temporary is removed; any failure exits non-zero with pip's or
Python's output. The wheel build reuses build/ (ninja recompiles only what
changed since `make build`); the editable install writes _C into the source
tree, as `make build` does.
"""
import os
import runpy
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run from /, so that only the installed copy can be imported.
PROBE = r"""
import importlib.metadata, importlib.resources, os, sys
import torch, torch_prnn
from torch_prnn import _build_info

where = os.path.dirname(os.path.realpath(torch_prnn.__file__))
assert where.startswith(sys.argv[1]), f"imported {where}, expected under {sys.argv[1]}"
assert importlib.metadata.version("torch_prnn") == torch_prnn.__version__
assert importlib.resources.files("torch_prnn").joinpath("sonnets.txt").is_file(), "the demo's text is missing"
assert _build_info.TORCH_VERSION == torch.__version__, (_build_info.TORCH_VERSION, torch.__version__)

ours = torch_prnn.PersistentRNN(3, 5, num_layers=2, dtype=torch.float64)
ref = torch.nn.RNN(3, 5, num_layers=2, dtype=torch.float64)
ref.load_state_dict(ours.state_dict())
x = torch.randn(4, 2, 3, dtype=torch.float64)
torch.testing.assert_close(ours(x), ref(x))
print(f"OK: torch_prnn {torch_prnn.__version__} from {where}, built against torch {_build_info.TORCH_VERSION}")
"""


def run(what, cmd, **kwargs):
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    if proc.returncode != 0:
        sys.exit(f"install-check: {what} failed (exit {proc.returncode}):\n$ {' '.join(cmd)}\n{proc.stdout}")
    print(f"install-check: {what} ({time.monotonic() - t0:.0f} s)")
    return proc.stdout


def probe(what, python, prefix, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = run(what, [python, "-c", PROBE, prefix], cwd="/", env=env)
    print("  " + out.strip().splitlines()[-1])


def main():
    os.environ["PIP_ROOT_USER_ACTION"] = "ignore"  # pip's warning when run as root
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="prnn-install-") as tmp:
        wheels, target = os.path.join(tmp, "wheels"), os.path.join(tmp, "site")
        run("pip wheel --no-build-isolation .",
            [*pip, "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", wheels, REPO])
        (wheel,) = os.listdir(wheels)
        run(f"pip install --target {wheel}",
            [*pip, "install", "-q", "--no-deps", "--target", target, os.path.join(wheels, wheel)])
        probe("import from / and run", sys.executable, os.path.realpath(target), pythonpath=target)

        if runpy.run_path(os.path.join(target, "torch_prnn", "_build_info.py"))["CUDA_VERSION"]:
            print("install-check: editable install skipped (a CUDA build)")
            return
        venv = os.path.join(tmp, "venv")
        run("venv", [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv])
        python = os.path.join(venv, "bin", "python")
        # This Python's pip, seen through --system-site-packages, installs into the venv.
        run("pip install --no-build-isolation -e .",
            [python, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", REPO])
        probe("editable: import from / and run", python, os.path.realpath(os.path.join(REPO, "torch_prnn")))


if __name__ == "__main__":
    main()
