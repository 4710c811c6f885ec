"""The record of the torch _C was built against, and the import's refusal of
another torch (torch_prnn/_build_check.py)."""

import pytest
import torch

from conftest import run_python
from torch_prnn import _build_check, _build_info


def test_record_is_the_running_torch():
    # `make build` (setup.py build_ext --inplace) wrote it beside the _C these tests load.
    assert _build_info.TORCH_VERSION == torch.__version__
    assert _build_info.CUDA_VERSION in (None, torch.version.cuda)


@pytest.mark.parametrize(
    "built, running",
    [
        (("2.11.0+cu130", "13.0"), ("2.11.0+cu130", "13.0")),
        (("2.11.0+cu130", "13.0"), ("2.11.1+cu130", "13.0")),  # patch releases keep the ABI
        (("2.11.0+cu128", "12.8"), ("2.11.0+cu126", "12.6")),  # one CUDA major: one runtime library
        (("2.13.0+cpu", None), ("2.13.0+cpu", None)),
        (("2.13.0+cpu", None), ("2.13.0+cu130", "13.0")),  # a CPU-only build runs on either
        (("2.11.0", None), ("2.11.0a0+git1234", None)),
    ],
)
def test_loads_under_a_compatible_torch(built, running):
    assert _build_check.mismatch(*built, *running) is None


@pytest.mark.parametrize(
    "built, running",
    [
        (("2.11.0+cu130", "13.0"), ("2.13.0+cu130", "13.0")),
        (("2.13.0+cpu", None), ("2.11.0+cpu", None)),
        (("3.11.0+cpu", None), ("2.11.0+cpu", None)),
        (("2.11.0+cu130", "13.0"), ("2.11.0+cpu", None)),  # CUDA kernels without CUDA torch
        (("2.11.0+cu130", "13.0"), ("2.11.0+cu128", "12.8")),
    ],
)
def test_refuses_another_torch(built, running):
    message = _build_check.mismatch(*built, *running)
    assert f"built against torch {built[0]}" in message and f"this is torch {running[0]}" in message
    assert "--no-build-isolation" in message  # how to fix it


def test_import_under_another_torch_is_one_clear_error():
    # A fresh process whose torch claims another minor version; the error must
    # come before _C is loaded (a mismatched _C would fail on a symbol, or crash).
    code = (
        "import sys, torch\n"
        "torch.__version__ = '1.0.0+cpu'\n"
        "try:\n"
        "    import torch_prnn\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
        "    print('_C loaded:', 'torch_prnn._C' in sys.modules)\n"
    )
    rc, out = run_python(["-c", code], timeout=120)
    assert rc == 0, out
    assert f"built against torch {_build_info.TORCH_VERSION}" in out and "this is torch 1.0.0+cpu" in out, out
    assert "_C loaded: False" in out, out


def test_import_without_a_record_says_it_is_not_built():
    code = (
        "import sys\n"
        "sys.modules['torch_prnn._build_info'] = None  # as if no record was written\n"
        "try:\n"
        "    import torch_prnn\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    rc, out = run_python(["-c", code], timeout=120)
    assert rc == 0, out
    assert "ImportError: torch_prnn's extension is not built" in out, out
