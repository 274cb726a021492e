"""Ahead-of-time build of the hot-buffer ops as ``hisparse_kernels._C`` for sm_90 and sm_100.

``TORCH_CUDA_ARCH_LIST="9.0;10.0" python setup.py build_ext --inplace`` (tests use the JIT path).
The wheel (``pip wheel .``, as the runtime image builds it) holds the compiled module only: the
Python package comes from the main distribution (pyproject.toml), so no file has two owners."""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0;10.0")

setup(
    name="hisparse-kernels",
    version="0.1.0",
    packages=[],
    ext_modules=[
        CUDAExtension(
            name="hisparse_kernels._C",
            sources=["hisparse_kernels/csrc/registration.cpp", "hisparse_kernels/csrc/hot_buffer_ops.cu",
                     "hisparse_kernels/csrc/vllm_resolve_ops.cu"],
            define_macros=[("HISPARSE_AOT_MODULE", None)],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "-lineinfo"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
