"""GPU checks of UniquePartition (marker ``gpu``: skipped without a GPU).

HYBRIDTF_REQUIRE_GPU=1 turns the skip into a failure (for GPU CI).
"""

from __future__ import annotations

import pathlib
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.data.synthetic import zipf_ids

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu


def test_standalone_cuda_harness_matches_cpu_layer():
    """The TF-free CUDA layer equals the CPU layer on every harness case (nvcc only)."""
    proc = subprocess.run(
        [str(ROOT / "tools" / "cuda_harness.sh"), "--run"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout


@pytest.mark.parametrize("strategy", ["mod", "range"])
def test_gpu_kernel_equals_cpu_kernel(strategy):
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees no GPU")
    ids = zipf_ids(1_000_000, 4_000_000, seed=5)
    kw = {"num_rows": 4_000_000} if strategy == "range" else {}
    with tf.device("/CPU:0"):
        cpu = htf.ops.unique_partition(tf.constant(ids), 8, strategy, **kw)
    with tf.device("/GPU:0"):
        gpu = htf.ops.unique_partition(tf.constant(ids), 8, strategy, **kw)
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
