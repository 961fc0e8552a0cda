"""D-interleaving in custom steps: ``htf.micro_batch_gradients`` in ``htf.function`` and Estimator model_fns.

Wide & Deep on ``hybridtf.embedding.Tables`` (a dim-1 wide table and a deep
table per field, a ragged multi-hot field) in an ``htf.function`` loop, and W&D
with Keras Embedding layers in a ``hybridtf.estimator.model_fn``. Per-step
losses of the micro-batched step (2 and 4 micro-batches, from the embedding
layer and from the MLP, Adagrad and Adam) agree with the whole-batch
``GradientTape`` step within 1e-5 relative (fp32). Also: one packed chain per
micro-batch from the embedding layer (one for the whole batch from the MLP),
and the errors for what cannot be split.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
import hybridtf.estimator as htf_estimator
from hybridtf._src.capture.lookup_api import TableConfig, Tables
from hybridtf._src.rewrite import batch_statistics
from hybridtf.errors import InterleavingError

FIELDS = [("f0", 40), ("f1", 70), ("f2", 30), ("f3", 90)]
DIM, BATCH, STEPS = 8, 48, 12
LOSS_KEY = "test_micro_batch_custom_loss"


def _batches(steps=STEPS, seed=11):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = {f: tf.constant(rng.integers(0, n, size=BATCH)) for f, n in FIELDS}
        lengths = rng.integers(0, 4, size=BATCH)
        ids["hist"] = tf.RaggedTensor.from_row_lengths(rng.integers(0, 25, size=int(lengths.sum())), lengths)
        dense = tf.constant(rng.normal(size=(BATCH, 3)).astype(np.float32))
        y = tf.constant((rng.random((BATCH, 1)) < 0.4).astype(np.float32))
        out.append(((ids, dense), y))
    return out


BATCHES = _batches()


class _WideDeep:
    """W&D on Tables: wide (dim 1) and deep (dim 8) tables, a multi-hot history, an MLP 16-8-1."""

    def __init__(self, seed=3):
        rng = np.random.default_rng(seed)

        def init(n, d):
            return rng.uniform(-0.1, 0.1, size=(n, d)).astype(np.float32)

        configs = [TableConfig(f"deep_{f}", n, DIM, initializer=init(n, DIM)) for f, n in FIELDS]
        configs += [TableConfig(f"wide_{f}", n, 1, initializer=init(n, 1)) for f, n in FIELDS]
        configs.append(TableConfig("hist", 25, DIM, initializer=init(25, DIM)))
        self.tables = Tables(configs)
        tf.keras.utils.set_random_seed(seed)
        self.mlp = tf.keras.Sequential([tf.keras.layers.Dense(16, "relu"), tf.keras.layers.Dense(8, "relu")])
        self.out = tf.keras.layers.Dense(1)
        self.mlp.build((None, (len(FIELDS) + 1) * DIM + 3))
        self.out.build((None, 8))
        self.variables = list(self.tables.trainable_variables) + self.mlp.trainable_variables
        self.variables += self.out.trainable_variables

    def features(self, batch):
        (ids, dense), _ = batch
        deep = [self.tables.lookup(f"deep_{f}", ids[f]) for f, _ in FIELDS]
        deep.append(self.tables.lookup("hist", ids["hist"], "mean"))
        wide = tf.add_n([self.tables.lookup(f"wide_{f}", ids[f]) for f, _ in FIELDS])
        return tf.concat([*deep, dense], 1), wide

    def head(self, features, batch):
        x, wide = features
        logit = self.out(self.mlp(x)) + wide
        return tf.reduce_mean(tf.keras.losses.binary_crossentropy(batch[1], tf.sigmoid(logit)))

    def loss(self, batch):
        return self.head(self.features(batch), batch)

    def deep_only(self, batch):
        return self.features(batch)[0]

    def head_with_wide(self, x, batch):  # lookups inside loss_fn, from the MLP
        (ids, _), _ = batch
        wide = tf.add_n([self.tables.lookup(f"wide_{f}", ids[f]) for f, _ in FIELDS])
        return self.head((x, wide), batch)


def _optimizer(name):
    return tf.keras.optimizers.Adagrad(0.1) if name == "adagrad" else tf.keras.optimizers.Adam(0.01)


def _function_losses(optimizer, micro, mode):
    model, opt = _WideDeep(), _optimizer(optimizer)

    @htf.function
    def step(batch):
        if micro is None:
            with tf.GradientTape() as tape:
                loss = model.loss(batch)
            grads = tape.gradient(loss, model.variables)
        elif mode == "embedding":
            loss, grads = htf.micro_batch_gradients(model.loss, batch, model.variables, micro_batches=micro)
        else:
            loss, grads = htf.micro_batch_gradients(
                model.head,
                batch,
                model.variables,
                micro_batches=micro,
                interleave_from="mlp",
                features_fn=model.features,
            )
        opt.apply_gradients(zip(grads, model.variables))
        return loss

    return np.array([float(step(b)) for b in BATCHES]), step


def _assert_close(got, want, rtol=1e-5):
    rel = np.abs(got - want) / np.maximum(np.abs(want), 1e-12)
    assert rel.max() < rtol, f"max relative loss difference {rel.max():.3g} at step {int(rel.argmax())}"
    assert abs(want[-1] - want[0]) > 1e-3  # it trained


@pytest.fixture(scope="module")
def whole_function():
    return {opt: _function_losses(opt, None, None)[0] for opt in ("adagrad", "adam")}


@pytest.mark.parametrize(
    ("optimizer", "micro", "mode"),
    [("adagrad", 2, "embedding"), ("adagrad", 4, "mlp"), ("adam", 4, "embedding"), ("adam", 2, "mlp")],
)
def test_function_micro_batches_equal_whole_batch(whole_function, optimizer, micro, mode):
    losses, step = _function_losses(optimizer, micro, mode)
    _assert_close(losses, whole_function[optimizer])
    graph = step.get_concrete_function(BATCHES[0]).graph
    chains = [op for op in graph.get_operations() if op.type == "HybridTF>PackIds"]
    packed_tables = 2  # dim 8 (deep + hist) and dim 1 (wide)
    assert len(chains) == packed_tables * (micro if mode == "embedding" else 1)


def test_function_lookups_inside_loss_fn_from_the_mlp(whole_function):
    model, opt = _WideDeep(), _optimizer("adagrad")

    @htf.function
    def step(batch):
        loss, grads = htf.micro_batch_gradients(
            model.head_with_wide,
            batch,
            model.variables,
            micro_batches=2,
            interleave_from="mlp",
            features_fn=model.deep_only,
        )
        opt.apply_gradients(zip(grads, model.variables))
        return loss

    _assert_close(np.array([float(step(b)) for b in BATCHES]), whole_function["adagrad"])


def test_function_eager_and_variables_none():
    model = _WideDeep()
    batch = BATCHES[0]
    with tf.GradientTape() as tape:
        want = model.loss(batch)
    want_grads = tape.gradient(want, model.variables)
    loss, grads, variables = htf.micro_batch_gradients(model.loss, batch, micro_batches=3)
    assert {id(v) for v in variables} == {id(v) for v in model.variables}
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    by_id = {id(v): g for v, g in zip(variables, grads)}
    for v, g in zip(model.variables, want_grads):
        np.testing.assert_allclose(tf.convert_to_tensor(by_id[id(v)]), tf.convert_to_tensor(g), rtol=1e-5, atol=1e-7)


def test_errors_name_the_problem():
    model = _WideDeep()
    batch = BATCHES[0]
    with pytest.raises(InterleavingError, match="micro_batches must be an int"):
        htf.micro_batch_gradients(model.loss, batch, model.variables, micro_batches=0)
    with pytest.raises(InterleavingError, match="needs features_fn"):
        htf.micro_batch_gradients(model.loss, batch, model.variables, micro_batches=2, interleave_from="mlp")
    with pytest.raises(InterleavingError, match="interleave_from='dense'"):
        htf.micro_batch_gradients(model.loss, batch, model.variables, micro_batches=2, interleave_from="dense")
    with pytest.raises(InterleavingError, match="reduction"):
        htf.micro_batch_gradients(model.loss, batch, model.variables, micro_batches=2, reduction="none")
    with pytest.raises(InterleavingError, match="cannot make 64 micro-batches"):
        htf.micro_batch_gradients(model.loss, batch, model.variables, micro_batches=64)
    with pytest.raises(InterleavingError, match="is a scalar"):
        htf.micro_batch_gradients(lambda b: model.loss(b[0]), (batch, tf.constant(1.0)), micro_batches=2)
    with pytest.raises(InterleavingError, match="batch dimensions differ"):
        htf.micro_batch_gradients(model.loss, (batch, tf.zeros([5, 2])), micro_batches=2)
    with pytest.raises(InterleavingError, match="not a scalar loss"):
        htf.micro_batch_gradients(lambda b: tf.reduce_sum(model.features(b)[0], 1), batch, micro_batches=2)

    def fresh_layer(b):  # a layer created per call: other variables in every micro-batch
        return tf.reduce_mean(tf.keras.layers.Dense(1)(b[0][1]))

    with pytest.raises(InterleavingError, match="create the layers and tables once"):
        htf.micro_batch_gradients(fresh_layer, batch, micro_batches=2)


# ---------------------------------------------------------------- Estimator


def _input_fn():
    rng = np.random.default_rng(5)
    n = BATCH * 30
    x = {f: rng.integers(0, v, size=n).astype(np.int64) for f, v in FIELDS}
    x["dense"] = rng.normal(size=(n, 3)).astype(np.float32)
    y = (rng.random((n, 1)) < 0.4).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()


def _estimator_fn(optimizer, micro, split):
    def model_fn(features, labels, mode):
        deep = [
            tf.keras.layers.Embedding(
                n, DIM, embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=i), name=f"deep_{f}"
            )
            for i, (f, n) in enumerate(FIELDS)
        ]
        wide = [
            tf.keras.layers.Embedding(
                n, 1, embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=50 + i), name=f"w_{f}"
            )
            for i, (f, n) in enumerate(FIELDS)
        ]
        hidden = tf.keras.layers.Dense(16, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(7))
        out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(8))

        def features_fn(batch):
            feats, _ = batch
            x = tf.concat([layer(feats[f]) for layer, (f, _) in zip(deep, FIELDS)] + [feats["dense"]], 1)
            return x, tf.add_n([layer(feats[f]) for layer, (f, _) in zip(wide, FIELDS)])

        def head(x_wide, batch):
            x, w = x_wide
            pred = tf.sigmoid(out(hidden(x)) + w)
            return tf.reduce_mean(tf.keras.losses.binary_crossentropy(batch[1], pred))

        opt = (
            tf.compat.v1.train.AdagradOptimizer(0.1)
            if optimizer == "adagrad"
            else tf.compat.v1.train.AdamOptimizer(0.01)
        )
        batch = (features, labels)
        if micro is None:
            loss = head(features_fn(batch), batch)
            train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        else:
            kwargs = {"interleave_from": "mlp", "features_fn": features_fn} if split == "mlp" else {}
            fn = head if split == "mlp" else (lambda b: head(features_fn(b), b))
            loss, grads, variables = htf_estimator.micro_batch_gradients(fn, batch, micro_batches=micro, **kwargs)
            train_op = opt.apply_gradients(zip(grads, variables), global_step=tf.compat.v1.train.get_global_step())
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        return tf.estimator.EstimatorSpec(tf.estimator.ModeKeys.TRAIN, loss=loss, train_op=train_op)

    return htf_estimator.model_fn(model_fn)


class _LossHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(LOSS_KEY)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def _estimator_losses(tmp_path, optimizer, micro, mode):
    config = tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )
    est = tf.estimator.Estimator(_estimator_fn(optimizer, micro, mode), model_dir=str(tmp_path), config=config)
    hook = _LossHook()
    est.train(_input_fn, steps=STEPS * 2, hooks=[hook])
    return np.array(hook.losses)


@pytest.mark.parametrize(("optimizer", "micro", "mode"), [("adagrad", 2, "embedding"), ("adam", 4, "mlp")])
def test_estimator_micro_batches_equal_whole_batch(tmp_path, optimizer, micro, mode):
    want = _estimator_losses(tmp_path / "whole", optimizer, None, None)
    got = _estimator_losses(tmp_path / "micro", optimizer, micro, mode)
    _assert_close(got, want)


@pytest.mark.parametrize(("micro", "split", "chains"), [(None, None, 1), (3, "embedding", 3), (3, "mlp", 1)])
def test_estimator_chains_per_micro_batch(micro, split, chains):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        features, labels = tf.compat.v1.data.make_one_shot_iterator(_input_fn()).get_next()
        _estimator_fn("adagrad", micro, split)(features=features, labels=labels, mode=tf.estimator.ModeKeys.TRAIN)
    # W&D: the wide table shares the deep table's unique ids (UniqueSubset): one PackIds per segment
    assert len([op for op in graph.get_operations() if op.type == "HybridTF>PackIds"]) == chains
    assert not [op for op in graph.get_operations() if op.type == "ResourceGather"]  # every lookup packed


def test_a_traced_batch_shorter_than_micro_batches_gives_the_whole_batch_loss():
    """Its empty micro-batches' means (NaN) had weight 0, yet made the loss NaN (the gradients were right)."""
    w = tf.Variable([[0.5], [-0.25]])

    def loss_fn(x):
        return tf.reduce_mean(tf.square(tf.matmul(x, w)))

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def step(x):
        loss, grads = htf.micro_batch_gradients(loss_fn, x, [w], micro_batches=8)
        return loss, grads[0]

    x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    with tf.GradientTape() as tape:
        want = loss_fn(x)
    loss, grad = step(x)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    np.testing.assert_allclose(grad.numpy(), tape.gradient(want, w).numpy(), rtol=1e-6)
    # a NumPy integer is a number of micro-batches too
    loss, _ = htf.micro_batch_gradients(loss_fn, x, [w], micro_batches=np.int64(3))
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)


