"""Python wrapper and gradient of the ``HybridTF>GatherRows`` op.

``gather_rows(variable, indices)`` is ``tf.gather(variable, indices)`` for a
``[rows, dim]`` resource variable: the same values and the same gradient (an
``IndexedSlices`` with the indices and the variable's shape, which the fused
sparse updates consume), but each row is one fixed-size copy instead of a
library ``memcpy`` call, which matters when a step gathers hundreds of
thousands of rows of 1 to 16 values.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps_utils
from tensorflow.python.ops import resource_variable_ops

from hybridtf._src.run.loader import load_ops

OP_NAME = "HybridTF>GatherRows"

# Only reads the variable: automatic control dependencies may run it beside other reads.
auto_control_deps_utils.register_read_only_resource_op(OP_NAME)


def supports(variable) -> bool:
    """Whether ``gather_rows`` can read ``variable``: a float32/float64 resource variable of rank 2 off the GPU."""
    handle = getattr(variable, "handle", None)
    if not isinstance(variable, tf.Variable) or handle is None or handle.dtype != tf.resource:
        return False
    if variable.dtype not in (tf.float32, tf.float64) or variable.shape.rank != 2:
        return False
    return "GPU" not in (variable.device or "").upper()


def gather_rows(variable, indices, name: str | None = None) -> tf.Tensor:
    """``tf.gather(variable, indices)`` for a ``[rows, dim]`` resource variable, with the same gradient.

    Args:
        variable: a float32/float64 resource variable of rank 2 (see ``supports``).
        indices: int32/int64 vector of rows.
        name: optional name scope.

    Returns:
        ``[len(indices), dim]``.

    Raises:
        ValueError: ``variable`` is not such a variable, or ``indices`` is not a vector.
        TypeError: ``indices`` are not int32 / int64 (the raw op's dtype rule).
        tf.errors.InvalidArgumentError: an index outside ``[0, rows)``.

    Example:
        >>> gather_rows(packed_table, unique.unique_ids)
    """
    if not supports(variable):
        raise ValueError(
            f"gather_rows needs a float32/float64 resource variable of rank 2 on the CPU, got {variable!r}; "
            "use tf.gather for other tensors."
        )
    indices = tf.convert_to_tensor(indices)
    if indices.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"gather_rows: indices must be int32 or int64, got {indices.dtype.name}.")
    if indices.shape.rank is not None and indices.shape.rank != 1:
        raise ValueError(f"gather_rows: indices must be a vector, got shape {indices.shape}.")
    with tf.name_scope(name or "gather_rows"):
        resource_variable_ops.variable_accessed(variable)  # the tape then watches it, as for tf.gather
        rows = load_ops().hybrid_tf_gather_rows(variable.handle, indices, dtype=variable.dtype)
        rows.set_shape([indices.shape[0], variable.shape[1]])
        return rows


def gather_variable_rows(variable, indices) -> tf.Tensor:
    """``tf.gather(variable, indices)``: one GatherRows op when ``supports(variable)``, else TensorFlow's gather.

    Example:
        >>> rows = gather_variable_rows(packed_table, unique.unique_ids)
    """
    if supports(variable):
        return gather_rows(variable, indices)
    return tf.gather(variable, indices)


@tf.RegisterGradient(OP_NAME)
def _gather_rows_grad(op, grad):
    # The gradient ResourceGather has: the rows' gradients at their indices, in the variable's shape.
    handle, indices = op.inputs
    if isinstance(grad, tf.IndexedSlices):  # e.g. the rows were gathered again: densify, as ResourceGather's does
        grad = tf.convert_to_tensor(grad)
    shape = resource_variable_ops.variable_shape(handle)
    return tf.IndexedSlices(grad, indices, shape), None
