"""Mixed precision (``mixed_float16`` with a LossScaleOptimizer, ``mixed_bfloat16``): tables pack, same math.

Under a mixed policy Keras's Embedding looks its float32 table up and casts the rows to the
compute dtype; a packed table does the same after its fused chain, so the forward pass is the
plain model's op for op after the lookups. The loss-scale wrapper unscales the gradients and
skips non-finite steps, then calls its inner optimizer, which hybridtf hooks (fused updates,
optimizer state in the plain model's layout in every save format).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

L = tf.keras.layers
FIELDS, VOCAB, BATCH = 4, 60, 32


@pytest.fixture(params=["mixed_float16", "mixed_bfloat16"])
def policy(request):
    # Fresh Keras layer names: float16 sums round with the order Grappler gives the adds, which follows the
    # ops' names, so a test would otherwise depend on how many layers earlier tests in its process made.
    tf.keras.backend.clear_session()
    tf.keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    tf.keras.mixed_precision.set_global_policy("float32")


def _batches(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            {f"f{i}": tf.constant(rng.integers(0, VOCAB, (BATCH, 1))) for i in range(FIELDS)},
            tf.constant(rng.integers(0, 2, (BATCH, 1)).astype(np.float32)),
        )
        for _ in range(steps)
    ]


def _model(policy, optimize, opt="adam"):
    tf.keras.utils.set_random_seed(7)
    inputs = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(FIELDS)]
    deep = L.Concatenate()([L.Flatten()(L.Embedding(VOCAB, 8)(x)) for x in inputs])
    wide = L.Add()([L.Flatten()(L.Embedding(VOCAB, 1)(x)) for x in inputs])
    logit = L.Add()([L.Dense(1)(L.Dense(16, "relu")(deep)), wide])
    model = tf.keras.Model(inputs, L.Activation("sigmoid", dtype="float32")(logit))
    if optimize:
        model = htf.keras.optimize(model)
    inner = tf.keras.optimizers.Adam(0.01) if opt == "adam" else tf.keras.optimizers.Adagrad(0.05)
    optimizer = tf.keras.mixed_precision.LossScaleOptimizer(inner) if policy == "mixed_float16" else inner
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return model


def _train(model, batches):
    return np.array([model.train_on_batch(x, y) for x, y in batches])


@pytest.mark.parametrize("opt", ["adam", "adagrad"])
def test_tables_pack_and_train_as_the_plain_model(policy, opt):
    batches = _batches(20)
    plain = _model(policy, False, opt)
    packed = _model(policy, True, opt)
    assert packed.hybridtf_skipped == []
    assert len(packed.hybridtf_plan.packed_tables) == 2  # dims 8 and 1
    assert packed(batches[0][0]).dtype == tf.float32
    np.testing.assert_allclose(_train(packed, batches), _train(plain, batches), rtol=1e-5, atol=0)
    tables = [[layer.get_weights()[0] for layer in m.layers if isinstance(layer, L.Embedding)] for m in (packed, plain)]
    for got, want in zip(*tables):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_keras_file_and_checkpoint_resume_exactly(policy, tmp_path):
    batches = _batches(16, seed=1)
    uninterrupted = _model(policy, True)
    expected = _train(uninterrupted, batches)

    first = _model(policy, True)
    _train(first, batches[:8])
    first.save(tmp_path / "m.keras")
    ckpt = tf.train.Checkpoint(model=first, optimizer=first.optimizer).save(str(tmp_path / "ckpt"))

    loaded = tf.keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(_train(loaded, batches[8:]), expected[8:], rtol=1e-6, atol=0)

    restored = _model(policy, True)
    restored(batches[0][0])
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(ckpt).expect_partial()
    np.testing.assert_allclose(_train(restored, batches[8:]), expected[8:], rtol=1e-6, atol=0)


def test_plain_keras_file_loads_into_the_optimized_model(policy, tmp_path):
    """The optimizer state of the plain model's file goes to the packed tables' slots, per table."""
    batches = _batches(12, seed=2)
    plain = _model(policy, False)
    _train(plain, batches[:6])
    plain.save(tmp_path / "plain.keras")
    expected = _train(plain, batches[6:])

    packed = _model(policy, True)
    packed.load_weights(tmp_path / "plain.keras")
    np.testing.assert_allclose(_train(packed, batches[6:]), expected, rtol=1e-5, atol=0)


def _dynamic_model(optimize, wrap_order):
    tf.keras.utils.set_random_seed(3)
    inputs = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(FIELDS)]
    rows = [
        L.Flatten()(htf.layers.DynamicEmbedding(8, hot_rows=40, warmup_steps=2, flush_every=3, name=f"d{i}")(x))
        for i, x in enumerate(inputs)
    ]
    model = tf.keras.Model(inputs, L.Dense(1, "sigmoid", dtype="float32")(L.Dense(8, "relu")(L.Concatenate()(rows))))
    if optimize:
        model = htf.keras.optimize(model)
    wrap = tf.keras.mixed_precision.LossScaleOptimizer
    if wrap_order == "outside":  # dynamic_optimizer of the wrapper hooks its inner optimizer
        optimizer = htf.keras.dynamic_optimizer(wrap(tf.keras.optimizers.Adam(0.01)))
    else:
        optimizer = wrap(htf.keras.dynamic_optimizer(tf.keras.optimizers.Adam(0.01)))
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return model


def test_dynamic_tables_train_under_a_loss_scale_optimizer():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        batches = _batches(12, seed=3)
        expected = _train(_dynamic_model(False, "inside"), batches)
        for optimize in (False, True):
            for order in ("outside", "inside"):
                np.testing.assert_allclose(
                    _train(_dynamic_model(optimize, order), batches), expected, rtol=1e-5, atol=0
                )
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_embedding_bags_give_the_compute_dtype(policy):
    """A packed EmbeddingBag casts its pooled rows as the unpacked one does, so raw TF ops on them still match."""
    rng = np.random.default_rng(4)
    batches = [
        (
            {
                "bag": tf.constant(rng.integers(0, VOCAB, (BATCH, 3))),
                "one": tf.constant(rng.integers(0, VOCAB, (BATCH, 1))),
            },
            tf.constant(rng.integers(0, 2, (BATCH, 1)).astype(np.float32)),
        )
        for _ in range(8)
    ]
    losses = []
    for optimize in (False, True):
        tf.keras.utils.set_random_seed(9)
        bag_in = tf.keras.Input((3,), dtype=tf.int64, name="bag")
        one_in = tf.keras.Input((1,), dtype=tf.int64, name="one")
        pooled = htf.layers.EmbeddingBag(VOCAB, 4, combiner="mean")(bag_in)
        joined = tf.concat([pooled, L.Flatten()(L.Embedding(VOCAB, 4)(one_in))], -1)  # needs equal dtypes
        model = tf.keras.Model([bag_in, one_in], L.Dense(1, "sigmoid", dtype="float32")(joined))
        if optimize:
            model = htf.keras.optimize(model)
            assert model.hybridtf_skipped == []
        inner = tf.keras.optimizers.Adagrad(0.05)
        model.compile(
            optimizer=tf.keras.mixed_precision.LossScaleOptimizer(inner) if policy == "mixed_float16" else inner,
            loss="binary_crossentropy",
        )
        losses.append(_train(model, batches))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)


def test_estimator_model_fn_packs_under_a_mixed_policy(tmp_path):
    """The Estimator wrapper packs the Keras Embedding and EmbeddingBag tables of a mixed_bfloat16 model_fn
    (EmbeddingBag's table is not an autocast variable, as Keras's Embedding's is not)."""
    from tests.integration import test_estimator as est

    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        _, plain = est._train(est.wdl_model_fn, tmp_path / "plain", 30)
        hooks = htf.estimator.hooks(every_n_steps=10, log_fn=lambda line: None)
        _, wrapped = est._train(htf.estimator.model_fn(est.wdl_model_fn), tmp_path / "wrapped", 30, hooks)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    report = hooks[0].report
    assert report.packed_lookups == 2 * est.FIELDS + 1  # every deep, wide and bag lookup
    assert report.plan.num_lookup_chains == 2
    np.testing.assert_allclose(wrapped, plain, rtol=1e-5, atol=0)