def _batch_statistics_told(caplog, layer, micro_batches, units=1, reduce=tf.reduce_mean):
    x = tf.constant(np.random.default_rng(0).normal(size=(12, 3)).astype(np.float32))
    dense = tf.keras.layers.Dense(units)
    dense.build((None, 3))

    @tf.function
    def step(x):
        return htf.micro_batch_gradients(
            lambda part: reduce(tf.square(dense(layer(part)))),
            x,
            dense.trainable_variables,
            micro_batches=micro_batches,
        )

    caplog.clear()
    with caplog.at_level("WARNING", logger="hybridtf"):
        step(x)
    return [r.getMessage() for r in caplog.records if "statistics over the batch" in r.getMessage()]


class _HandWrittenBatchNorm(tf.keras.layers.Layer):
    def call(self, x):
        mean, variance = tf.nn.moments(x, [0])
        return (x - mean) / tf.sqrt(variance + 1e-3)


def _reduce_mean_batch_norm(x):
    """A batch normalization written with ``tf.reduce_mean(x, 0)`` (no ``tf.nn.moments`` in its op names)."""
    variance = tf.reduce_mean(tf.square(x - tf.reduce_mean(x, axis=0)), axis=0)
    return x / tf.sqrt(variance + 1e-3)


def _built(layer, **call):
    layer.build((None, 3))
    return lambda x: layer(x, **call)


