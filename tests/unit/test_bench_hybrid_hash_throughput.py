"""Smoke test of benchmarks/bench_hybrid_hash_throughput.py: variants given with commas run, unknown ones are refused.

No timing assertions (timings live in benchmarks/): only that a tiny run of two variants writes its
result JSON with both, and that a misspelt variant stops the script with the list to choose from
(it once ran as static tables over raw 64-bit ids).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_hybrid_hash_throughput.py"


def _run(*args, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_comma_separated_variants_run_and_report_both(tmp_path):
    proc = _run(
        *("--fields", "3", "--batch", "16", "--vocab", "50", "--steps", "8", "--warmup", "2", "--flush-every", "3"),
        *("--variants", "dynamic_packed,static_packed"),
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result["samples_per_s"]) == {"dynamic_packed", "static_packed"}
    assert all(v > 0 for v in result["samples_per_s"].values())
    assert "dynamic_packed_over_static_packed" in result
    assert list(tmp_path.glob("bench_hybrid_hash_throughput-3f-*.json"))


def test_an_unknown_variant_is_refused_with_the_choices(tmp_path):
    proc = _run("--variants", "dynamic_packed,static", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "unknown variant(s) ['static']" in proc.stderr
    assert "static_packed" in proc.stderr
