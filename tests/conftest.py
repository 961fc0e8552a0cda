"""Shared pytest configuration: quiet TensorFlow, GPU marker handling."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


def gpu_available() -> bool:
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0


def pytest_collection_modifyitems(config, items):
    """Skips ``gpu`` tests without a GPU; HYBRIDTF_REQUIRE_GPU=1 makes that a failure."""
    if gpu_available():
        return
    if os.environ.get("HYBRIDTF_REQUIRE_GPU") == "1":
        fail = pytest.mark.xfail(reason="HYBRIDTF_REQUIRE_GPU=1 but no GPU", run=False, strict=True)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(fail)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