@pytest.mark.parametrize(
    "make, told",
    [
        (lambda: _built(tf.keras.layers.BatchNormalization(), training=True), True),
        (lambda: _built(_HandWrittenBatchNorm()), True),
        (lambda: _reduce_mean_batch_norm, True),
        (lambda: _built(tf.keras.layers.LayerNormalization()), False),  # statistics per row
        (lambda: _built(tf.keras.layers.BatchNormalization(), training=False), False),
    ],
    ids=[
        "keras_batch_norm_training",
        "tf_nn_moments_axis_0",
        "reduce_mean_axis_0",
        "layer_norm",
        "batch_norm_inference",
    ],
)
def test_statistics_over_the_batch_in_loss_fn_are_told(make, told, caplog):
    """Each micro-batch normalizes with its own rows' statistics: the gradients differ from the whole batch's
    (a probe: 1.84 relative), silently before."""
    messages = _batch_statistics_told(caplog, make(), micro_batches=3)
    assert bool(messages) == told, messages
    if told:
        assert "micro_batch_gradients' loss_fn" in messages[0] and "micro_batches=1" in messages[0]
    assert not _batch_statistics_told(caplog, make(), micro_batches=1)  # one micro-batch is the whole batch


def test_statistics_of_a_weight_are_not_told(caplog):
    """A weight-standardized layer's ``tf.nn.moments(kernel, [0])`` does not depend on the batch: exact."""
    kernel = tf.Variable(np.random.default_rng(1).normal(size=(3, 3)).astype(np.float32))

    def standardized(x):
        mean, variance = tf.nn.moments(kernel, [0])
        return tf.matmul(x, (kernel - mean) / tf.sqrt(variance + 1e-3))

    assert not _batch_statistics_told(caplog, standardized, micro_batches=3)


