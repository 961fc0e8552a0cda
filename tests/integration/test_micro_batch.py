"""D-interleaving exactness: micro-batched steps train like whole-batch steps.

Small W&D and DLRM models defined here (same seeds, same batches). Per-step
losses of ``optimize(model)`` and ``optimize(model, micro_batches=N,
interleave_from=...)`` agree within 1e-5 relative (fp32), for Adagrad and Adam,
2 and 4 micro-batches, from the embedding layer and from the MLP. Also: sample
weights and a sum-reduced loss, a batch that does not divide evenly, one fused
update per packed table per step, dynamic tables (packed and not, flushes
during the run), and the refusals (BatchNormalization, activity regularizers).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

FIELDS = [("f0", 50), ("f1", 80), ("f2", 30), ("f3", 120), ("f4", 40)]
DIM = 8
N_DENSE = 3
BATCH = 64
STEPS = 20


def _inputs():
    ids = {name: tf.keras.Input((1,), dtype=tf.int64, name=name) for name, _ in FIELDS}
    dense = tf.keras.Input((N_DENSE,), name="dense_features")
    return ids, dense


def _init(seed):
    return tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)


def wide_and_deep(seed=3, batch_norm=False, activity=False, kernel_l2=None):
    ids, dense = _inputs()
    wide = [
        tf.keras.layers.Embedding(n, 1, embeddings_initializer=_init(seed + i), name=f"wide_{f}")
        for i, (f, n) in enumerate(FIELDS)
    ]
    deep = [
        tf.keras.layers.Embedding(n, DIM, embeddings_initializer=_init(seed + 50 + i), name=f"deep_{f}")
        for i, (f, n) in enumerate(FIELDS)
    ]
    w = tf.keras.layers.Add()([tf.keras.layers.Flatten()(layer(ids[f])) for layer, (f, _) in zip(wide, FIELDS)])
    x = tf.keras.layers.Concatenate()(
        [tf.keras.layers.Flatten()(layer(ids[f])) for layer, (f, _) in zip(deep, FIELDS)] + [dense]
    )
    for j, units in enumerate((16, 8)):
        x = tf.keras.layers.Dense(
            units,
            "relu",
            name=f"hidden_{j}",
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 100 + j),
            activity_regularizer="l2" if activity and j == 0 else None,
            kernel_regularizer=tf.keras.regularizers.l2(kernel_l2) if kernel_l2 else None,
        )(x)
        if batch_norm:  # "inference": called with training=False, moving statistics only
            norm = tf.keras.layers.experimental.SyncBatchNormalization if batch_norm == "sync" else None
            norm = (norm or tf.keras.layers.BatchNormalization)()
            x = norm(x, **({"training": False} if batch_norm == "inference" else {}))
    x = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 200))(x)
    out = tf.keras.layers.Activation("sigmoid")(tf.keras.layers.Add()([x, w]))
    return tf.keras.Model({**ids, "dense_features": dense}, out)


def dlrm(seed=5):
    ids, dense = _inputs()
    bottom = tf.keras.layers.Dense(DIM, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed))(dense)
    embs = [
        tf.keras.layers.Flatten()(
            tf.keras.layers.Embedding(n, DIM, embeddings_initializer=_init(seed + i), name=f"emb_{f}")(ids[f])
        )
        for i, (f, n) in enumerate(FIELDS)
    ]
    stacked = tf.keras.layers.Lambda(lambda t: tf.stack(t, axis=1))([bottom, *embs])  # [B, F + 1, D]
    dots = tf.keras.layers.Lambda(lambda s: tf.matmul(s, s, transpose_b=True))(stacked)
    n = len(embs) + 1
    rows, cols = np.triu_indices(n, 1)
    flat_pairs = (rows * n + cols).tolist()
    pairs = tf.keras.layers.Lambda(lambda d: tf.gather(tf.reshape(d, [-1, n * n]), flat_pairs, axis=1))(dots)
    x = tf.keras.layers.Concatenate()([bottom, pairs])
    for j, units in enumerate((16, 8)):
        x = tf.keras.layers.Dense(
            units, "relu", name=f"hidden_{j}", kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 100 + j)
        )(x)
    out = tf.keras.layers.Dense(1, "sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 200))(x)
    return tf.keras.Model({**ids, "dense_features": dense}, out)


BUILDERS = {"wdl": wide_and_deep, "dlrm": dlrm}
OPTIMIZERS = {"adagrad": lambda: tf.keras.optimizers.Adagrad(0.05), "adam": lambda: tf.keras.optimizers.Adam(0.01)}


def _batches(steps=STEPS, batch=BATCH, seed=11):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        x = {f: tf.constant(np.minimum(rng.zipf(1.3, (batch, 1)) - 1, n - 1).astype(np.int64)) for f, n in FIELDS}
        x["dense_features"] = tf.constant(rng.normal(size=(batch, N_DENSE)).astype(np.float32))
        y = tf.constant((rng.random((batch, 1)) < 0.3).astype(np.float32))
        out.append((x, y))
    return out


def _losses(build, optimizer, batches, loss="binary_crossentropy", weights=None, **options):
    model = build()
    model(batches[0][0])
    model = htf.keras.optimize(model, **options)
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss=loss)
    out = []
    for i, (x, y) in enumerate(batches):
        out.append(model.train_on_batch(x, y, sample_weight=None if weights is None else weights[i]))
    return np.array(out), model


@pytest.fixture(scope="module")
def batches():
    return _batches()


_REFERENCE: dict = {}


@pytest.fixture(scope="module")
def reference(batches):
    def get(model_name, optimizer):
        if (model_name, optimizer) not in _REFERENCE:
            _REFERENCE[model_name, optimizer] = _losses(BUILDERS[model_name], optimizer, batches)[0]
        return _REFERENCE[model_name, optimizer]

    return get


# Every model x optimizer x N x mode; two combinations that cover each value run by default, the rest are slow.
FAST = {("wdl", "adagrad", 2, "embedding"), ("dlrm", "adam", 4, "mlp")}
MATRIX = [
    pytest.param(m, o, n, mode, marks=() if (m, o, n, mode) in FAST else pytest.mark.slow)
    for m in sorted(BUILDERS)
    for o in sorted(OPTIMIZERS)
    for n in (2, 4)
    for mode in ("embedding", "mlp")
]


@pytest.mark.parametrize("model_name, optimizer, n, mode", MATRIX)
def test_micro_batched_losses_match_whole_batch(model_name, optimizer, n, mode, batches, reference):
    losses, model = _losses(BUILDERS[model_name], optimizer, batches, micro_batches=n, interleave_from=mode)
    assert model.hybridtf_interleaving.micro.num_micro_batches == n
    np.testing.assert_allclose(losses, reference(model_name, optimizer), rtol=1e-5, atol=0)


def _uneven(steps=5):
    batches = _batches(steps=steps, batch=37, seed=5)  # 37 = 10 + 9 + 9 + 9
    rng = np.random.default_rng(2)
    return batches, [tf.constant(rng.random(37).astype(np.float32)) for _ in batches]


def test_uneven_batch_with_sample_weights():
    batches, weights = _uneven()
    whole, _ = _losses(wide_and_deep, "adagrad", batches, weights=weights)
    for mode in ("embedding", "mlp", "mlp_fused"):
        micro, _ = _losses(wide_and_deep, "adagrad", batches, weights=weights, micro_batches=4, interleave_from=mode)
        np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)


def test_sum_reduction_weights_every_micro_batch_one():
    batches, _ = _uneven()
    loss = tf.keras.losses.BinaryCrossentropy(reduction="sum")
    _, whole_model = _losses(wide_and_deep, "adagrad", batches, loss=loss)
    _, micro_model = _losses(wide_and_deep, "adagrad", batches, loss=loss, micro_batches=4)
    for a, b in zip(whole_model.get_weights(), micro_model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_sum_reduction_counts_a_weight_regularizer_once():
    """Each micro-batch's loss held the whole regularizer, weighted 1: it counted N times (weights off by up to 21)."""
    batches, _ = _uneven()
    loss = tf.keras.losses.BinaryCrossentropy(reduction="sum")

    def build():
        return wide_and_deep(kernel_l2=0.5)

    _, whole_model = _losses(build, "adagrad", batches, loss=loss)
    for mode in ("embedding", "mlp", "hidden_1"):
        _, micro_model = _losses(build, "adagrad", batches, loss=loss, micro_batches=4, interleave_from=mode)
        for a, b in zip(whole_model.get_weights(), micro_model.get_weights()):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=mode)


