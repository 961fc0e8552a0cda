"""Feature-column tables in a wrapped model_fn: packed like Embedding layers, looked up like the plain graph.

TF1 Estimator code often builds its embeddings with feature columns:
``tf.compat.v1.feature_column.input_layer(features, [embedding_column(...), ...])``
(also ``shared_embedding_columns``), and the wide part with
``tf.compat.v1.feature_column.linear_model(features, [categorical columns])``.
Both create each table with ``tf.compat.v1.get_variable`` (so the wrapper's
variable creator sees it, like a layer's ``add_weight``) and look it up with
``tf.nn.safe_embedding_lookup_sparse``. This module provides:

* ``column_owner(kwargs)``: which feature column's table a variable creation
  is, found from the Python stack (``EmbeddingColumn`` /
  ``_SharedEmbeddingColumn`` reading ``embedding_weights``, or
  ``linear_model``'s per-column ``weights`` of a categorical column, also
  those of the canned v2 Estimators' linear model layer). The
  returned ``ColumnTable`` stands for the owning layer: the wrapper captures
  the table as it captures a layer's, under the name of the variable's scope
  (``input_layer/C1_embedding``), with the plain variable's name as its
  checkpoint key (``input_layer/C1_embedding/embedding_weights``).
* a dispatch of ``tf.nn.safe_embedding_lookup_sparse`` (v1 and v2) for a
  captured table: the same result as TensorFlow's (ids < 0 pruned, an example
  without ids gives a zero row, ``sum`` / ``mean`` / ``sqrtn`` over its ids,
  rank > 2 ids reshaped back), computed by the packed chain as a bag lookup.
  An example without ids is filled with ``default_id`` (or id 0, its result
  zeroed) as TensorFlow fills it, so the table's gradient has the same rows.
  Weighted ids (``weighted_categorical_column``, ``linear_model`` of a
  weighted column) and ``max_norm`` read the table as a tensor instead: the
  table stays unpacked, named in the report with the reason.

``DenseFeatures`` (Keras v2 and ``tf.compat.v1``) and ``SequenceFeatures``
create their tables through ``EmbeddingColumn.create_state``; those are
captured too. Tables made through a ``variable_scope`` partitioner (a
``PartitionedVariable``) stay plain variables.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.python.feature_column import feature_column as fc_old
from tensorflow.python.feature_column import feature_column_v2 as fc_v2

from hybridtf._src.capture.ids import prepare_ids
from hybridtf._src.integrations.estimator_capture import CapturedTable, _frame_locals, frame_owner, is_table_layer

_BAG_COMBINERS = ("sum", "mean", "sqrtn")


@dataclasses.dataclass(eq=False)
class ColumnTable:
    """The feature column that owns a captured table: stands for the layer a table normally belongs to.

    Attributes:
        name: the table's name, the scope of its variable (``input_layer/C1_embedding``).
        trainable: whether ``get_variable`` made the table trainable.
        column: the feature column.
        kind: ``"embedding_column" | "dense_features" | "shared_embedding_columns" | "shared_embeddings" |
            "linear_model"``.
        keras_layer: the ``DenseFeatures`` (or v2 linear model) layer that lists the table among its weights
            (or None).
    """

    name: str
    trainable: bool
    column: object
    kind: str
    keras_layer: object = None


def _column_of(name: str):
    """(column, kind, table name) of the feature-column table named ``name`` being created, or Nones."""
    creator = frame_owner("embedding_weights", fc_v2.SharedEmbeddingColumnCreator)
    if creator is not None and name.rsplit("/", 1)[-1] == getattr(creator, "_name", None):
        return creator, "shared_embeddings", name
    if name.endswith("/embedding_weights"):
        for method, cls, kind in (
            ("_old_get_dense_tensor_internal", fc_v2.EmbeddingColumn, "embedding_column"),
            ("create_state", fc_v2.EmbeddingColumn, "dense_features"),
            ("_get_dense_tensor_internal", fc_old._SharedEmbeddingColumn, "shared_embedding_columns"),
        ):
            column = frame_owner(method, cls)
            if column is not None:
                return column, kind, name.rsplit("/", 1)[0]
    elif name.endswith("/weights"):
        wrapper = frame_owner("build", fc_old._FCLinearWrapper)
        column = getattr(wrapper, "_feature_column", None)
        if isinstance(column, fc_old._CategoricalColumn):
            return column, "linear_model", name.rsplit("/", 1)[0]
        column = _linear_layer_column()
        if column is not None:
            return column, "linear_model", name.rsplit("/", 1)[0]
    return None, None, None


def _linear_layer_column():
    """The categorical column whose ``weights`` a v2 linear model layer is creating, or None.

    The canned v2 Estimators' linear part (``LinearClassifier``, ``DNNLinearCombinedClassifier``:
    tensorflow_estimator's ``LinearModel`` layer) creates each categorical column's ``[num_buckets,
    units]`` weights through its feature-column ``StateManager.create_variable`` and looks them up
    with ``safe_embedding_lookup_sparse``, as v1 ``linear_model`` does.
    """
    from tensorflow_estimator.python.estimator.canned.linear import _LinearModelLayer

    for frame in _frame_locals("create_variable"):
        manager, column = frame.get("self"), frame.get("feature_column")
        if isinstance(manager, fc_v2.StateManager) and frame.get("name") == "weights":
            layer = getattr(manager, "_layer", None)
            if isinstance(column, fc_v2.CategoricalColumn) and isinstance(layer, _LinearModelLayer):
                return column
            return None
    return None


def column_owner(kwargs) -> ColumnTable | None:
    """The feature column whose table the variable creator's ``kwargs`` create, or None.

    Example:
        >>> column_owner({"name": "input_layer/C1_embedding/embedding_weights", ...}).name
        'input_layer/C1_embedding'
    """
    name = kwargs.get("name")
    if not isinstance(name, str):
        return None
    scope = tf.compat.v1.get_default_graph().get_name_scope()  # "" under get_variable: its names are absolute
    full = f"{scope}/{name}" if scope else name
    column, kind, table = _column_of(full)
    if column is None:
        return None
    # DenseFeatures, or the canned v2 linear model layer: the Keras layer listing the table among its weights
    layered = kind in ("dense_features", "linear_model")
    keras_layer = frame_owner("add_weight", tf.keras.layers.Layer) if layered else None
    return ColumnTable(table, kwargs.get("trainable") is not False, column, kind, keras_layer)


def table_owner(kwargs):
    """The layer (or feature column: a ``ColumnTable``) whose table the creator's ``kwargs`` create, or None."""
    layer = frame_owner("add_weight", tf.keras.layers.Layer)
    if layer is not None and is_table_layer(layer) and kwargs.get("name") == "embeddings":
        return layer
    return column_owner(kwargs)


