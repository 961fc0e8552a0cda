"""Concat fusion: a Keras Concatenate of packed lookups becomes one StitchConcat, with the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.models import ctr_data, ctr_models
from tests.integration.step_ops import pruned_op_types, step_op_types

BATCH, STEPS = 64, 30


def _data(fields, n_dense):
    batches = ctr_data.generate_batches(fields, n_dense, BATCH, STEPS, seed=3)
    return [(ctr_data.to_tensors(x), tf.constant(y)) for x, y in batches]


def _fields():
    return ctr_data.criteo_like_fields(dim=8, max_vocab=300)[:8]


def _train(model, batches, optimizer=None):
    model.compile(optimizer=optimizer or tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


def test_wdl_fused_is_bitwise_equal_to_unfused_and_exact_vs_plain():
    fields = _fields()
    batches = _data(fields, 4)
    build = lambda: ctr_models.wide_and_deep(fields, 4, hidden=(16, 8), seed=7)  # noqa: E731
    plain, fused, unfused = build(), build(), build()
    for m in (plain, fused, unfused):
        m(batches[0][0])
    fused = htf.keras.optimize(fused, fuse_dense=False)  # the dense fusion is not bitwise: test_dense_fusion.py
    unfused = htf.keras.optimize(unfused, fuse_concat=False)
    losses = {name: _train(m, batches) for name, m in [("plain", plain), ("fused", fused), ("unfused", unfused)]}
    # as traced: the deep MLP input and the wide sum
    assert sorted(fused.hybridtf_fused_concats) == ["concat", "deep_concat"]
    assert unfused.hybridtf_fused_concats == []
    np.testing.assert_array_equal(losses["fused"], losses["unfused"])
    np.testing.assert_allclose(losses["fused"], losses["plain"], rtol=1e-5, atol=0)
    x = batches[-1][0]
    np.testing.assert_allclose(fused.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused(x).numpy(), plain(x).numpy(), rtol=1e-5, atol=1e-6)  # eager: plain concat


def test_fused_step_has_stitch_concats_and_no_concat_or_split():
    fields = _fields()
    batches = _data(fields, 4)
    counts = {}
    for fuse in (True, False):
        model = ctr_models.wide_and_deep(fields, 4, hidden=(16, 8), seed=7)
        model(batches[0][0])
        model = htf.keras.optimize(model, fuse_concat=fuse, fuse_dense=False)
        model.compile(optimizer="adagrad", loss="binary_crossentropy")
        types = pruned_op_types(model, batches)  # the replaced ConcatV2s stay in the graph, unused
        kinds = ("HybridTF>StitchConcat", "HybridTF>StitchConcatGrad", "ConcatV2", "Slice")
        counts[fuse] = {t: types.count(t) for t in kinds}
    # the deep MLP input and the wide sum's concatenation
    assert counts[True]["HybridTF>StitchConcat"] == 2 and counts[True]["HybridTF>StitchConcatGrad"] == 2
    assert counts[False]["HybridTF>StitchConcat"] == 0
    assert counts[True]["ConcatV2"] == counts[False]["ConcatV2"] - 2  # both concatenations are gone ...
    assert counts[True]["Slice"] <= counts[False]["Slice"] - 2 * len(fields)  # ... and so are their splits


def test_embeddings_used_twice_deepfm_stays_exact():
    """DeepFM feeds each field's embedding to the FM part and to the deep concat: both consumers get gradients."""
    fields = _fields()
    batches = _data(fields, 4)
    plain = ctr_models.deepfm(fields, 4, hidden=(16, 8), seed=7)
    fused = ctr_models.deepfm(fields, 4, hidden=(16, 8), seed=7)
    plain(batches[0][0])
    fused(batches[0][0])
    fused = htf.keras.optimize(fused)
    np.testing.assert_allclose(_train(fused, batches), _train(plain, batches), rtol=1e-5, atol=0)
    assert fused.hybridtf_fused_concats  # as traced