def test_losses_mixing_sums_and_means_over_outputs_are_refused():
    """One weight per micro-batch cannot serve a sum and a mean: the step's gradient was off (by up to 11)."""
    ids, dense = _inputs()
    x = tf.keras.layers.Concatenate()(
        [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(n, 4)(ids[f])) for f, n in FIELDS] + [dense]
    )
    model = tf.keras.Model(
        {**ids, "dense_features": dense}, {"a": tf.keras.layers.Dense(1)(x), "b": tf.keras.layers.Dense(1)(x)}
    )
    model = htf.keras.optimize(model, micro_batches=2)
    model.compile("sgd", loss={"a": tf.keras.losses.MeanSquaredError(reduction="sum"), "b": "mse"})
    x0, y0 = _batches(steps=1)[0]
    with pytest.raises(ValueError, match="mix reduction='sum' and means over the batch"):
        model.train_on_batch(x0, {"a": y0, "b": y0})


def test_a_loss_scale_optimizer_scales_each_micro_batchs_loss():
    """Its scale was skipped: under mixed_float16 small float16 gradients underflowed to zero (and a float16
    loss failed to multiply by the float32 weight)."""
    batches = _batches(steps=1, batch=16)
    changed = []
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        for n in (1, 2):
            model = htf.keras.optimize(wide_and_deep(), micro_batches=n)
            tiny = lambda y, p: 1e-5 * tf.keras.losses.binary_crossentropy(y, p)  # noqa: E731
            model.compile(optimizer=tf.keras.optimizers.SGD(1.0), loss=tiny)
            before = model.get_layer("hidden_0").kernel.numpy().copy()
            model.train_on_batch(*batches[0])
            changed.append(float(np.mean(model.get_layer("hidden_0").kernel.numpy() != before)))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert changed[0] > 0.2 and changed[1] >= 0.9 * changed[0], changed


