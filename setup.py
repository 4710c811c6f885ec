# Builds torch_prnn._C ahead of time: `python setup.py build_ext --inplace` or
# `pip install .`. With a CUDA build of torch and nvcc it compiles the CUDA
# kernels too; otherwise the CUDA entry points are stubs that say so.
import glob
import os
import re

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join("csrc", "kernels")


def version():
    with open(os.path.join(ROOT, "torch_prnn", "__init__.py")) as f:
        return re.search(r'^__version__ = "(.+)"$', f.read(), re.M).group(1)


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def extension():
    # torch builds .c files with the C++ compiler; the C sources are written to allow it.
    common = [
        os.path.join("csrc", "ops", "prnn_ops.cpp"),
        os.path.join("csrc", "ops", "prnn_autograd.cpp"),
        os.path.join("csrc", "ops", "prnn_stream.cpp"),
        os.path.join(KERNELS, "status.c"),
        os.path.join(KERNELS, "cpu_reference.c"),
        os.path.join(KERNELS, "resident_host.c"),
    ]
    # One binary for every Python >= 3.10: the module is only a stub that registers ops.
    cxx = ["-O3", "-DPy_LIMITED_API=0x030A0000"]
    with_cuda = torch.version.cuda is not None and CUDA_HOME is not None
    if not with_cuda:
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


setup(
    name="torch_prnn",
    version=version(),
    description="Persistent CUDA kernels for small-batch Elman RNNs, as a drop-in for torch.nn.RNN",
    packages=find_packages(include=["torch_prnn", "torch_prnn.*"]),
    package_data={"torch_prnn": ["*.txt"]},
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    python_requires=">=3.10",
    install_requires=["torch>=2.11"],
)