def _unpacked(table: CapturedTable, reason: str):
    if table.dense_use is None:
        table.dense_use = f"{reason}: exact, but unpacked"
    table.claim_weights()  # a Keras layer's weights (a canned Estimator's optimizer reads them) list the variable
    return table.read_value()


def _bags(sparse_ids: tf.SparseTensor, default_id):
    """Ragged ``[N, L]`` bags of ``sparse_ids`` as TensorFlow's safe lookup sees them.

    Leading dims are flattened (returned for the reshape back), ids < 0 are
    dropped, and an example without ids gets ``default_id`` (0 when None) as
    TensorFlow fills it: its row is gathered and, with no ``default_id``, its
    result zeroed (``empty``), so the table's gradient holds that row with a
    zero value, which momentum, RMSProp, proximal and FTRL updates apply.
    """
    dense_shape = sparse_ids.dense_shape
    lead = None
    if sparse_ids.shape.rank != 2:
        lead = dense_shape[:-1]
        sparse_ids = tf.sparse.reshape(sparse_ids, tf.stack([tf.reduce_prod(lead), dense_shape[-1]]))
    sparse_ids = tf.sparse.retain(sparse_ids, sparse_ids.values >= 0)
    filled, empty = tf.sparse.fill_empty_rows(sparse_ids, tf.cast(default_id or 0, sparse_ids.dtype))
    # fill_empty_rows writes its output in row order, each row in [0, nrows): nothing to validate (the
    # validation's Asserts would also keep the ids from being computed ahead with the other tables').
    return bags_by_row(filled.values, filled.indices[:, 0], filled.dense_shape[0]), empty, lead


