"""Builds hybridtf: the TensorFlow op library and the pybind11 module.

``pip install .`` / ``pip install -e .`` compile ``kernels/`` with g++ and the
installed TensorFlow's ``tf.sysconfig`` flags (tools/build_ops.py), plus the
CUDA sources when nvcc is found (HYBRIDTF_CUDA=auto|0|1).
"""

import pathlib
import sys

from pybind11.setup_helpers import Pybind11Extension
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))
import build_ops  # noqa: E402

OPS_EXTENSION = "hybridtf._src.run._hybridtf_ops"


class BuildExt(build_ext):
    """Builds the op library with tools/build_ops.py, the rest with setuptools."""

    def build_extension(self, ext):
        if ext.name == OPS_EXTENSION:
            build_ops.build(pathlib.Path(self.get_ext_fullpath(ext.name)), verbose=True)
        else:
            super().build_extension(ext)


native = Pybind11Extension(
    "hybridtf._native",
    sources=[
        "kernels/python/native_module.cc",
        "kernels/unique_partition/unique_partition_impl.cc",
        # HybridHash (kernels/hybrid_hash): its binding and TF-free store
        "kernels/python/hybrid_hash_binding.cc",
        "kernels/hybrid_hash/hybrid_hash_impl.cc",
        "kernels/hybrid_hash/hybrid_hash_apply_impl.cc",
        "kernels/hybrid_hash/hybrid_hash_io_impl.cc",
    ],
    include_dirs=[str(ROOT)],
    cxx_std=17,
    extra_compile_args=["-O3", "-DNDEBUG"],
)

setup(
    ext_modules=[native, Extension(OPS_EXTENSION, sources=[])],
    cmdclass={"build_ext": BuildExt},
)
