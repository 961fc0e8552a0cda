"""Shared pytest configuration: quiet TensorFlow, the ``slow`` list, GPU marker handling, Hypothesis profiles."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
from hypothesis import settings

# CI runs the property tests on a fixed sequence of examples (a red CI is then the change's, not the draw's);
# elsewhere each run draws new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def gpu_available() -> bool:
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0


SLOW_LIST = pathlib.Path(__file__).with_name("slow_tests.txt")


def _listed_slow() -> set:
    if not SLOW_LIST.exists():
        return set()
    lines = (line.strip() for line in SLOW_LIST.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Marks the tests listed in ``slow_tests.txt`` (``tools/slow_tests.py``) ``slow``; skips ``gpu`` tests
    without a GPU (HYBRIDTF_REQUIRE_GPU=1 makes that a failure)."""
    listed = _listed_slow()
    for item in items:
        if item.nodeid.split("@")[0] in listed:  # (pytest-xdist's loadgroup may have appended "@<group>")
            item.add_marker(pytest.mark.slow)
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
