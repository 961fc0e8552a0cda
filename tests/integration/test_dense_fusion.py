"""Dense fusion: the MLP's first Dense layer on a fused concatenation becomes one StitchConcatMatMul.

Same math, another summation order: per-step losses over 100 steps, predictions and trained weights agree
with the plain model (and with the model optimized without the dense fusion) within 1e-5 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.models import ctr_data, ctr_models
from hybridtf._src.run.second_order import SecondOrderGradientError
from tests.integration.step_ops import pruned_op_types

BATCH, STEPS = 64, 100
OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.1),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.05),
    "adam": lambda: tf.keras.optimizers.Adam(0.01),
}


def _fields():
    # one-hot and multi-hot (mean) fields of two dims, Zipf ids: projected and position-by-position fields
    return ctr_data.many_fields(n_fields=12, dims=(4, 8), multi_hot_fraction=0.25, vocab_range=(20, 2000), seed=5)


@pytest.fixture(scope="module")
def data():
    fields = _fields()
    batches = ctr_data.generate_batches(fields, 3, BATCH, STEPS, seed=9)
    return fields, [(ctr_data.to_tensors(x), tf.constant(y)) for x, y in batches]


def _train(model, optimizer, batches):
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("builder", ["wdl", "deepfm"])
def test_fused_dense_matches_plain_and_unfused(builder, optimizer, data):
    fields, batches = data
    build = {"wdl": ctr_models.wide_and_deep, "deepfm": ctr_models.deepfm}[builder]
    plain, fused, unfused = (build(fields, 3, hidden=(16, 8), seed=4) for _ in range(3))
    for m in (plain, fused, unfused):
        m(batches[0][0])
    fused = htf.keras.optimize(fused)
    unfused = htf.keras.optimize(unfused, fuse_dense=False)
    losses = {
        name: _train(m, OPTIMIZERS[optimizer](), batches)
        for name, m in [("plain", plain), ("fused", fused), ("unfused", unfused)]
    }
    assert fused.hybridtf_fused_dense == ["deep_0"] and unfused.hybridtf_fused_dense == []
    assert np.all(np.isfinite(losses["plain"]))
    np.testing.assert_allclose(losses["fused"], losses["plain"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(losses["fused"], losses["unfused"], rtol=1e-5, atol=0)
    x = batches[-1][0]
    np.testing.assert_allclose(fused.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-5, atol=1e-6)
    # Adam moves an element whose gradient is at rounding level by about lr either way (m / sqrt(v) keeps only
    # the sign): a few such elements differ by more than the others, on some CPUs (the losses stay within 1e-5).
    atol = 1e-4 if optimizer == "adam" else 1e-5
    for a, b in zip(fused.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol)


def test_step_ops_matmul_and_concat_are_gone(data):
    fields, batches = data
    counts = {}
    for fuse in (True, False):
        model = ctr_models.wide_and_deep(fields, 3, hidden=(16, 8), seed=4)
        model(batches[0][0])
        model = htf.keras.optimize(model, fuse_dense=fuse)
        model.compile(optimizer="adagrad", loss="binary_crossentropy")
        types = pruned_op_types(model, batches)  # the replaced ops stay in the graph, unused
        kinds = ("HybridTF>StitchConcatMatMul", "HybridTF>StitchConcatMatMulGrad", "HybridTF>StitchConcat", "MatMul")
        counts[fuse] = {t: types.count(t) for t in kinds}
    assert counts[True]["HybridTF>StitchConcatMatMul"] == 1 and counts[True]["HybridTF>StitchConcatMatMulGrad"] == 1
    assert counts[False]["HybridTF>StitchConcatMatMul"] == 0
    # the deep concatenation is not computed any more (the wide sum's stays) ...
    assert counts[True]["HybridTF>StitchConcat"] == counts[False]["HybridTF>StitchConcat"] - 1
    # ... and the first layer's forward matmul and its two gradient matmuls are gone
    assert counts[True]["MatMul"] == counts[False]["MatMul"] - 3


class _ScaledDense(tf.keras.layers.Dense):
    """A Dense subclass with its own call: its matmul of the concatenation is still fused (the dataflow decides)."""

    def call(self, inputs):
        return super().call(inputs) * 0.5


def _head_model(fields, head: str):
    inputs = {f.name: tf.keras.Input((), dtype=tf.int64, name=f.name) for f in fields}
    dense = tf.keras.Input((3,), name="dense_in")
    embs = [tf.keras.layers.Embedding(f.vocab, f.dim, name=f"emb_{f.name}")(inputs[f.name]) for f in fields]
    x = tf.keras.layers.Concatenate(name="cat")([*embs, dense])
    if head == "scaled":  # the Dense input is computed from the concatenation: not fused
        h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(tf.keras.layers.Rescaling(2.0)(x))
    elif head == "subclass":
        h = _ScaledDense(8, activation="relu", name="hidden")(x)
    else:  # "shared": the concatenation also feeds another layer; Dense without bias, linear
        h = tf.keras.layers.Dense(8, use_bias=False, name="hidden")(x)
        h = tf.keras.layers.Add()([h, tf.keras.layers.Dense(8, name="side")(tf.keras.layers.Lambda(tf.sin)(x))])
    return tf.keras.Model({**inputs, "dense_in": dense}, tf.keras.layers.Dense(1, activation="sigmoid", name="out")(h))


@pytest.mark.parametrize("head", ["scaled", "subclass", "shared"])
def test_unfusable_heads_and_shared_concat_stay_exact(head):
    fields = ctr_data.criteo_like_fields(dim=8, max_vocab=300)[:5]
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(30):
        x = {f.name: rng.integers(0, f.vocab, size=BATCH) for f in fields}
        x["dense_in"] = rng.standard_normal((BATCH, 3)).astype(np.float32)
        batches.append(({k: tf.constant(v) for k, v in x.items()}, tf.constant(rng.integers(0, 2, BATCH))))
    tf.keras.utils.set_random_seed(1)
    plain = _head_model(fields, head)
    tf.keras.utils.set_random_seed(1)
    fused = htf.keras.optimize(_head_model(fields, head))
    np.testing.assert_allclose(
        _train(fused, tf.keras.optimizers.Adagrad(0.05), batches),
        _train(plain, tf.keras.optimizers.Adagrad(0.05), batches),
        rtol=1e-5,
        atol=0,
    )
    assert fused.hybridtf_fused_dense == ([] if head == "scaled" else ["hidden"])


def test_report_names_fused_dense_layers(data):
    fields, batches = data
    model = ctr_models.wide_and_deep(fields, 3, hidden=(16, 8), seed=4)
    model(batches[0][0])
    model = htf.keras.optimize(model)
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    r = htf.report.report(model, batches[0])
    assert r.fused_dense == ("deep_0",)
    assert "StitchConcatMatMul): deep_0" in str(r)
    assert htf.report.Report.from_json(r.to_json()) == r


class _GradientPenalty(tf.keras.Model):
    """Double backprop: the loss adds the squared gradient of the loss with respect to a dense input."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner.watch(x["d"])
                loss = self.compiled_loss(y, self(x, training=True))
            total = loss + 100.0 * tf.reduce_sum(tf.square(inner.gradient(loss, x["d"])))
        grads = outer.gradient(total, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": total}


def test_a_second_order_gradient_through_a_fused_op_is_refused_with_the_fix():
    """Never a silent zero: the fused ops' gradients have no gradient; without the fusions the step is exact."""
    L = tf.keras.layers

    def build():
        tf.keras.utils.set_random_seed(0)
        a, d = tf.keras.Input((1,), dtype="int32", name="a"), tf.keras.Input((1,), name="d")
        b = tf.keras.Input((1,), dtype="int32", name="b")
        parts = [L.Flatten()(L.Embedding(20, 4)(a)), L.Flatten()(L.Embedding(30, 4)(b)), d]
        h = L.Dense(8, activation="tanh")(L.Concatenate()(parts))
        return _GradientPenalty({"a": a, "b": b, "d": d}, L.Dense(1, activation="sigmoid")(h))

    rng = np.random.default_rng(0)
    x = {"a": rng.integers(0, 20, (32, 1)), "b": rng.integers(0, 30, (32, 1)), "d": rng.normal(size=(32, 1))}
    x = {k: v.astype("int32" if k != "d" else "float32") for k, v in x.items()}
    y = rng.integers(0, 2, (32, 1)).astype("float32")
    fused = htf.keras.optimize(build())
    fused.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    with pytest.raises(SecondOrderGradientError, match=r"second-order gradient") as raised:  # its own class
        fused.train_on_batch(x, y)
    assert "fuse_concat=False" in str(raised.value)
    losses = []
    for model in (build(), htf.keras.optimize(build(), fuse_concat=False)):
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="binary_crossentropy")
        losses.append([model.train_on_batch(x, y) for _ in range(4)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


@pytest.mark.parametrize(
    "units, fuse_dense, fused", [(64, True, True), (65, True, False), (256, True, False), (256, "always", True)]
)
def test_wide_first_layers_keep_tensorflows_matmul_unless_asked(data, units, fuse_dense, fused):
    """The fused product is memory-bound in its output rows: by default only up to 64 units (measured)."""
    fields, batches = data
    build = lambda: ctr_models.wide_and_deep(fields, 3, hidden=(units, 8), seed=4)  # noqa: E731
    plain, model = build(), build()
    model(batches[0][0])
    model = htf.keras.optimize(model, fuse_dense=fuse_dense)
    losses = _train(model, OPTIMIZERS["adagrad"](), batches[:5])
    np.testing.assert_allclose(losses, _train(plain, OPTIMIZERS["adagrad"](), batches[:5]), rtol=1e-5)
    assert (model.hybridtf_fused_dense == ["deep_0"]) == fused and model.hybridtf_fused_concats


def test_fuse_dense_takes_true_false_or_always():
    with pytest.raises(ValueError, match="fuse_dense must be True, False or 'always'"):
        htf.keras.optimize(fuse_dense="auto")