def test_one_fused_update_per_packed_table(batches):
    from tests.integration.step_ops import step_op_types

    _, model = _losses(wide_and_deep, "adagrad", batches[:1], micro_batches=4, interleave_from="embedding")
    types = step_op_types(model, batches[:1])
    packed = len(model.hybridtf_plan.packed_tables)
    assert types.count("HybridTF>SparseApplyAdagrad") == packed
    assert types.count("HybridTF>UniquePartition") >= 4  # a chain per micro-batch


def test_batch_dependent_layers_are_refused():
    model = wide_and_deep(batch_norm=True)
    with pytest.raises(ValueError, match="BatchNormalization"):
        htf.keras.optimize(model, micro_batches=2)
    model = wide_and_deep(batch_norm="sync")  # not a BatchNormalization subclass in Keras 2.15
    with pytest.raises(ValueError, match="sync_batch_normalization' is a BatchNormalization"):
        htf.keras.optimize(model, micro_batches=2)
    model = wide_and_deep(activity=True)
    with pytest.raises(ValueError, match="activity regularizer"):
        htf.keras.optimize(model, micro_batches=2)
    with pytest.raises(ValueError, match=r"neither a mode .* nor the name of a layer"):
        htf.keras.optimize(wide_and_deep(), micro_batches=2, interleave_from="nowhere")
    with pytest.raises(ValueError, match="micro_batches"):
        htf.keras.optimize(wide_and_deep(), micro_batches=0)
    # one micro-batch: BatchNormalization is fine (the whole batch)
    assert htf.keras.is_optimized(htf.keras.optimize(wide_and_deep(batch_norm=True), micro_batches=1))


def test_a_batch_norm_called_with_training_false_is_accepted_and_exact(batches):
    # it normalizes with its moving statistics, per example: micro-batches change nothing
    plain = wide_and_deep(batch_norm="inference")
    plain.compile(optimizer=OPTIMIZERS["adagrad"](), loss="binary_crossentropy")
    want = [plain.train_on_batch(x, y) for x, y in batches[:8]]
    got, _ = _losses(lambda: wide_and_deep(batch_norm="inference"), "adagrad", batches[:8], micro_batches=2)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"micro_batches": True}, "micro_batches must be an int"),
        ({"interleave_groups": True}, "interleave_groups must be"),
        ({"micro_batches": "auto", "micro_batch_memory": 0}, "micro_batch_memory must be a positive number"),
        ({"micro_batches": "auto", "micro_batch_memory": float("nan")}, "micro_batch_memory must be a positive"),
        ({"interleave_groups": "auto", "interleave_scale": -1}, "interleave_scale must be a positive number"),
    ],
)
def test_bad_interleaving_values_are_refused_at_optimize(options, match):
    with pytest.raises(ValueError, match=match):
        htf.keras.optimize(wide_and_deep(), **options)


