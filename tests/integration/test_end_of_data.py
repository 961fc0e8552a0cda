"""The step that finds the end of a dataset of unknown length changes Adam's moments as in the plain model.

Keras learns where an epoch of a ``TFRecordDataset`` / ``filter`` / generator ends by running one more step,
which fails for want of a batch; TensorFlow still runs the ops of that step that need no data, and Keras Adam's
sparse update begins with a decay of the whole table's moments. The fused update needs the gradient, so hybridtf
applies that decay itself when the data runs out (``keras_end_of_data``); without it the optimized model trained
apart from the plain one from the second epoch on (0.07 in the weights after 4 epochs, found by a probe).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.capture.subclassing import PlainConstruction, runtime_subclass

B, BATCHES, EPOCHS = 32, 6, 3
VOCABS = {"a": 40, "b": 30, "c": 20}


def _data():
    rng = np.random.default_rng(0)
    n = B * BATCHES
    x = {k: rng.integers(0, v, (n, 1)) for k, v in VOCABS.items()}
    return x, rng.integers(0, 2, (n, 1)).astype("float32")


def _model(variant="plain"):
    tf.keras.utils.set_random_seed(0)
    inputs = {k: tf.keras.Input((1,), dtype="int64", name=k) for k in VOCABS}
    regularized = {"regularized": "abc", "mixed": "a"}.get(variant, "")  # mixed: a and c share b's variable
    embs = [
        tf.keras.layers.Flatten()(
            tf.keras.layers.Embedding(
                v, 4, name=f"e{k}", embeddings_regularizer=tf.keras.regularizers.l2(1e-3) if k in regularized else None
            )(inputs[k])
        )
        for k, v in VOCABS.items()
    ]
    if variant == "stop_gradient":  # table c gets no gradient: the plain model neither decays nor updates it
        embs[2] = tf.keras.layers.Lambda(tf.stop_gradient)(embs[2])
    h = tf.keras.layers.Dense(8, "relu")(tf.keras.layers.Concatenate()(embs))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1, "sigmoid")(h))


def _batches(source):
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
    if source == "filter":  # length unknown to Keras, as a TFRecordDataset's
        return dataset.filter(lambda *_: True)

    def generator():
        for i in range(BATCHES):
            yield {k: v[i * B : (i + 1) * B] for k, v in x.items()}, y[i * B : (i + 1) * B]

    return generator()


class _OuterStepWrapper(PlainConstruction):
    """Wraps the train function outside hybridtf's, as Horovod's collective guard does (a plain function)."""

    def make_train_function(self, force=False):
        function = super().make_train_function(force)
        if getattr(function, "_outer", False):
            return function

        def step(iterator):
            return function(iterator)

        step._outer = True
        return step


def _train(optimize, source="filter", variant="plain", optimizer=None, outer=False, **options):
    model = _model(variant)
    if optimize:
        model = htf.keras.optimize(model, **options)
        assert len(model.hybridtf_plan.packed_tables) == 1  # the three tables share one variable
    if outer:  # each fit's make_train_function returns the outer function: it was wrapped again, decayed twice
        model.__class__ = runtime_subclass(_OuterStepWrapper, type(model))
    model.compile(optimizer=(optimizer or (lambda: tf.keras.optimizers.Adam(0.02)))(), loss="binary_crossentropy")
    losses = []
    for _ in range(EPOCHS):  # a fresh generator each epoch; the dataset's length is learned in its first epoch
        losses += model.fit(_batches(source), epochs=1, verbose=0).history["loss"]
    tables = {k: model.get_layer(f"e{k}").get_weights()[0] for k in VOCABS}
    return np.array(losses), tables, int(model.optimizer.iterations)


def _same(packed, plain):
    np.testing.assert_allclose(packed[0], plain[0], rtol=1e-5)
    for k in VOCABS:
        np.testing.assert_allclose(packed[1][k], plain[1][k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert packed[2] == plain[2]


@pytest.mark.parametrize("source", ["filter", "generator"])
def test_adam_at_the_end_of_data_of_unknown_length_matches_the_plain_model(source):
    plain = _train(False, source)
    assert plain[2] == EPOCHS * (BATCHES + 1)  # each fit ended with a step that found no batch
    _same(_train(True, source), plain)


@pytest.mark.parametrize("variant", ["stop_gradient", "regularized", "mixed"])
def test_end_of_data_decays_only_what_the_plain_model_decays(variant):
    """A table without gradient is not decayed; a regularized table's plain gradient is dense: it is not decayed,
    while the unregularized tables packed with it are."""
    plain = _train(False, variant=variant)
    _same(_train(True, variant=variant), plain)
    if variant == "stop_gradient":
        np.testing.assert_array_equal(plain[1]["c"], _model().get_layer("ec").get_weights()[0])


def test_end_of_data_with_micro_batches_and_with_lazy_adam():
    _same(_train(True, micro_batches=2), _train(False))
    lazy = lambda: htf.keras.LazyAdam(0.02)  # noqa: E731  (touches looked-up rows only: no data-free op)
    _same(_train(True, optimizer=lazy), _train(False, optimizer=lazy))


def test_end_of_data_decays_once_under_a_train_function_wrapped_outside_hybridtfs():
    _same(_train(True, outer=True), _train(False, outer=True))


def _dynamic_pair(wrapped=True):
    """A model of DynamicEmbedding fields (packed into one store by optimize) and the plain model whose Embedding
    rows start at the same per-id rows."""
    dynamic = {
        k: htf.layers.DynamicEmbedding(4, name=f"d{k}", hot_rows=8, warmup_steps=2, flush_every=3) for k in VOCABS
    }

    def build(tables, name):
        inputs = {k: tf.keras.Input((1,), dtype="int64", name=k) for k in VOCABS}
        embs = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(tables[k](inputs[k])) for k in VOCABS])
        h = tf.keras.layers.Dense(8, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(embs)
        out = tf.keras.layers.Dense(1, "sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(4))(h)
        return tf.keras.Model(inputs, out, name=name)

    optimized = build(dynamic, "dynamic")
    if wrapped:
        optimized = htf.keras.optimize(optimized)
    initial = {
        k: tf.keras.initializers.Constant(dynamic[k].initial_rows(np.arange(v)).numpy()) for k, v in VOCABS.items()
    }
    plain = build(
        {k: tf.keras.layers.Embedding(v, 4, embeddings_initializer=initial[k]) for k, v in VOCABS.items()}, "plain"
    )
    return optimized, plain


@pytest.mark.parametrize(
    ("wrapped", "optimizer"), [(True, "adam"), (True, "lazy_adam"), (False, "lazy_adam"), (False, "sgd_schedule")]
)
def test_dynamic_tables_at_the_end_of_data(wrapped, optimizer):
    """A HybridHash store's Adam decays every stored row's moments each step, as Keras's every row's: in the step
    that finds the end of the data too (HybridHashDecayAdamMoments, in an optimized model); and Keras counts that
    step in ``iterations`` (LazyAdam's bias correction, a schedule's rate), also in a plain model of dynamic
    layers."""
    make = {
        "adam": lambda: tf.keras.optimizers.Adam(0.02),
        "lazy_adam": lambda: htf.keras.LazyAdam(0.02),
        "sgd_schedule": lambda: tf.keras.optimizers.SGD(tf.keras.optimizers.schedules.ExponentialDecay(0.5, 3, 0.5)),
    }[optimizer]
    x, _ = _data()
    results = []
    for model in _dynamic_pair(wrapped):
        optimizer = htf.keras.dynamic_optimizer(make()) if model.name == "dynamic" and not wrapped else make()
        model.compile(optimizer=optimizer, loss="binary_crossentropy")
        losses = []
        for _ in range(EPOCHS):
            losses += model.fit(_batches("filter"), epochs=1, verbose=0).history["loss"]
        results.append((np.array(losses), model.predict_on_batch(x), int(model.optimizer.iterations)))
    (losses, predictions, iterations), (plain_losses, plain_predictions, plain_iterations) = results
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    np.testing.assert_allclose(predictions, plain_predictions, rtol=1e-5, atol=1e-7)
    assert iterations == plain_iterations == EPOCHS * (BATCHES + 1)
