"""Issue 5 done-when: on Criteo data converted to Parquet, the wrapped model's AUC after one epoch equals the plain's.

Criteo-format text (generated here, schema-faithful: 13 integer columns and 26 hex categoricals with
Criteo's missing-value rates; and the real 200-row sample in ``../shared/data`` when it exists) is
converted with ``hybridtf.data.convert_text``, read with ``parquet_dataset`` (shuffled, seeded) and
fed to the plain Keras Wide & Deep model and to the same model, built with the same seed, wrapped
with ``htf.keras.optimize``. After one epoch of Adagrad: per-step losses agree within 1e-5 relative,
the running training AUC and the AUC of ``model.evaluate`` on the converted file within 1e-5.

The pipeline is the one of ``examples/wdl_keras_parquet.py`` (its helpers are imported).
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest

from hybridtf._src.models import ctr_models

REPO = pathlib.Path(__file__).resolve().parents[2]
CRITEO_SAMPLE = REPO.parent / "shared" / "data" / "criteo_sample.txt"
BUCKETS = 2**12


def _load_example():
    spec = importlib.util.spec_from_file_location("wdl_keras_parquet", REPO / "examples" / "wdl_keras_parquet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wdl = _load_example()


def _plain_vs_optimized(text_path: pathlib.Path, workdir: pathlib.Path, batch_size: int) -> tuple[dict, int]:
    path, spec, _ = wdl.prepare_parquet(str(text_path), str(workdir), "criteo", BUCKETS, synthesize=None)
    train_path, eval_path, rows, _ = wdl.split_parquet(path, str(workdir), eval_fraction=0.0)
    assert train_path == eval_path == path  # one-hot only: the converter's file is read as it is
    fields = wdl.fields_from_spec(spec, dim=8)
    assert [f.vocab for f in fields] == [BUCKETS] * 26 and len(spec.dense) == 13
    result = wdl.compare(
        lambda: ctr_models.wide_and_deep(fields, len(spec.dense), hidden=(32, 16), seed=3),
        lambda: wdl.make_dataset(train_path, spec, batch_size, shuffle=True, seed=5),
        lambda: wdl.make_dataset(eval_path, spec, batch_size, shuffle=False, seed=None),
        epochs=1,
        lr=0.05,
        train_rows=rows,
        batch_size=batch_size,
    )
    return result, rows


def _check_equal(result: dict, rows: int, batch_size: int) -> None:
    assert result["skipped"] == []
    assert result["tables"] == 52 and result["packed_tables"] < result["tables"]  # really packed
    plain, fast = result["plain"], result["hybridtf"]
    assert len(plain["step_losses"]) == len(fast["step_losses"]) == math.ceil(rows / batch_size)
    assert np.ptp(plain["step_losses"]) > 0  # training moved
    np.testing.assert_allclose(fast["step_losses"], plain["step_losses"], rtol=1e-5, atol=0)
    assert abs(fast["train_auc"] - plain["train_auc"]) <= 1e-5
    assert abs(fast["eval_auc"] - plain["eval_auc"]) <= 1e-5
    np.testing.assert_allclose(fast["eval_loss"], plain["eval_loss"], rtol=1e-5)


def test_generated_criteo_auc_equal(tmp_path):
    text = tmp_path / "criteo.txt"
    wdl.write_criteo_text(text, rows=2000, seed=1)
    lines = text.read_text().splitlines()
    assert len(lines) == 2001 and len(lines[1].split(",")) == 40
    assert any(",," in line for line in lines[1:])  # missing values, as in Criteo

    result, rows = _plain_vs_optimized(text, tmp_path, batch_size=256)
    assert rows == 2000
    _check_equal(result, rows, batch_size=256)
    assert result["plain"]["eval_auc"] > 0.6  # the data is learnable and the model learned


@pytest.mark.skipif(not CRITEO_SAMPLE.exists(), reason=f"{CRITEO_SAMPLE} not found")
def test_criteo_sample_auc_equal(tmp_path):
    # 200 rows: batch 32 gives 7 steps in the epoch.
    result, rows = _plain_vs_optimized(CRITEO_SAMPLE, tmp_path, batch_size=32)
    assert rows == 200
    _check_equal(result, rows, batch_size=32)
