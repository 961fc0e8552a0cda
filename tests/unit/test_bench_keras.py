"""Smoke test of benchmarks/bench_keras.py --quick: it runs, and its last stdout line is the result JSON.

No timing assertions (timings live in benchmarks/): only the structure of the result, that the
op counts went down, and that the two models' per-step losses agree (hybridtf is exact).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_prints_result_json(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_keras.py"), "--quick", "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    assert result["benchmark"] == "keras" and result["tensorflow"] == "2.15.1"
    (row,) = result["configs"]
    assert row["label"] == "wdl/criteo/adagrad"
    assert "error" not in row and "skipped" not in row, row
    config = row["config"]
    for variant in ("plain", "hybridtf"):
        run = row[variant]
        assert run["variant"] == variant
        for key in ("samples_per_s", "step_ms_median", "peak_rss_mib", "ops", "ops_grappler", "ops_by_type"):
            assert key in run, key
        assert run["timed_steps"] == config["steps"]
        assert len(run["losses"]) == config["warmup"] + config["steps"]
    for key in ("speedup", "ops_ratio", "ops_grappler_ratio", "rss_ratio", "loss_max_rel_diff"):
        assert isinstance(row[key], float), key
    assert row["ops_ratio"] < 1 and row["ops_grappler_ratio"] < 1
    assert row["loss_max_rel_diff"] < 1e-5
    assert row["hybridtf"]["packed_tables"] >= 1 and row["hybridtf"]["skipped_layers"] == []

    written = list(tmp_path.glob("bench_keras-*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text()) == result
    if result["chart"] is not None:
        assert Path(result["chart"]).is_file() and Path(result["chart"]).parent == tmp_path
    else:
        assert "matplotlib" in result["chart_error"]