def bags_by_row(values, rows, nrows):
    """Ragged ``[nrows, None]`` bags of ``values`` from their (sorted) rows ``rows``, without validation.

    Built from the row lengths the chain reads (one bincount), not from the row ids (bincount, cumsum,
    then the lengths back as the splits' differences).
    """
    lengths = tf.raw_ops.DenseBincount(input=rows, size=nrows, weights=tf.zeros([0], tf.int64), binary_output=False)
    return tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)


def _unpacked_reason(sparse_ids, sparse_weights, combiner, max_norm) -> str | None:
    """Why this lookup reads the table as a tensor (the table then stays unpacked), or None."""
    if sparse_weights is not None:
        return "weighted ids (sparse_weights, a weighted_categorical_column) scale each row"
    if max_norm is not None:
        return "max_norm clips rows"
    if combiner not in _BAG_COMBINERS:
        return f"combiner {combiner!r}"
    if not isinstance(sparse_ids, tf.SparseTensor):
        return "ids that are not a tf.SparseTensor"
    return None


def _safe_lookup(table: CapturedTable, sparse_ids, sparse_weights, combiner, default_id, max_norm, plain):
    """``safe_embedding_lookup_sparse`` of a captured table: a packed bag lookup, or ``plain(rows)`` unpacked."""
    reason = _unpacked_reason(sparse_ids, sparse_weights, combiner, max_norm)
    if reason is not None:
        return plain(_unpacked(table, reason))
    bags, empty, lead = _bags(sparse_ids, default_id)
    # the mask comes from the copy that computes the ids ahead of the forward pass (when there is one)
    out, (empty,) = table.lookup(prepare_ids(bags, combiner, table.table), combiner, aux=(empty,))
    if default_id is None:
        out = tf.where(empty[:, None], tf.zeros_like(out), out)
    if lead is not None:
        out = tf.reshape(out, tf.concat([tf.cast(lead, tf.int32), [int(table.shape[1])]], 0))
    return out


@tf.experimental.dispatch_for_api(tf.compat.v1.nn.safe_embedding_lookup_sparse, {"embedding_weights": CapturedTable})
def _safe_lookup_v1(
    embedding_weights,
    sparse_ids,
    sparse_weights=None,
    combiner="mean",
    default_id=None,
    name=None,
    partition_strategy="div",
    max_norm=None,
    allow_fast_lookup=False,
):
    def plain(rows):
        return tf.compat.v1.nn.safe_embedding_lookup_sparse(
            rows,
            sparse_ids,
            sparse_weights,
            combiner,
            default_id,
            name,
            partition_strategy,
            max_norm,
            allow_fast_lookup,
        )

    return _safe_lookup(embedding_weights, sparse_ids, sparse_weights, combiner, default_id, max_norm, plain)


@tf.experimental.dispatch_for_api(tf.nn.safe_embedding_lookup_sparse, {"embedding_weights": CapturedTable})
def _safe_lookup_v2(
    embedding_weights,
    sparse_ids,
    sparse_weights=None,
    combiner="mean",
    default_id=None,
    max_norm=None,
    name=None,
    allow_fast_lookup=False,
):
    def plain(rows):
        return tf.nn.safe_embedding_lookup_sparse(
            rows, sparse_ids, sparse_weights, combiner, default_id, max_norm, name, allow_fast_lookup
        )

    return _safe_lookup(embedding_weights, sparse_ids, sparse_weights, combiner, default_id, max_norm, plain)