def test_a_loss_averaged_over_the_rows_per_output_is_not_told(caplog):
    """``tf.reduce_mean(losses, 0)`` per output, then summed: a mean over the rows that only reaches the loss (exact
    when micro-batched), not a statistic applied to the rows again."""

    def per_output_mean(losses):
        return tf.reduce_sum(tf.reduce_mean(losses, axis=0) * tf.constant([1.0, 0.5]))

    assert not _batch_statistics_told(caplog, tf.identity, micro_batches=3, units=2, reduce=per_output_mean)


def _rows_combined_told(caplog, combine, micro_batches=3):
    """Whether a micro-batched ``loss_fn`` that projects its rows (``[4, 3]`` per micro-batch) and applies
    ``combine`` to them is warned about (each case's ops may have the names another's had: told again)."""
    batch_statistics._told.clear()
    x = tf.constant(np.random.default_rng(2).normal(size=(12, 3)).astype(np.float32))
    w = tf.Variable(np.random.default_rng(3).normal(size=(3, 3)).astype(np.float32))

    @tf.function
    def step(x):
        return htf.micro_batch_gradients(lambda part: combine(tf.matmul(part, w)), x, [w], micro_batches=micro_batches)

    caplog.clear()
    with caplog.at_level("WARNING", logger="hybridtf"):
        step(x)
    return [r.getMessage() for r in caplog.records if "statistics over the batch" in r.getMessage()]


