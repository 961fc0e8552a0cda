"""Python wrapper of the ``HybridTF>BagSplits`` op: multi-hot bags with validated row splits.

A ``tf.SparseTensor`` built by hand, or a ``tf.RaggedTensor`` built with
``validate=False``, can hold a row index outside the batch or row splits that go
backwards. TensorFlow's segment sums skip a negative segment and its ragged
constructors without validation trust the splits, so such an id would vanish or
land in another example. These helpers build the bags through ``BagSplits``,
which fails with an error naming the table instead. The op is stateless (no
``Assert``), so the bags may be computed twice (``hybridtf.function`` lifts the
ids of a step), and the values come out of it, so whatever uses them (a
HybridHash insert) runs only after the check.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.run.loader import load_ops

OP_NAME = "HybridTF>BagSplits"
tf.no_gradient(OP_NAME)


def bags_from_sparse(ids: tf.SparseTensor, table: str) -> tf.RaggedTensor:
    """``[batch, None]`` bags of a rank-2 SparseTensor whose indices are in row-major order.

    Raises (when run) ``tf.errors.InvalidArgumentError`` naming ``table`` for a
    row index outside ``[0, dense_shape[0])`` or out of order.
    """
    values, splits = load_ops().hybrid_tf_bag_splits(
        ids.values, ids.indices[:, 0], ids.dense_shape[0], kind="row_ids", table=str(table)
    )
    return tf.RaggedTensor.from_row_splits(values, splits, validate=False)


def checked_bags(ids: tf.RaggedTensor, table: str) -> tf.RaggedTensor:
    """``ids`` (a rank-2 RaggedTensor of ragged rank 1) with its row splits checked.

    Raises (when run) ``tf.errors.InvalidArgumentError`` naming ``table`` for
    splits that do not start at 0, decrease, or do not end at the number of values.
    """
    values, splits = load_ops().hybrid_tf_bag_splits(
        ids.values, tf.cast(ids.row_splits, tf.int64), tf.constant(-1, tf.int64), kind="row_splits", table=str(table)
    )
    return tf.RaggedTensor.from_row_splits(values, tf.cast(splits, ids.row_splits.dtype), validate=False)