def _dynamic_model(seed=7):
    """Two packed DynamicEmbedding fields (one a bag of two ids), one with other settings (its own store, not
    packed), a static table, and flushes of the hot tier during the run."""
    ids = {f: tf.keras.Input((1,), dtype=tf.int64, name=f) for f in ("f0", "f1", "f3")}
    bag = tf.keras.Input((2,), dtype=tf.int64, name="f2")
    table = dict(hot_rows=6, warmup_steps=2, flush_every=3)
    feats = [
        htf.layers.DynamicEmbedding(DIM, seed=seed, name="dyn_a", **table)(ids["f0"]),
        htf.layers.DynamicEmbedding(DIM, combiner="mean", seed=seed + 1, name="dyn_bag", **table)(bag),
        htf.layers.DynamicEmbedding(DIM, hot_rows=5, warmup_steps=1, flush_every=2, seed=seed + 2, name="dyn_own")(
            ids["f1"]
        ),
        tf.keras.layers.Embedding(120, DIM, embeddings_initializer=_init(seed + 3), name="static")(ids["f3"]),
    ]
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(f) for f in feats])
    x = tf.keras.layers.Dense(8, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed))(x)
    out = tf.keras.layers.Dense(1, "sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 1))(x)
    return tf.keras.Model({**ids, "f2": bag}, out)


def _dynamic_batches(steps=12, batch=37, seed=4):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        draw = lambda shape, n: np.minimum(rng.zipf(1.3, shape) - 1, n - 1).astype(np.int64)  # noqa: E731
        x = {"f0": draw((batch, 1), 60), "f1": draw((batch, 1), 90) * 7919, "f2": draw((batch, 2), 50)}
        x["f3"] = draw((batch, 1), 120)
        y = (rng.random((batch, 1)) < 0.3).astype(np.float32)
        out.append(({k: tf.constant(v) for k, v in x.items()}, tf.constant(y)))
    return out


def _dynamic_losses(optimizer, batches, **options):
    model = htf.keras.optimize(_dynamic_model(), **options)
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches]), model


def _tables(model):
    out = {}
    for name in ("dyn_a", "dyn_bag", "dyn_own"):
        ids, rows = (t.numpy() for t in model.get_layer(name).table.export()[:2])
        order = np.argsort(ids)
        out[name] = ids[order], rows[order]
    return out


@pytest.mark.parametrize(
    "optimizer, n, mode",
    [
        ("adagrad", 3, "embedding"),
        ("adam", 2, "embedding"),
        pytest.param("adagrad", 4, "mlp", marks=pytest.mark.slow),
        pytest.param("adam", 3, "mlp_fused", marks=pytest.mark.slow),
    ],
)
def test_dynamic_tables_micro_batched_train_like_the_whole_batch(optimizer, n, mode):
    """Each micro-batch's lookup appends to the store's distinct-rows buffer; one update per store and step."""
    batches = _dynamic_batches()
    whole, whole_model = _dynamic_losses(optimizer, batches)
    micro, micro_model = _dynamic_losses(optimizer, batches, micro_batches=n, interleave_from=mode)
    assert [p.members for p in micro_model.hybridtf_dynamic_plan] == [("dyn_a", "dyn_bag")]
    np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)
    want, got = _tables(whole_model), _tables(micro_model)
    for name in want:
        np.testing.assert_array_equal(got[name][0], want[name][0])
        np.testing.assert_allclose(got[name][1], want[name][1], rtol=1e-5, atol=1e-7)
    stats = micro_model.get_layer("dyn_a").stats()
    assert stats["size"] == whole_model.get_layer("dyn_a").stats()["size"] and stats["step"] == len(batches)