def _in_batch_negatives(h):
    logits = tf.matmul(h, h, transpose_b=True)  # each row against every row of the batch
    labels = tf.range(tf.shape(h)[0])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


def _stacked_fields(h):
    """A factorization machine over fields stacked on axis 0: its reductions over axis 0 are per example."""
    fields = tf.stack([h, 2.0 * h, -h], axis=0)  # [fields, rows, dim]
    cross = tf.square(tf.reduce_sum(fields, 0)) - tf.reduce_sum(tf.square(fields), 0)
    return tf.reduce_mean(cross)


@pytest.mark.parametrize(
    "combine, told",
    [
        (_in_batch_negatives, True),
        (lambda h: tf.reduce_mean(tf.einsum("bd,cd->bc", h, h)), True),
        (lambda h: tf.reduce_mean(tf.matmul(h, h, transpose_a=True)), True),  # a Gram matrix over the rows
        (lambda h: tf.reduce_mean(tf.nn.softmax(h, axis=0) * h), True),  # a softmax over the batch
        (lambda h: tf.reduce_mean(tf.nn.log_softmax(h[:, 0])), True),  # a vector of the rows
        (lambda h: tf.reduce_mean(h / tf.reduce_sum(tf.abs(h), 0)), True),  # a sum over the rows, applied again
        (lambda h: tf.reduce_mean(tf.matmul(h[:, :, None], h[:, None, :])), False),  # per-example products
        (lambda h: tf.reduce_mean(tf.einsum("bd,bd->b", h, h)), False),
        (lambda h: tf.reduce_mean(tf.nn.softmax(h) * h), False),  # a softmax per row
        (_stacked_fields, False),
    ],
    ids=[
        "in_batch_negatives",
        "einsum_across_rows",
        "gram_matrix",
        "softmax_axis_0",
        "softmax_of_a_column",
        "sum_over_rows_normalization",
        "batched_outer_products",
        "einsum_per_row",
        "softmax_per_row",
        "fields_stacked_on_axis_0",
    ],
)
def test_math_combining_the_batch_rows_in_loss_fn_is_told(combine, told, caplog):
    """In-batch negatives, a softmax over the batch, ... see only the micro-batch's rows: the step differs from
    the whole batch's. It was not told before; per-example products and reductions over fields stacked on axis 0
    are not told."""
    messages = _rows_combined_told(caplog, combine)
    assert bool(messages) == told, messages
    if told:
        assert "in-batch negatives" in messages[0] and "micro_batches=1" in messages[0]
    assert not _rows_combined_told(caplog, combine, micro_batches=1)