def _mixed_concat_model(fields, kind: str):
    column = kind in ("rank3", "flatten")  # ids [B, 1]: embeddings [B, 1, d]
    inputs = {f.name: tf.keras.Input((1,) if column else (), dtype=tf.int64, name=f.name) for f in fields}
    dense = tf.keras.Input((3,), name="dense_in")
    embs = [tf.keras.layers.Embedding(f.vocab, f.dim, name=f"emb_{f.name}")(inputs[f.name]) for f in fields]
    if kind == "rank3":  # [B, 1, d] pieces along the last axis: a column concatenation too, reshaped
        x = tf.keras.layers.Flatten()(tf.keras.layers.Concatenate(name="cat3")(embs))
    elif kind == "flatten":  # each [B, 1, d] flattened to [B, d] first: fused through the reshapes
        flat = [tf.keras.layers.Flatten(name=f"flat_{f.name}")(e) for f, e in zip(fields, embs)]
        x = tf.keras.layers.Concatenate(name="catf")([*flat, dense])
    else:  # embeddings interleaved with a computed tensor and the dense input
        mid = tf.keras.layers.Dense(2, name="mid")(dense)
        x = tf.keras.layers.Concatenate(name="cat2")([embs[1], dense, embs[0], mid, *embs[2:]])
    hidden = tf.keras.layers.Dense(8, activation="relu", name="hidden")(x)
    out = tf.keras.layers.Dense(1, activation="sigmoid", name="out")(hidden)
    return tf.keras.Model({**inputs, "dense_in": dense}, out)


@pytest.mark.parametrize("kind", ["rank2", "rank3", "flatten"])
def test_interleaved_dense_inputs_flattened_fields_and_rank3_concat(kind):
    fields = _fields()[:5]
    rng = np.random.default_rng(0)
    column = kind in ("rank3", "flatten")
    batches = []
    for _ in range(STEPS):
        x = {f.name: rng.integers(0, f.vocab, size=(BATCH, 1) if column else BATCH) for f in fields}
        x["dense_in"] = rng.standard_normal((BATCH, 3)).astype(np.float32)
        batches.append(({k: tf.constant(v) for k, v in x.items()}, tf.constant(rng.integers(0, 2, BATCH))))
    tf.keras.utils.set_random_seed(1)
    plain = _mixed_concat_model(fields, kind)
    tf.keras.utils.set_random_seed(1)
    fused = htf.keras.optimize(_mixed_concat_model(fields, kind), fuse_dense=False)
    fused.compile(optimizer="sgd", loss="binary_crossentropy")
    types = step_op_types(fused, batches[:1])
    assert types.count("HybridTF>StitchConcat") == 1
    tf.keras.utils.set_random_seed(1)
    fused = htf.keras.optimize(_mixed_concat_model(fields, kind), fuse_dense=False)
    tf.keras.utils.set_random_seed(1)
    unfused = htf.keras.optimize(_mixed_concat_model(fields, kind), fuse_concat=False)
    losses = _train(fused, batches)
    np.testing.assert_array_equal(losses, _train(unfused, batches))
    np.testing.assert_allclose(losses, _train(plain, batches), rtol=1e-5, atol=0)


def test_saved_model_export_uses_plain_concat(tmp_path):
    fields = _fields()
    batches = _data(fields, 4)
    model = ctr_models.wide_and_deep(fields, 4, hidden=(16, 8), seed=7)
    model(batches[0][0])
    model = htf.keras.optimize(model)
    _train(model, batches[:3])
    model.save(tmp_path / "sm")
    loaded = tf.keras.models.load_model(tmp_path / "sm")
    ops = {
        node.op
        for f in tf.saved_model.load(str(tmp_path / "sm"))
        .signatures["serving_default"]
        .graph.as_graph_def()
        .library.function
        for node in f.node_def
    }
    assert not any(op.startswith("HybridTF") for op in ops)
    x = batches[-1][0]
    np.testing.assert_allclose(loaded.predict_on_batch(x), model.predict_on_batch(x), rtol=1e-6, atol=1e-7)


def test_bitwise_equal_to_plain_without_grapplers_rsqrt_rewrite():
    """The packed model does Keras's float operations: with Grappler's arithmetic optimizer off (it rewrites
    Keras Adagrad's ``g / sqrt(acc + eps)`` into ``g * rsqrt(acc + eps)`` in the plain graph, an ulp apart),
    plain and optimized (fused concat, fused Adagrad) losses and weights are identical to the last bit."""
    fields = _fields()
    batches = _data(fields, 4)
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    try:
        plain = ctr_models.wide_and_deep(fields, 4, hidden=(16, 8), seed=7)
        fused = ctr_models.wide_and_deep(fields, 4, hidden=(16, 8), seed=7)
        plain(batches[0][0])
        fused(batches[0][0])
        fused = htf.keras.optimize(fused, fuse_dense=False)  # the dense fusion sums in another order
        np.testing.assert_array_equal(_train(fused, batches), _train(plain, batches))
        for a, b in zip(fused.get_weights(), plain.get_weights()):
            np.testing.assert_array_equal(a, b)
    finally:
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": True})
