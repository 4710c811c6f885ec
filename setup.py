# Builds torch_prnn._C ahead of time: `python setup.py build_ext --inplace` or
# `pip install --no-build-isolation .` (metadata: pyproject.toml). With a CUDA
# build of torch and nvcc it compiles the CUDA kernels too; otherwise the CUDA
# entry points are stubs that say so.
import glob
import os
import sys

try:
    import torch
except ImportError:
    sys.exit("torch_prnn builds against the installed torch: install torch first, "
             "then `pip install --no-build-isolation .`")
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join("csrc", "kernels")
WITH_CUDA = torch.version.cuda is not None and CUDA_HOME is not None

# _C's C++ ABI is the torch it was compiled against; torch_prnn/__init__.py
# reads this record before loading _C and refuses another torch.
BUILD_INFO = """\
# Written by setup.py when it built _C: the torch it was built against.
TORCH_VERSION = {torch!r}
CUDA_VERSION = {cuda!r}  # None: built without CUDA
"""


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def extension():
    # torch builds .c files with the C++ compiler; the C sources are written to allow it.
    common = [
        os.path.join("csrc", "ops", "prnn_ops.cpp"),
        os.path.join("csrc", "ops", "prnn_cpu.cpp"),
        os.path.join("csrc", "ops", "prnn_autograd.cpp"),
        os.path.join("csrc", "ops", "prnn_layers.cpp"),
        os.path.join("csrc", "ops", "prnn_stream.cpp"),
        os.path.join(KERNELS, "status.c"),
        os.path.join(KERNELS, "cpu_reference.c"),
        os.path.join(KERNELS, "cpu_gated.c"),
        os.path.join(KERNELS, "resident_host.c"),
    ]
    # One binary for every Python >= 3.10: the module is only a stub that registers ops.
    cxx = ["-O3", "-DPy_LIMITED_API=0x030A0000"]
    if not WITH_CUDA:
        return CppExtension(
            "torch_prnn._C",
            common + [os.path.join(KERNELS, "no_cuda.c")],
            extra_compile_args={"cxx": cxx},
            py_limited_api=True,
        )
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;8.6;8.9;9.0+PTX")
    return CUDAExtension(
        "torch_prnn._C",
        common
        + [os.path.join("csrc", "ops", "prnn_ops_cuda.cpp"), os.path.join("csrc", "ops", "prnn_stream_cuda.cpp")]
        + sources("csrc/kernels/*.cu"),
        define_macros=[("WITH_CUDA", None)],
        # No fast-math: the kernels must match nn.RNN's numerics.
        extra_compile_args={
            "cxx": cxx,
            "nvcc": ["-O3", "-lineinfo", "-std=c++17", "--threads", "4"],
        },
        py_limited_api=True,
    )


class BuildWithRecord(BuildExtension):
    """Builds _C, then writes torch_prnn/_build_info.py beside it: in the build
    tree (what a wheel holds) and, for in-place and editable builds, in the
    source tree."""

    def run(self):
        super().run()
        record = BUILD_INFO.format(torch=torch.__version__, cuda=torch.version.cuda if WITH_CUDA else None)
        folders = {os.path.join(self.build_lib, "torch_prnn")}
        if self.inplace:
            folders.add(os.path.dirname(self.get_ext_fullpath("torch_prnn._C")))
        for folder in folders:
            with open(os.path.join(folder, "_build_info.py"), "w") as f:
                f.write(record)


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildWithRecord},
    # One binary for every Python >= 3.10 (see extension()): an abi3 wheel.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