def test_a_keras_two_tower_model_with_in_batch_negatives_is_told(caplog):
    """A retrieval model's in-batch softmax (its logits a product of the two towers' outputs over the batch),
    micro-batched by optimize: warned when its first step is traced (rows unknown), not with one micro-batch."""

    def build(micro_batches):
        tf.keras.utils.set_random_seed(4)
        user = tf.keras.Input((1,), name="user", dtype="int64")
        item = tf.keras.Input((1,), name="item", dtype="int64")
        u = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(50, 8)(user))
        v = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(60, 8)(item))
        u, v = tf.keras.layers.Dense(8)(u), tf.keras.layers.Dense(8)(v)
        logits = tf.keras.layers.Lambda(lambda t: tf.matmul(t[0], t[1], transpose_b=True))([u, v])
        model = htf.keras.optimize(tf.keras.Model([user, item], logits), micro_batches=micro_batches)

        def in_batch_softmax(y_true, y_pred):
            return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.range(tf.shape(y_pred)[0]), y_pred)

        model.compile(tf.keras.optimizers.Adagrad(0.1), loss=in_batch_softmax)
        return model

    rng = np.random.default_rng(5)
    x = {"user": rng.integers(0, 50, (16, 1)), "item": rng.integers(0, 60, (16, 1))}
    y = np.zeros((16, 1), np.float32)
    told = {}
    for micro_batches in (2, 1):
        caplog.clear()
        with caplog.at_level("WARNING", logger="hybridtf"):
            build(micro_batches).fit(x, y, batch_size=8, epochs=1, verbose=0)
        told[micro_batches] = [r.getMessage() for r in caplog.records if "statistics over the batch" in r.getMessage()]
    assert told[2] and "in-batch negatives" in told[2][0], told
    assert not told[1]
