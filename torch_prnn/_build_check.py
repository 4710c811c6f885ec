"""Refuses to load _C under a torch other than the one it was built against.

torch's C++ ABI changes between minor releases, so a mismatched _C fails with
an undefined symbol or crashes; the record setup.py writes beside _C
(_build_info.py) is read first, and a mismatch becomes one clear ImportError.
What must match: torch's major.minor (patch releases keep the ABI), and for a
build with CUDA kernels the CUDA major version (the runtime library's soname).
A build without CUDA links only torch's CPU libraries and runs on any variant
of its torch (+cpu or +cuXY); its CUDA entry points say they were not built.
"""

import re

import torch

FIX = (
    "Rebuild torch_prnn against the torch that runs it: from its source, "
    "`pip install --no-build-isolation --force-reinstall --no-deps .` "
    "(or `python setup.py build_ext --inplace` in a checkout); or install the torch it was built against."
)


def _major_minor(version):
    return re.match(r"(\d+)\.(\d+)", version).groups()


def mismatch(built_torch, built_cuda, torch_version, torch_cuda):
    """None if a _C built against (built_torch, built_cuda) loads under
    (torch_version, torch_cuda); otherwise the error message."""
    same_torch = _major_minor(built_torch) == _major_minor(torch_version)
    same_cuda = built_cuda is None or (torch_cuda is not None and built_cuda.split(".")[0] == torch_cuda.split(".")[0])
    if same_torch and same_cuda:
        return None
    return (
        f"torch_prnn was built against torch {built_torch} "
        f"{f'with CUDA {built_cuda}' if built_cuda else 'without CUDA kernels'}, "
        f"but this is torch {torch_version} {f'with CUDA {torch_cuda}' if torch_cuda else 'without CUDA'}. {FIX}"
    )


def check():
    """Raises ImportError unless this _C's record matches the running torch."""
    try:
        from . import _build_info
    except ImportError:
        raise ImportError(
            "torch_prnn's extension is not built (no torch_prnn/_build_info.py beside _C): "
            "`pip install --no-build-isolation .` from its source, or `python setup.py build_ext --inplace` in a checkout."
        ) from None
    message = mismatch(_build_info.TORCH_VERSION, _build_info.CUDA_VERSION, torch.__version__, torch.version.cuda)
    if message:
        raise ImportError(message)
