"""One Wide & Deep model written three ways, as users write it by hand.

The dataflow fusions of ``hybridtf.keras.optimize`` must not depend on how a
model spells its concatenation and its wide sum. :func:`wide_and_deep` builds
the same math, with the same layer names and initial weights, in three
styles:

* ``"keras"``: a functional model of Keras layers: ``Embedding`` -> ``Flatten``
  -> ``Concatenate`` with the dense features -> ``Dense`` MLP; wide part
  ``Reshape`` of the dim-1 embeddings, summed;
* ``"custom_layer"``: a functional model whose concatenations and wide sum are
  custom layers calling ``tf.concat`` (DeepCTR's way: concatenate the
  ``[B, 1, d]`` lookups, ``Flatten``, concatenate with the dense features);
* ``"subclassed"``: a subclassed model whose ``call`` squeezes the lookups and
  calls ``tf.concat`` itself.

The wide part (one dim-1 embedding per field) is summed as ``wide``: ``"add"``
(a Keras ``Add`` layer; Python ``+`` in the custom layer: a chain of
``AddV2``), ``"add_n"`` (``tf.add_n``), ``"reduce_sum"`` (``tf.reduce_sum``
over a ``tf.stack`` / ``tf.concat`` of the fields) or ``"stack_sum"``
(``tf.reduce_sum(tf.stack(fields), 0)``: stacked along a new first axis).

Inputs: ``{"f<i>": int64 [B, 1], "dense": float32 [B, n_dense]}``; output: a
sigmoid probability ``[B, 1]``.

Example:
    >>> model = wide_and_deep("subclassed", "add", vocabs=[100, 200], dim=8, n_dense=3)
    >>> model(batch(vocabs=[100, 200], n_dense=3, batch_size=4, seed=0)[0]).shape
    TensorShape([4, 1])
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

STYLES = ("keras", "custom_layer", "subclassed")
WIDE_SUMS = ("add", "add_n", "reduce_sum", "stack_sum")


class ConcatFields(tf.keras.layers.Layer):
    """``tf.concat(inputs, axis)`` in a custom layer (as DeepCTR's ``Concat`` does).

    Example:
        >>> ConcatFields(-1)([tf.ones([2, 1, 3]), tf.ones([2, 1, 2])]).shape
        TensorShape([2, 1, 5])
    """

    def __init__(self, axis: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.axis = axis

    def call(self, inputs):
        return tf.concat(list(inputs), axis=self.axis)


class SumFields(tf.keras.layers.Layer):
    """The sum of ``[B, 1]`` tensors in a custom layer: Python ``+``, ``tf.add_n`` or reduce_sum of a concat.

    Example:
        >>> SumFields("add_n")([tf.ones([2, 1]), tf.ones([2, 1])]).numpy().tolist()
        [[2.0], [2.0]]
    """

    def __init__(self, how: str, **kwargs):
        super().__init__(**kwargs)
        self.how = how

    def call(self, inputs):
        return _wide_sum(self.how, list(inputs), add_layer=None)


def _wide_sum(how: str, wide: list, add_layer):
    if how == "add":
        return add_layer(wide) if add_layer is not None else functools.reduce(operator.add, wide)
    if how == "add_n":
        return tf.add_n(wide)
    if how == "reduce_sum":
        return tf.reduce_sum(tf.concat(wide, axis=-1), axis=-1, keepdims=True)
    if how == "stack_sum":
        return tf.reduce_sum(tf.stack(wide), 0)
    raise ValueError(f"wide must be one of {WIDE_SUMS}, got {how!r}.")


def _layers(vocabs, dim, hidden, seed):
    def emb(prefix, i, v, d):
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed + (1000 if d == 1 else 0) + i)
        return tf.keras.layers.Embedding(v, d, embeddings_initializer=init, name=f"{prefix}_{i}")

    deep = [emb("emb", i, v, dim) for i, v in enumerate(vocabs)]
    wide = [emb("wide", i, v, 1) for i, v in enumerate(vocabs)]
    mlp = [
        tf.keras.layers.Dense(
            h, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 2000 + k), name=f"h{k}"
        )
        for k, h in enumerate(hidden)
    ]
    mlp.append(
        tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 3000), name="deep_logit")
    )
    return deep, wide, mlp


def _head(mlp, x, wide_logit):
    for layer in mlp:
        x = layer(x)
    return tf.keras.activations.sigmoid(x + wide_logit)


class _SubclassedWDL(tf.keras.Model):
    def __init__(self, vocabs, dim, n_dense, hidden, seed, wide, **kwargs):
        super().__init__(**kwargs)
        self.deep_embeddings, self.wide_embeddings, self.mlp = _layers(vocabs, dim, hidden, seed)
        self.wide_add = tf.keras.layers.Add(name="wide_add")
        self.wide = wide

    def call(self, inputs):
        keys = [f"f{i}" for i in range(len(self.deep_embeddings))]
        deep = [tf.squeeze(layer(inputs[k]), axis=1) for k, layer in zip(keys, self.deep_embeddings)]
        wide = [tf.reshape(layer(inputs[k]), [-1, 1]) for k, layer in zip(keys, self.wide_embeddings)]
        x = tf.concat([*deep, inputs["dense"]], axis=1)
        return _head(self.mlp, x, _wide_sum(self.wide, wide, self.wide_add))


def wide_and_deep(
    style: str,
    wide: str,
    vocabs: Sequence[int],
    dim: int = 8,
    n_dense: int = 3,
    hidden: Sequence[int] = (16, 8),
    seed: int = 0,
) -> tf.keras.Model:
    """Wide & Deep over ``len(vocabs)`` one-hot fields, written in ``style`` with the wide sum ``wide``.

    Args:
        style: one of :data:`STYLES`.
        wide: one of :data:`WIDE_SUMS`.
        vocabs: rows of each field's tables (deep ``emb_<i>`` of width ``dim``, wide ``wide_<i>`` of width 1).
        dim: deep embedding width.
        n_dense: dense features.
        hidden: widths of the ReLU MLP.
        seed: seed of every initializer (same seed: same weights in every style).

    Returns:
        A built, uncompiled model.

    Raises:
        ValueError: an unknown style or wide sum.
    """
    if style not in STYLES or wide not in WIDE_SUMS:
        raise ValueError(f"style must be one of {STYLES} and wide one of {WIDE_SUMS}, got {style!r}, {wide!r}.")
    if style == "subclassed":
        model = _SubclassedWDL(vocabs, dim, n_dense, hidden, seed, wide, name="wdl_subclassed")
        model(batch(vocabs, n_dense, 2, seed=0)[0])
        return model
    inputs = {f"f{i}": tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(len(vocabs))}
    inputs["dense"] = tf.keras.Input((n_dense,), name="dense")
    deep_layers, wide_layers, mlp = _layers(vocabs, dim, hidden, seed)
    deep = [layer(inputs[f"f{i}"]) for i, layer in enumerate(deep_layers)]  # [B, 1, dim]
    wide_in = [layer(inputs[f"f{i}"]) for i, layer in enumerate(wide_layers)]  # [B, 1, 1]
    if style == "keras":
        flat = [tf.keras.layers.Flatten(name=f"flat_{i}")(e) for i, e in enumerate(deep)]
        x = tf.keras.layers.Concatenate(name="deep_concat")([*flat, inputs["dense"]])
        wide_cols = [tf.keras.layers.Reshape((1,), name=f"wide_col_{i}")(w) for i, w in enumerate(wide_in)]
        if wide == "reduce_sum":  # over a stack of the columns: [B, n, 1]
            wide_logit = tf.reduce_sum(tf.stack(wide_cols, axis=1), axis=1)
        else:
            wide_logit = _wide_sum(wide, wide_cols, tf.keras.layers.Add(name="wide_add"))
    else:
        fields = tf.keras.layers.Flatten(name="flat_fields")(ConcatFields(-1, name="field_concat")(deep))
        x = ConcatFields(-1, name="deep_concat")([fields, inputs["dense"]])
        wide_cols = [tf.keras.layers.Flatten(name=f"wide_col_{i}")(w) for i, w in enumerate(wide_in)]
        wide_logit = SumFields(wide, name="wide_sum")(wide_cols)
    return tf.keras.Model(inputs, _head(mlp, x, wide_logit), name=f"wdl_{style}")


def batch(vocabs: Sequence[int], n_dense: int, batch_size: int, seed: int, alpha: float = 1.2):
    """One batch ``(features, labels)`` of Zipf ids (clipped to each vocabulary) for :func:`wide_and_deep`."""
    rng = np.random.default_rng(seed)
    x = {f"f{i}": tf.constant((rng.zipf(alpha, (batch_size, 1)) - 1) % v, tf.int64) for i, v in enumerate(vocabs)}
    x["dense"] = tf.constant(rng.standard_normal((batch_size, n_dense)), tf.float32)
    return x, tf.constant(rng.integers(0, 2, (batch_size, 1)), tf.float32)