def test_unpacked_dynamic_layers_micro_batched_train_like_the_whole_batch():
    """Unwrapped layers too (a plain Keras model wrapped with exclude= every table: each layer its own store)."""
    batches = _dynamic_batches(steps=6)
    exclude = ["dyn_a", "dyn_bag", "dyn_own", "static"]
    whole, _ = _dynamic_losses("adagrad", batches, exclude=exclude)
    micro, model = _dynamic_losses("adagrad", batches, exclude=exclude, micro_batches=3)
    assert not model.hybridtf_dynamic_plan and model.hybridtf_interleaving.micro.num_micro_batches == 3
    assert str(model.hybridtf_interleaving).startswith("InterleavingPlan: no K-interleaving groups")
    np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)


def test_dynamic_tables_micro_batched_with_a_loss_scale_train_like_the_whole_batch():
    """A LossScaleOptimizer applies in a tf.cond branch: the update there still sums the micro-batches' rows."""
    batches = _dynamic_batches(steps=4)
    losses = []
    for n in (1, 2):
        model = htf.keras.optimize(_dynamic_model(), micro_batches=n)
        scaled = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam(0.01), initial_scale=2.0**4)
        model.compile(optimizer=scaled, loss="binary_crossentropy")
        losses.append([model.train_on_batch(x, y) for x, y in batches])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)


def test_a_dynamic_table_with_a_capacity_is_refused_with_micro_batches():
    """Eviction spares the rows the step used so far: a micro-batch's inserts could evict the next one's rows."""
    ids = tf.keras.Input((1,), dtype=tf.int64)
    emb = htf.layers.DynamicEmbedding(DIM, capacity=100, name="capped")(ids)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(emb)))
    with pytest.raises(ValueError, match=r"'capped' has a capacity \(eviction\).*capacity=0.*micro_batches=1"):
        htf.keras.optimize(model, micro_batches=2)


def test_one_fused_update_per_dynamic_store_and_step():
    from tests.integration.step_ops import step_op_types

    batches = _dynamic_batches(steps=1)
    _, model = _dynamic_losses("adagrad", batches, micro_batches=3)
    types = step_op_types(model, batches)
    assert types.count("HybridTF>HybridHashApplyAdagradRecords") == 1  # the packed store
    assert types.count("HybridTF>HybridHashApplyAdagrad") == 1  # dyn_own's own store
    assert types.count("HybridTF>HybridHashLookupRecords") == 3  # a lookup per micro-batch


def test_a_batch_norm_unfrozen_after_optimize_is_refused_when_fit_starts(batches):
    """Frozen, it is accepted; unfrozen afterwards it would normalize each micro-batch with its own statistics."""
    model = wide_and_deep(batch_norm=True)
    norms = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.BatchNormalization)]
    for layer in norms:
        layer.trainable = False
    model = htf.keras.optimize(model, micro_batches=2)
    norms[0].trainable = True
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    with pytest.raises(ValueError, match=rf"layer {norms[0].name!r} is a BatchNormalization"):
        model.fit(*batches[0], verbose=0)
    norms[0].trainable = False
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    model.fit(*batches[0], verbose=0)


class _Dice(tf.keras.layers.Layer):
    """A Dice-like activation that builds its own BatchNormalization (as DeepCTR's Dice inside DIN's attention)."""

    def build(self, input_shape):
        self.norm = tf.keras.layers.BatchNormalization(name="batch_normalization")

    def call(self, x, training=None):
        p = tf.sigmoid(self.norm(x, training=training))
        return p * x + (1 - p) * 0.25 * x


def test_a_batch_norm_inside_another_layer_is_named_by_its_owner():
    ids = tf.keras.Input((2,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(50, 4)(ids))
    out = tf.keras.layers.Dense(1)(_Dice(name="attention_dice")(tf.keras.layers.Dense(4)(h)))
    with pytest.raises(ValueError, match=r"layer 'attention_dice' > 'batch_normalization' is a BatchNormalization"):
        htf.keras.optimize(tf.keras.Model(ids, out), micro_batches=2)


@pytest.mark.parametrize("layer", ["hidden_0", "hidden_1"])
def test_from_a_named_layer(layer, batches):
    """The model cut at a layer: lookups and the layers before it once, the rest per micro-batch."""
    whole, _ = _losses(wide_and_deep, "adam", batches[:8])
    micro, model = _losses(wide_and_deep, "adam", batches[:8], micro_batches=4, interleave_from=layer)
    head, tail = model._htf_split
    assert layer in [lyr.name for lyr in head.layers] and "hidden_0" in [lyr.name for lyr in head.layers]
    assert all(not lyr.name.startswith(("deep_", "wide_")) for lyr in tail.layers)  # lookups stay whole-batch
    np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)


