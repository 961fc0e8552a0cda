"""DIN's Dice activation with train-mode batch normalization becomes one Dice op (dice_fusion), matched by dataflow.

Graph level (``dataflow_fusion.fusing`` around the ops, as an optimized model's forward pass runs it): DeepCTR's
``Dice`` layer, a user's own Dice layer on a Keras ``BatchNormalization``, and one written with ``tf.nn.moments`` /
``tf.nn.batch_normalization`` (``keepdims``, commuted products) each become one ``HybridTF>Dice``; the output, the
gradients of the input and of ``alpha``, and the moving mean / variance written by Keras's own update ops equal the
unfused ones (1e-5 relative); the sigmoid chain no longer runs. Inference mode, a ``BatchNormalization`` with
``center`` / ``scale``, and a different gate keep their ops, bit for bit.

End to end: DeepCTR DIN (default ``att_activation="dice"``) and a hand-written DIN-style model with its own Dice
layer, wrapped vs plain, 100 steps of Adagrad and Adam: per-step losses within 1e-5 relative, the BN moving
statistics and the alphas equal within 1e-5 after training, predictions equal; the step runs one Dice op per
Dice layer and no ``Sigmoid`` of the attention unit.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.rewrite import dataflow_fusion
from tests.integration.step_ops import graph_pruned_ops, step_graph

deepctr = pytest.importorskip("deepctr")
from deepctr.layers.activation import Dice as DeepCTRDice  # noqa: E402

B, T, UNITS = 16, 5, 6
DICE_OP = "HybridTF>Dice"


class KerasBNDice(tf.keras.layers.Layer):
    """A user's own Dice layer on a Keras BatchNormalization (not DeepCTR's class); ``p * x`` written first."""

    def __init__(self, center=False, gate="dice", **kwargs):
        super().__init__(**kwargs)
        self.center, self.gate = center, gate

    def build(self, input_shape):
        self.bn = tf.keras.layers.BatchNormalization(epsilon=1e-6, center=self.center, scale=False)
        self.alpha = self.add_weight("alpha", shape=(input_shape[-1],), initializer="zeros")

    def call(self, x, training=None):
        p = tf.sigmoid(self.bn(x, training=training))
        if self.gate == "dice":
            return x * p + (1.0 - p) * x * self.alpha
        return x * p + self.alpha * p * x  # not Dice: the gate uses p twice


class MomentsDice(tf.keras.layers.Layer):
    """Dice from ``tf.nn.moments(keepdims=True)`` and ``tf.nn.batch_normalization``, its own moving mean."""

    def build(self, input_shape):
        units = input_shape[-1]
        self.alpha = self.add_weight("alpha", shape=(units,), initializer="zeros")
        self.moving_mean = self.add_weight("moving_mean", shape=(units,), initializer="zeros", trainable=False)

    def call(self, x, training=None):
        mean, variance = tf.nn.moments(x, axes=list(range(x.shape.rank - 1)), keepdims=True)
        if training:
            self.moving_mean.assign(0.9 * self.moving_mean + 0.1 * tf.reshape(mean, [-1]))
        p = tf.sigmoid(tf.nn.batch_normalization(x, mean, variance, None, None, 1e-3))
        return (1.0 - p) * self.alpha * x + p * x


def _layer(kind):
    if kind == "deepctr":
        return DeepCTRDice()
    if kind == "keras_bn":
        return KerasBNDice()
    if kind == "moments":
        return MomentsDice()
    if kind == "centered":
        return KerasBNDice(center=True)
    return KerasBNDice(gate="other")


def _step(kind, fuse, training=True, shape=(B, T, UNITS)):
    """(y, dy/dx, dy/dalpha, non-trainable weights after the step), the fused names and the traced graph."""
    tf.keras.utils.set_random_seed(3)
    layer = _layer(kind)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(shape) * 2 + 0.5, tf.float32)
    g = tf.constant(rng.standard_normal(shape), tf.float32)
    layer(x, training=False)  # builds every variable; no moving-average update
    alpha = next(w for w in layer.trainable_weights if "alpha" in w.name)
    alpha.assign(rng.standard_normal(alpha.shape).astype(np.float32))
    found = {}

    @tf.function(autograph=False)
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            with dataflow_fusion.fusing(enabled=fuse) as scope:
                y = layer(x, training=training)
            loss = tf.reduce_sum(y * g)
        found["dice"] = list(scope.log.dice) if scope is not None else []
        return (y, *tape.gradient(loss, [x, alpha]))

    out = [t.numpy() for t in run(x)]
    graph = run.get_concrete_function(x).graph
    return out + [w.numpy() for w in layer.non_trainable_weights], found["dice"], graph


def _forward_op_types(graph):
    ops = graph_pruned_ops(graph)
    return [op.type for op in ops if not op.name.startswith("gradient_tape")]


@pytest.mark.parametrize("kind", ["deepctr", "keras_bn", "moments"])
def test_dice_becomes_one_op_with_equal_values_gradients_and_moving_statistics(kind):
    plain, plain_log, _ = _step(kind, False)
    fused, log, graph = _step(kind, True)
    assert plain_log == [] and len(log) == 1
    assert len(fused) == len(plain) >= 4  # y, dx, dalpha and the moving statistics
    for got, want in zip(fused, plain):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    forward = _forward_op_types(graph)
    assert forward.count(DICE_OP) == 1
    assert "Sigmoid" not in forward and "SquaredDifference" not in forward and "Mean" not in forward
    assert "HybridTF>DiceGrad" in [op.type for op in graph_pruned_ops(graph)]


def test_dice_of_one_row_and_rank_two_input():
    for shape in [(1, UNITS), (7, UNITS)]:
        plain, _, _ = _step("keras_bn", False, shape=shape)
        fused, log, _ = _step("keras_bn", True, shape=shape)
        assert len(log) == 1
        for got, want in zip(fused, plain):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize(("kind", "training"), [("deepctr", False), ("centered", True), ("other_gate", True)])
def test_other_computations_keep_their_ops(kind, training):
    plain, _, _ = _step(kind, False, training=training)
    fused, log, graph = _step(kind, True, training=training)
    assert log == [] and DICE_OP not in [op.type for op in graph.get_operations()]
    for got, want in zip(fused, plain):
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------------------------
# End to end: DIN models wrapped vs plain.

STEPS = 100
BATCH = 32
SEQ = 5


class OwnDice(tf.keras.layers.Layer):
    """A hand-written Dice: Keras BatchNormalization (DeepCTR's settings) and the gate, in a user's own layer."""

    def build(self, input_shape):
        self.bn = tf.keras.layers.BatchNormalization(epsilon=1e-9, center=False, scale=False)
        self.alpha = self.add_weight("alpha", shape=(input_shape[-1],), initializer="zeros")

    def call(self, x, training=None):
        p = tf.sigmoid(self.bn(x, training=training))
        return self.alpha * (1.0 - p) * x + p * x


def _own_din(seed=5):
    """A hand-written DIN: query-key attention over a behaviour sequence with an MLP of Dense + OwnDice."""
    tf.keras.utils.set_random_seed(seed)
    item = tf.keras.Input((1,), dtype=tf.int64, name="item")
    hist = tf.keras.Input((SEQ,), dtype=tf.int64, name="hist")
    user = tf.keras.Input((1,), dtype=tf.int64, name="user")
    items = tf.keras.layers.Embedding(40, 4, name="items")
    q, keys = items(item), items(hist)  # [B, 1, 4], [B, SEQ, 4]
    u = tf.keras.layers.Embedding(30, 4, name="users")(user)
    queries = tf.keras.layers.Lambda(lambda t: tf.tile(t, [1, SEQ, 1]))(q)
    att = tf.keras.layers.Concatenate(-1)([queries, keys, queries - keys, queries * keys])
    for units in (8, 4):
        att = OwnDice()(tf.keras.layers.Dense(units)(att))
    scores = tf.keras.layers.Dense(1)(att)  # [B, SEQ, 1]
    pooled = tf.keras.layers.Lambda(lambda a: tf.reduce_sum(a[0] * a[1], 1))([scores, keys])
    deep = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(u), tf.keras.layers.Flatten()(q), pooled])
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Dense(8, activation="relu")(deep))
    return tf.keras.Model([item, hist, user], out)


def _deepctr_din(seed=5):
    from deepctr import models as dm
    from deepctr.feature_column import SparseFeat, VarLenSparseFeat

    tf.keras.utils.set_random_seed(seed)
    hist = dict(maxlen=SEQ, length_name="seq_length")
    cols = [
        SparseFeat("user", 30, embedding_dim=4),
        SparseFeat("item_id", 40, embedding_dim=4),
        SparseFeat("cate_id", 10, embedding_dim=4),
        VarLenSparseFeat(SparseFeat("hist_item_id", 40, embedding_dim=4, embedding_name="item_id"), **hist),
        VarLenSparseFeat(SparseFeat("hist_cate_id", 10, embedding_dim=4, embedding_name="cate_id"), **hist),
    ]
    return dm.DIN(cols, ["item_id", "cate_id"], seed=seed)


def _batches(kind, steps, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        if kind == "deepctr":
            x = {
                "user": rng.integers(0, 30, BATCH),
                "item_id": rng.integers(0, 40, BATCH),
                "cate_id": rng.integers(0, 10, BATCH),
                "hist_item_id": rng.integers(1, 40, (BATCH, SEQ)),
                "hist_cate_id": rng.integers(1, 10, (BATCH, SEQ)),
                "seq_length": rng.integers(1, SEQ + 1, (BATCH, 1)),
            }
        else:
            x = {
                "item": rng.integers(0, 40, (BATCH, 1)),
                "hist": rng.integers(0, 40, (BATCH, SEQ)),
                "user": rng.integers(0, 30, (BATCH, 1)),
            }
        y = rng.integers(0, 2, (BATCH, 1)).astype(np.float32)
        out.append(({k: tf.constant(v) for k, v in x.items()}, tf.constant(y)))
    return out


def _dice_weights(model):
    """The alphas and BN moving statistics of every Dice layer (DeepCTR's or OwnDice), by layer order."""
    layers = [layer for layer in model._flatten_layers() if isinstance(layer, (DeepCTRDice, OwnDice))]
    return [w.numpy() for layer in layers for w in layer.weights]


@pytest.mark.parametrize(
    ("kind", "opt"),
    [
        ("deepctr", "adagrad"),
        pytest.param("deepctr", "adam", marks=pytest.mark.slow),
        ("own", "adagrad"),
        ("own", "adam"),
    ],
)
def test_din_with_dice_trains_exactly_with_one_dice_op_per_layer(kind, opt):
    build = _deepctr_din if kind == "deepctr" else _own_din
    batches = _batches(kind, STEPS)
    plain, packed = build(), build()
    plain(batches[0][0])
    packed(batches[0][0])
    packed.set_weights(plain.get_weights())
    packed = htf.keras.optimize(packed)
    make = {"adagrad": lambda: tf.keras.optimizers.Adagrad(0.05), "adam": lambda: tf.keras.optimizers.Adam(0.01)}
    losses = []
    for model in (plain, packed):
        model.compile(optimizer=make[opt](), loss="binary_crossentropy")
        losses.append(np.array([model.train_on_batch(x, y) for x, y in batches]))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)
    assert len(packed.hybridtf_fused_dice) == 2  # the two Dice layers, named as the training step last traced them
    plain_dice, packed_dice = _dice_weights(plain), _dice_weights(packed)
    assert len(plain_dice) == 6  # two Dice layers: alpha, moving mean, moving variance each
    for got, want in zip(packed_dice, plain_dice):  # within 1e-5 of the vector's scale (Adam moves tiny alphas)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert not np.allclose(plain_dice[1], 0.0)  # the moving means did move
    x = batches[0][0]
    np.testing.assert_allclose(packed.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-5, atol=1e-7)
    plain_ops, packed_ops = ([op.type for op in graph_pruned_ops(step_graph(m, batches))] for m in (plain, packed))
    assert packed_ops.count(DICE_OP) == 2 and plain_ops.count(DICE_OP) == 0
    assert packed_ops.count("Sigmoid") == plain_ops.count("Sigmoid") - 2  # the two gates' sigmoids are gone
