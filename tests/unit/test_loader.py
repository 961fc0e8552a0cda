"""The op-library loader: build record, version check, clear errors with the fix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tensorflow as tf

from hybridtf._src.errors import OpLibraryError
from hybridtf._src.run import loader


def test_build_record_is_embedded_and_matches_tensorflow():
    info = loader.build_info(loader.library_path())
    assert info["tensorflow_version"] == tf.__version__
    assert any(s.endswith("unique_partition_kernels.cc") for s in info["sources"])


def test_version_mismatch_names_both_versions_and_the_fix():
    with pytest.raises(OpLibraryError, match=r"built for TensorFlow 2\.14\.0, but TensorFlow 2\.15\.1.*Fix: rebuild"):
        loader.check_tensorflow_version("2.14.0", "2.15.1")
    loader.check_tensorflow_version("2.15.1", "2.15.1")


def test_library_without_record_is_refused(tmp_path):
    fake = tmp_path / "lib.so"
    fake.write_bytes(b"\x7fELF not a hybridtf build")
    with pytest.raises(OpLibraryError, match=r"no hybridtf build record.*Fix"):
        loader.build_info(fake)


def test_record_roundtrip_through_generated_source(tmp_path):
    sys.path.insert(0, "tools")
    try:
        import build_ops
    finally:
        sys.path.pop(0)
    info = {"tensorflow_version": "9.9.9", "cuda": False, "sources": ['a "quoted" \\ path']}
    src = build_ops.build_info_source(info)
    obj = tmp_path / "info.o"
    (tmp_path / "info.cc").write_text(src)
    subprocess.run(["g++", "-c", str(tmp_path / "info.cc"), "-o", str(obj)], check=True)
    assert loader.build_info(obj) == json.loads(json.dumps(info))


def test_missing_override_path_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRIDTF_OPS_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(OpLibraryError, match=r"HYBRIDTF_OPS_LIBRARY=.*does not exist"):
        loader.library_path()


def test_wrong_version_library_is_refused_before_loading(tmp_path):
    """A library whose record names another TF is refused in a fresh process, with the fix."""
    sys.path.insert(0, "tools")
    try:
        import build_ops
    finally:
        sys.path.pop(0)
    (tmp_path / "info.cc").write_text(build_ops.build_info_source({"tensorflow_version": "2.0.0"}))
    lib = tmp_path / "old.so"
    subprocess.run(["g++", "-shared", "-fPIC", str(tmp_path / "info.cc"), "-o", str(lib)], check=True)
    code = "import hybridtf as h, tensorflow as tf; h.ops.unique_partition(tf.constant([1]), 1)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"HYBRIDTF_OPS_LIBRARY": str(lib), "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "OpLibraryError" in proc.stderr
    assert "built for TensorFlow 2.0.0" in proc.stderr
