"""hybridtf's Keras layers: ``EmbeddingBag`` (multi-hot ids pooled by sum / mean / sqrtn).

On its own the layer runs one fused chain over its own variable (pack ids ->
Unique&Partition -> gather -> Stitch&Combine): exact without any rewrite.
``hybridtf.keras.optimize`` captures it like a ``tf.keras.layers.Embedding``:
the layer instance gets a run-time subclass (``_HybridEmbeddingBagMixin``)
whose lookups go through the capture context, and its table joins a packed
table of the model.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hybridtf._src.capture import context
from hybridtf._src.capture.context import LookupRequest
from hybridtf._src.capture.keras_capture import _HybridEmbeddingMixin, to_compute_dtype
from hybridtf._src.capture.lookup_api import own_lookup, placeholder, plain_lookup, prepare_ids
from hybridtf._src.distribute.world import refuse_mirroring_strategy
from hybridtf._src.limits import INT64_MAX

BAG_COMBINERS = ("sum", "mean", "sqrtn")


class _HybridEmbeddingBagMixin(_HybridEmbeddingMixin):
    """Per-instance overrides of a captured EmbeddingBag: lookups go through the capture context."""

    @tf.autograph.experimental.do_not_convert
    def call(self, inputs):
        ids = prepare_ids(inputs, self.combiner, self.name, cast_floats=True)
        view = self.embeddings
        if context.in_plain_ops():  # SavedModel export: plain TensorFlow ops
            out = plain_lookup(view.packed_variable, view.row_offset, self.input_dim, self.name, ids, self.combiner)
            return to_compute_dtype(out, self.compute_dtype)
        request = LookupRequest(self._htf_table, ids, self.combiner, owner=self)
        out = context.dispatch(
            request,
            lambda: placeholder(
                ids, self.combiner, self.output_dim, self.compute_dtype, lambda: self._htf_direct(request)
            ),
            lambda: self._htf_direct(request),
        )
        return to_compute_dtype(out, self.compute_dtype)  # as the unpacked bag's _own_lookup casts


@tf.keras.utils.register_keras_serializable(package="hybridtf")
class EmbeddingBag(tf.keras.layers.Layer):
    """Embeddings of bags of ids (multi-hot features), pooled per example.

    Each example's ids are looked up in one table and combined: ``"sum"``,
    ``"mean"`` (sum / count) or ``"sqrtn"`` (sum / sqrt(count)); an empty bag
    gives a zero row. The result equals a ``tf.keras.layers.Embedding`` on the
    ragged ids followed by that reduction, computed with one fused chain.

    Input: a ``tf.RaggedTensor`` ``[batch, None]`` or ``tf.SparseTensor``
    ``[batch, L]`` (canonical order) of int32/int64 ids, or dense ids
    ``[batch, L]`` where every entry counts (floating ids are cast to int32,
    as ``tf.keras.layers.Embedding`` does). Output: ``[batch, output_dim]``.

    ``hybridtf.keras.optimize`` packs the layer's table with the model's other
    embedding tables of the same dim, like Keras ``Embedding`` layers.

    Args:
        input_dim: vocabulary size; ids are in ``[0, input_dim)``.
        output_dim: embedding width.
        combiner: ``"sum" | "mean" | "sqrtn"``.
        embeddings_initializer: initializer of the ``embeddings`` weight.
        embeddings_regularizer: optional regularizer of the table (such
            layers are not packed by ``optimize``).
        embeddings_constraint: optional constraint of the table (such layers
            are not packed by ``optimize``).
        **kwargs: ``tf.keras.layers.Layer`` arguments (``name``, ``dtype``, ...).

    Raises:
        ValueError: a non-positive size or an unknown combiner.

    Example:
        >>> ids = tf.keras.Input(shape=(None,), ragged=True, dtype=tf.int64)
        >>> pooled = EmbeddingBag(1000, 16, combiner="mean", name="history")(ids)   # [batch, 16]
        >>> model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(pooled))
        >>> model(tf.ragged.constant([[1, 5, 7], []], dtype=tf.int64)).shape
        TensorShape([2, 1])
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        combiner: str = "mean",
        embeddings_initializer="uniform",
        embeddings_regularizer=None,
        embeddings_constraint=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for what, given in (("input_dim", input_dim), ("output_dim", output_dim)):
            value = int(given) if isinstance(given, np.integer) else given
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= INT64_MAX:
                raise ValueError(
                    f"EmbeddingBag {self.name!r}: {what} must be a positive int (at most 2**63 - 1), got {value!r}."
                )
        input_dim, output_dim = int(input_dim), int(output_dim)
        if combiner not in BAG_COMBINERS:
            raise ValueError(f"EmbeddingBag {self.name!r}: combiner must be one of {BAG_COMBINERS}, got {combiner!r}.")
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.combiner = combiner
        self.embeddings_initializer = tf.keras.initializers.get(embeddings_initializer)
        self.embeddings_regularizer = tf.keras.regularizers.get(embeddings_regularizer)
        self.embeddings_constraint = tf.keras.constraints.get(embeddings_constraint)

    # optimize() captures layers of classes that name their capture mixin here.
    _htf_capture_mixin = _HybridEmbeddingBagMixin

    def build(self, input_shape=None):
        refuse_mirroring_strategy(self)
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.input_dim, self.output_dim),
            initializer=self.embeddings_initializer,
            regularizer=self.embeddings_regularizer,
            constraint=self.embeddings_constraint,
            trainable=True,
            experimental_autocast=False,  # as Keras's Embedding: the lookup's rows are cast, not the table
        )
        self.built = True

    def call(self, inputs):
        return self._own_lookup(inputs)

    @tf.autograph.experimental.do_not_convert
    def _own_lookup(self, inputs):
        ids = prepare_ids(inputs, self.combiner, self.name, cast_floats=True)
        if context.in_plain_ops():  # SavedModel export: plain TensorFlow ops
            out = plain_lookup(self.embeddings, 0, self.input_dim, self.name, ids, self.combiner)
        else:
            request = LookupRequest(self.name, ids, self.combiner, owner=self)
            out = own_lookup(self.embeddings, self.name, self.input_dim, [request])[0]
        return to_compute_dtype(out, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tf.TensorShape([tf.TensorShape(input_shape)[0], self.output_dim])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "input_dim": self.input_dim,
                "output_dim": self.output_dim,
                "combiner": self.combiner,
                "embeddings_initializer": tf.keras.initializers.serialize(self.embeddings_initializer),
                "embeddings_regularizer": tf.keras.regularizers.serialize(self.embeddings_regularizer),
                "embeddings_constraint": tf.keras.constraints.serialize(self.embeddings_constraint),
            }
        )
        return config
