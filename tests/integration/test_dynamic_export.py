"""A DynamicEmbedding model's SavedModel serves without hybridtf: each table a static lookup of the learned
rows plus a gather (unseen ids: the zero row), a table without rows too, and bags of ids (ragged or sparse,
with a combiner) built with TensorFlow's own ops."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from tests.integration.test_dynamic_embedding import FIELDS, D, _data, _fit, _pair


@pytest.mark.slow  # ~20 s: a SavedModel export and a fresh TensorFlow process
@pytest.mark.parametrize("export", ["saved_model.save", "model.export"])
def test_saved_model_serves_without_hybridtf(tmp_path, export):
    x, y = _data(steps=10)
    dyn, m1, _ = _pair("adagrad", hot_rows=8, warmup_steps=2, flush_every=3)
    _fit(m1, x, y)
    probe = np.concatenate([x[:6], np.array([[2**50, -1, 5]], np.int64)])  # the last row has unseen ids
    expected = m1.predict(probe, verbose=0)
    ids, rows = dyn.table.export()[:2]
    if export == "model.export":  # Keras's ExportArchive: its endpoint is traced before the save
        m1.export(str(tmp_path / "sm"))
    else:
        tf.saved_model.save(m1, str(tmp_path / "sm"))
    np.save(tmp_path / "probe.npy", probe)
    code = (
        "import sys, numpy as np, tensorflow as tf\n"
        f"m = tf.saved_model.load({str(tmp_path / 'sm')!r})\n"
        "f = m.signatures['serving_default']\n"
        f"probe = np.load({str(tmp_path / 'probe.npy')!r})\n"
        "out = list(f(tf.constant(probe)).values())[0].numpy()\n"
        f"np.save({str(tmp_path / 'out.npy')!r}, out)\n"
        "assert 'hybridtf' not in sys.modules\n"
    )
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path)
    out = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(out[:6], expected[:6], rtol=1e-6)
    # unseen ids: zero rows in the export (the id 5 row is the learned one)
    unseen = np.concatenate([np.zeros((1, 2 * D), np.float32), rows.numpy()[np.searchsorted(ids.numpy(), 5)][None]], 1)
    head = tf.keras.Sequential(m1.layers[-2:])
    np.testing.assert_allclose(out[6:], head(unseen).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("export", ["saved_model.save", "model.export"])
def test_a_table_without_rows_exports_zero_rows(tmp_path, export):
    """TensorFlow refuses a static lookup table of no keys: a never-trained table still exports (zero rows)."""
    dyn, model, _ = _pair("adagrad", hot_rows=8)
    x = _data(steps=1)[0][:8]
    model.predict(x, verbose=0)  # built, nothing inserted
    assert dyn.stats()["size"] == 0
    if export == "model.export":
        model.export(str(tmp_path / "sm"))
    else:
        tf.saved_model.save(model, str(tmp_path / "sm"))
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    out = next(iter(served(tf.constant(x)).values())).numpy()
    head = tf.keras.Sequential(model.layers[-2:])
    np.testing.assert_allclose(out, head(np.zeros((8, FIELDS * D), np.float32)).numpy(), rtol=1e-6)
    # and once it has rows, the next export serves them
    _fit(model, *_data(steps=2))
    tf.saved_model.save(model, str(tmp_path / "sm2"))
    served = tf.saved_model.load(str(tmp_path / "sm2")).signatures["serving_default"]
    np.testing.assert_allclose(
        next(iter(served(tf.constant(x)).values())).numpy(), model.predict(x, verbose=0), rtol=1e-6
    )


def _exported_op_types(path) -> set[str]:
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    return {
        n.op
        for graph in saved.meta_graphs
        for n in [*graph.graph_def.node, *(m for f in graph.graph_def.library.function for m in f.node_def)]
    }


@pytest.mark.parametrize("ids_kind", ["ragged", "sparse"])
def test_an_export_of_bags_holds_no_hybridtf_op(tmp_path, ids_kind):
    """A DynamicEmbedding pooling ragged or sparse bags (``tf.strings.split`` of a string feature, hashed) was
    exported with hybridtf's ``BagSplits`` op: a process without hybridtf could not load it (found by a probe).
    The export's bags are TensorFlow's own ops now, and it serves the trained model's predictions."""
    dyn = htf.layers.DynamicEmbedding(D, combiner="mean", name="tags")
    ids = tf.keras.Input((None,), dtype=tf.int64, ragged=ids_kind == "ragged", sparse=ids_kind == "sparse")
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(dyn(ids)))
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1)), loss="mse")
    bags = tf.ragged.constant([[1, 2], [3], [], [4, 5, 6]] * 8, tf.int64)
    x = bags if ids_kind == "ragged" else bags.to_sparse()
    model.fit(x, np.ones((32, 1), np.float32), batch_size=32, epochs=2, verbose=0)
    tf.saved_model.save(model, str(tmp_path / "sm"))
    assert not {t for t in _exported_op_types(tmp_path / "sm") if t.startswith("HybridTF")}
    served = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(served(x).numpy(), model.predict(x, verbose=0), rtol=1e-6, atol=1e-7)
