"""The examples turn bad command-line arguments into usage errors (exit status 2), never tracebacks.

Each case runs an example as a subprocess from the repository root; argparse (or the check
right after it) rejects the value before any training starts, so a case takes the time of
importing TensorFlow.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, f"examples/{script}", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _assert_usage_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, (
        f"exit status {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    assert "usage:" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, f"{word!r} not in:\n{result.stderr}"


@pytest.fixture()
def criteo_like_csv(tmp_path):
    path = tmp_path / "criteo_like.csv"
    path.write_text("label,I1,C1\n0,3,05db9164\n1,,68fd1e64\n")
    return path


@pytest.fixture()
def avazu_like_csv(tmp_path):
    path = tmp_path / "avazu_like.csv"
    path.write_text("id,click,hour,site_id\n1,0,14102100,1fbe01fe\n2,1,14102100,85f751fd\n")
    return path


BAD_ARGUMENTS = [  # (example, arguments, words of the message)
    ("din_multihot.py", ["--epochs", "0"], ["--epochs", "positive integer", "got 0"]),
    ("dynamic_embedding_avazu.py", ["--epochs", "0"], ["--epochs", "positive integer"]),
    ("wdl_keras_parquet.py", ["--batch", "0"], ["--batch", "positive integer"]),
    ("unique_partition_demo.py", ["--batch", "0", "--ranks", "3"], ["--batch", "positive integer"]),
    ("unique_partition_demo.py", ["--ranks", "0"], ["--ranks", "positive integer"]),
    ("unique_partition_demo.py", ["--batch", "1", "--ranks", "5000"], ["--ranks 5000", "[1, 4096]"]),
    ("wdl_demo.py", ["--max-shards", "0"], ["--max-shards", "positive integer"]),
    ("wdl_demo.py", ["--steps", "3", "--warmup", "5"], ["--steps", "--warmup + 2"]),
    ("din_multihot.py", ["--eval-fraction", "1.5"], ["--eval-fraction", "[0, 1)", "1.5"]),
    ("din_multihot.py", ["--lr", "-1"], ["--lr", "positive number"]),
    ("dynamic_estimator_avazu.py", ["--steps", "0"], ["--steps", "positive integer"]),
    ("dynamic_estimator_avazu.py", ["--hot-rows", "0"], ["--hot-rows", "positive integer"]),
    ("dynamic_embedding_avazu.py", ["--data", "/nope"], ["--data /nope", "no such file"]),
    ("wdl_keras_parquet.py", ["--data", "/nonexistent/x.txt"], ["--data", "no such file: /nonexistent/x.txt"]),
    ("deepfm_estimator.py", ["--batch-size", "0"], ["--batch-size", "positive integer"]),
    ("horovod_wdl.py", ["--fields", "0"], ["--fields", "positive integer"]),
    ("horovod_wdl.py", ["--steps", "2"], ["--steps must be at least 3"]),
]


@pytest.mark.parametrize(
    ("script", "args", "words"), BAD_ARGUMENTS, ids=[f"{s} {' '.join(a)}" for s, a, _ in BAD_ARGUMENTS]
)
def test_bad_argument_is_a_usage_error_naming_the_argument(script, args, words):
    _assert_usage_error(_run(script, *args), *words)


def test_avazu_examples_name_the_missing_avazu_columns_of_another_format(criteo_like_csv):
    for script in ("dynamic_embedding_avazu.py", "dynamic_estimator_avazu.py"):
        result = _run(script, "--data", str(criteo_like_csv))
        _assert_usage_error(result, "lacks the Avazu columns", "'site_id'", "'click'", "is this Avazu data?")


def test_criteo_examples_name_the_missing_criteo_columns_of_another_format(avazu_like_csv):
    _assert_usage_error(
        _run("deepfm_estimator.py", "--data", str(avazu_like_csv)), "lacks the Criteo columns", "'label'", "'C26'"
    )
    _assert_usage_error(
        _run("wdl_keras_parquet.py", "--data", str(avazu_like_csv)), "--data", "lacks the criteo columns"
    )


def test_horovod_help_describes_every_accepted_field_count():
    result = _run("horovod_wdl.py", "--help")
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())
    assert "or more" not in help_text
    assert "26: Criteo-like fields" in help_text and "any other count n" in help_text