def test_from_mlp_fused_keeps_the_dense_fusion(batches):
    """'mlp_fused': each micro-batch re-stitches the whole-batch chain's rows, so StitchConcatMatMul still runs."""
    from tests.integration.step_ops import pruned_op_types

    whole, whole_model = _losses(wide_and_deep, "adagrad", batches[:6])
    micro, model = _losses(wide_and_deep, "adagrad", batches[:6], micro_batches=3, interleave_from="mlp_fused")
    np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)
    assert model.hybridtf_fused_dense == whole_model.hybridtf_fused_dense != []
    dlrm_whole, _ = _losses(dlrm, "adam", batches[:6])
    dlrm_micro, _ = _losses(dlrm, "adam", batches[:6], micro_batches=4, interleave_from="mlp_fused")
    np.testing.assert_allclose(dlrm_micro, dlrm_whole, rtol=1e-5, atol=0)
    types, whole_types = pruned_op_types(model, batches[:1]), pruned_op_types(whole_model, batches[:1])
    assert types.count("HybridTF>StitchConcatMatMul") == 3 * whole_types.count("HybridTF>StitchConcatMatMul") > 0
    assert types.count("HybridTF>UniquePartition") == whole_types.count("HybridTF>UniquePartition")  # chains once


def _ragged_model(seed=7):
    """A Keras ``Embedding`` on ragged multi-hot ids, pooled by ``reduce_sum`` (its output is a RaggedTensor)."""
    ids, dense = _inputs()
    tags = tf.keras.Input((None,), dtype=tf.int64, ragged=True, name="tags")
    rows = tf.keras.layers.Embedding(40, DIM, embeddings_initializer=_init(seed), name="emb_tags")(tags)
    pooled = tf.keras.layers.Lambda(lambda r: tf.reduce_sum(r, axis=1))(rows)
    deep = [
        tf.keras.layers.Flatten()(
            tf.keras.layers.Embedding(n, DIM, embeddings_initializer=_init(seed + 1 + i), name=f"emb_{f}")(ids[f])
        )
        for i, (f, n) in enumerate(FIELDS)
    ]
    x = tf.keras.layers.Concatenate()([*deep, pooled, dense])
    x = tf.keras.layers.Dense(8, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 100))(x)
    out = tf.keras.layers.Dense(1, "sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 200))(x)
    return tf.keras.Model({**ids, "tags": tags, "dense_features": dense}, out)


@pytest.mark.parametrize("mode", ["embedding", "mlp", "mlp_fused"])
def test_ragged_embedding_output_micro_batched_from_every_layer(mode, batches):
    """The MLP modes take the ragged output's gradient at its values (they failed to watch the RaggedTensor)."""
    rng = np.random.default_rng(3)
    ragged = []
    for x, y in batches[:5]:
        lengths = rng.integers(0, 4, BATCH)
        tags = tf.RaggedTensor.from_row_lengths(rng.integers(0, 40, int(lengths.sum())), lengths)
        ragged.append(({**x, "tags": tags}, y))
    whole, _ = _losses(_ragged_model, "adam", ragged)
    micro, _ = _losses(_ragged_model, "adam", ragged, micro_batches=2, interleave_from=mode)
    np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)


def test_hybridtfs_own_step_classes_do_not_count_as_a_train_step_override():
    """Under Horovod the collective watchdog's run-time class wraps train_step: micro-batches named it the
    user's override (and hid the real reason, e.g. sharded dynamic tables)."""
    from hybridtf._src.integrations import horovod_hooks
    from hybridtf._src.rewrite.micro_batch import overrides_train_step

    model = wide_and_deep()
    horovod_hooks.guard_collectives(model)
    assert not overrides_train_step(model)

    class Custom(tf.keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    ids = tf.keras.Input((1,), dtype=tf.int64)
    custom = Custom(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(5, 2)(ids))))
    horovod_hooks.guard_collectives(custom)
    assert overrides_train_step(custom)
