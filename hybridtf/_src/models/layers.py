"""Keras layers the example CTR models share: the wide sum, multi-hot pooling, FM, DLRM and DIN interactions.

Every layer is plain Keras (no hybridtf op): the example models are the unchanged user code that
``hybridtf.keras.optimize`` wraps. ``SeedStream`` hands out the deterministic initializer seeds that
make two builds of a model with the same ``seed`` start from the same weights.

Example:
    >>> FMInteraction()([tf.ones([2, 3]), tf.ones([2, 3])]).numpy().tolist()
    [[3.0], [3.0]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

_PACKAGE = "hybridtf_models"
"""Keras serialization package of these layers (``hybridtf_models>SumFeatures``, ...)."""

# --------------------------------------------------------------------------- shared layers


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class SumFeatures(tf.keras.layers.Layer):
    """Sums a list of ``[B, k]`` tensors into ``[B, 1]``: one concat and one reduce_sum.

    The usual linear ("wide", first-order) part of CTR models: O(1) ops whatever
    the number of fields, instead of a chain of pairwise adds. The concat is a
    Keras ``Concatenate`` layer (which hybridtf can fuse with the lookups).

    Example:
        >>> SumFeatures()([tf.ones([2, 1]), tf.ones([2, 3])]).numpy().tolist()
        [[4.0], [4.0]]
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.concat = tf.keras.layers.Concatenate(name="concat")

    def call(self, inputs):
        inputs = list(inputs)
        merged = inputs[0] if len(inputs) == 1 else self.concat(inputs)
        return tf.reduce_sum(merged, axis=-1, keepdims=True)


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class RaggedPooling(tf.keras.layers.Layer):
    """Pools looked-up multi-hot embeddings ``[B, None, D]`` (ragged) over the row to ``[B, D]``.

    Empty rows give zeros for every combiner.

    Args:
        combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"`` (sum divided by the square root of the length).

    Example:
        >>> ids = tf.ragged.constant([[1, 2], [], [3]], dtype=tf.int64)
        >>> RaggedPooling("mean")(tf.keras.layers.Embedding(5, 4)(ids)).shape
        TensorShape([3, 4])
    """

    def __init__(self, combiner: str = "mean", **kwargs):
        super().__init__(**kwargs)
        if combiner not in ("sum", "mean", "sqrtn"):
            raise ValueError(f"combiner must be 'sum', 'mean' or 'sqrtn', got {combiner!r}.")
        self.combiner = combiner

    def call(self, inputs):
        total = tf.reduce_sum(inputs, axis=1)
        if self.combiner == "sum":
            return total
        if isinstance(inputs, tf.RaggedTensor):
            lengths = tf.cast(inputs.row_lengths(), total.dtype)[:, None]
        else:
            lengths = tf.cast(tf.shape(inputs)[1], total.dtype)
        lengths = tf.maximum(lengths, 1.0)
        return total / (lengths if self.combiner == "mean" else tf.sqrt(lengths))

    def get_config(self):
        return {**super().get_config(), "combiner": self.combiner}


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class FMInteraction(tf.keras.layers.Layer):
    """Factorization-machine second-order term over a list of F field embeddings ``[B, D]`` -> ``[B, 1]``.

    Computes ``sum_{i<j} <v_i, v_j>`` as ``0.5 * sum_d ((sum_i v_i)^2 - sum_i v_i^2)``.

    Example:
        >>> FMInteraction()([tf.ones([2, 3]), tf.ones([2, 3])]).numpy().tolist()
        [[3.0], [3.0]]
    """

    def call(self, inputs):
        stacked = tf.stack(inputs, axis=1)  # [B, F, D]
        summed = tf.reduce_sum(stacked, axis=1)
        squares = tf.reduce_sum(stacked * stacked, axis=1)
        return 0.5 * tf.reduce_sum(summed * summed - squares, axis=1, keepdims=True)


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class DotInteraction(tf.keras.layers.Layer):
    """DLRM's pairwise dot products of F vectors ``[B, D]`` -> ``[B, F * (F - 1) / 2]`` (pairs i < j).

    Example:
        >>> DotInteraction()([tf.ones([2, 4]), 2 * tf.ones([2, 4]), tf.zeros([2, 4])]).numpy()[0].tolist()
        [8.0, 0.0, 0.0]
    """

    def call(self, inputs):
        n = len(inputs)
        stacked = tf.stack(inputs, axis=1)  # [B, F, D]
        products = tf.reshape(tf.matmul(stacked, stacked, transpose_b=True), [-1, n * n])
        rows, cols = np.triu_indices(n, k=1)
        return tf.gather(products, rows * n + cols, axis=1)


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class AttentionPooling(tf.keras.layers.Layer):
    """DIN's local activation unit: pools a behaviour sequence with weights computed against a target.

    For query ``q`` (target item embedding, ``[B, D]``) and keys ``k_t`` (sequence embeddings,
    ragged ``[B, None, D]``), ``w_t = MLP([q, k_t, q - k_t, q * k_t])`` and the output is
    ``sum_t w_t * k_t`` ``[B, D]``. As in the DIN paper the weights are not softmax-normalized, so the
    output keeps the intensity of the user's interest; padding positions get weight 0.

    Args:
        hidden: widths of the attention MLP's hidden layers (sigmoid, as in DIN's reference code).
        seed: seed of the MLP's initializers.

    Example:
        >>> keys = tf.ragged.constant([[[1.0, 0.0]], []], ragged_rank=1)
        >>> AttentionPooling(hidden=(4,), seed=0)([tf.ones([2, 2]), keys]).shape
        TensorShape([2, 2])
    """

    def __init__(self, hidden: Sequence[int] = (32,), seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.hidden = tuple(int(h) for h in hidden)
        self.seed = int(seed)
        seeds = SeedStream(self.seed)
        self.mlp = [
            tf.keras.layers.Dense(h, activation="sigmoid", kernel_initializer=seeds.glorot(), name=f"att_{i}")
            for i, h in enumerate(self.hidden)
        ]
        self.score = tf.keras.layers.Dense(1, kernel_initializer=seeds.glorot(), name="att_score")

    def call(self, inputs):
        query, keys = inputs
        if isinstance(keys, tf.RaggedTensor):
            mask = tf.sequence_mask(keys.row_lengths(), dtype=query.dtype)  # [B, T]
            keys = keys.to_tensor()
        else:
            mask = tf.ones(tf.shape(keys)[:2], dtype=query.dtype)
        queries = tf.broadcast_to(query[:, None, :], tf.shape(keys))
        x = tf.concat([queries, keys, queries - keys, queries * keys], axis=-1)
        for layer in self.mlp:
            x = layer(x)
        weights = self.score(x)[..., 0] * mask
        return tf.einsum("bt,btd->bd", weights, keys)

    def get_config(self):
        return {**super().get_config(), "hidden": list(self.hidden), "seed": self.seed}


# --------------------------------------------------------------------------- seeds


class SeedStream:
    """Deterministic distinct seeds for the layers of one model, in creation order."""

    def __init__(self, seed: int):
        self._seed = int(seed)
        self._count = 0

    def next(self) -> int:
        self._count += 1
        return int(np.random.SeedSequence([self._seed, self._count]).generate_state(1)[0] >> 1)

    def glorot(self):
        return tf.keras.initializers.GlorotUniform(seed=self.next())

    def uniform(self, scale: float = 0.05):
        return tf.keras.initializers.RandomUniform(-scale, scale, seed=self.next())
