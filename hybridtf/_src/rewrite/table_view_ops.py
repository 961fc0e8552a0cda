"""What a packed table's view does as a variable: indexing, operators, sliced and sparse writes.

After ``optimize``, ``layer.embeddings`` of a packed layer is a ``TableView``
(``packed_storage.py``): a row range of the packed variable. Users read and
edit it as they would the layer's own ``tf.Variable`` (pull rows out for a
retrieval index, reset a row, scale a table), so the view answers the same
calls with the same results:

* ``view[key]`` indexes the table's rows (``view[5]``, ``view[:10, :4]``,
  ``view[..., 0]``, a scalar tensor index), reading only the indexed rows,
  and the result's ``.assign`` writes them in place as a variable's slice's
  does (it reads the packed variable whole, as TensorFlow's slice assignment does);
* Python operators (``view * 2``, ``u @ tf.transpose(view)``, ``-view``) act on the rows;
* ``value()``, ``assign_add``, ``assign_sub``, ``scatter_update``,
  ``scatter_add``, ``scatter_sub``, ``get_shape()``.

Every read goes through the view's tensor conversion, so a read inside the
optimized model's own forward pass is still refused with its fix, and an
Estimator capture still sees it. Indices are checked against the table's own
rows: a write never reaches a neighbour table packed in the same variable.
``isinstance(view, tf.Variable)`` stays False: code that needs a variable (a
tape's sources, an optimizer) takes the packed one (``htf.keras.layer_variables``).
"""

from __future__ import annotations

import numbers

import tensorflow as tf


def checked_gather(variable, offset: int, num_rows: int, table: str, ids) -> tf.Tensor:
    """Rows ``ids`` of the table at rows ``[offset, offset + num_rows)`` of ``variable``, with plain TF ops.

    An id outside ``[0, num_rows)`` fails the step (also in an exported
    SavedModel, served without hybridtf) with an ``InvalidArgumentError``
    naming the table, its vocabulary and the batch's smallest and largest ids.

    Example:
        >>> v = tf.Variable([[0.0], [1.0], [2.0], [3.0]])
        >>> checked_gather(v, 2, 2, "t", tf.constant([1, 0])).numpy().tolist()
        [[3.0], [2.0]]
    """
    ids = tf.cast(ids, tf.int64)
    in_range = tf.reduce_all((ids >= 0) & (ids < num_rows))
    check = tf.debugging.Assert(
        in_range,
        [
            f"embedding table {table!r} got an id outside its vocabulary [0, {num_rows}): the batch's ids span",
            tf.reduce_min(ids),
            "to",
            tf.reduce_max(ids),
            ". Check the feature's vocabulary size or hashing (ids must be in [0, input_dim)).",
        ],
    )
    with tf.control_dependencies([check]):
        return tf.gather(variable, ids + offset) if offset else tf.gather(variable, ids)


def _out_of_range(table: str, index, num_rows: int) -> tf.errors.InvalidArgumentError:
    return tf.errors.InvalidArgumentError(
        None, None, f"index {index} is out of range for embedding table {table!r}, which has {num_rows} rows."
    )


class VariableLike:
    """The ``tf.Variable`` calls of a ``TableView`` beyond reading, assigning and checkpointing (module docstring).

    Expects of the class it is mixed into: ``table``, ``shape``, ``dtype``,
    ``sharded``, ``read_value()``, ``assign(value, read_value=...)``,
    ``packed_variable`` and ``row_offset``.
    """

    __array_priority__ = 100  # numpy defers `array * view` to the view's operators, as for a variable
    _direct_indexing = True  # False: index the converted rows (an Estimator capture's table, which must see reads)

    def value(self) -> tf.Tensor:
        return tf.convert_to_tensor(self)

    def get_shape(self) -> tf.TensorShape:
        return self.shape

    def __iter__(self):  # the rows, one by one (eagerly; a traced tensor refuses iteration, as a variable's does)
        return iter(tf.convert_to_tensor(self))

    # ---- indexing ----------------------------------------------------------------------------------------------

    def __getitem__(self, key):
        translated = self._packed_key(key)
        if translated is not None:
            packed_key, rows_index, rest = translated
            # Reads gather the indexed rows only: a strided slice reads the whole packed variable first (a copy of
            # it, once a sparse op has touched it).
            rows = tf.gather(self.packed_variable, rows_index)
            rows = rows[rest] if rest else rows
            rows.assign = self._sliced_write(packed_key)
            return rows
        rows = tf.convert_to_tensor(self)[key]
        if self.sharded:
            rows.assign = rows.assign_add = rows.assign_sub = self._no_sliced_write
        return rows

    def _sliced_write(self, packed_key):
        """``assign`` of ``packed_key``'s slice of the packed variable, returning what a table variable's does:
        the table."""

        def assign(value, name=None):
            written = self.packed_variable[packed_key].assign(value, name=name)
            if tf.executing_eagerly():
                return self
            with tf.control_dependencies([getattr(written, "op", written)]):
                return tf.convert_to_tensor(self)

        return assign

    def _no_sliced_write(self, *args, **kwargs):
        raise NotImplementedError(
            f"embedding table {self.table!r} is sharded over the Horovod ranks: a slice of it cannot be written in "
            "place. Write the whole table instead: rows = table.numpy(); rows[...] = ...; table.assign(rows) "
            "(every rank), or use table.scatter_update(tf.IndexedSlices(values, row_ids))."
        )

    def _packed_key(self, key):
        """``(key over the packed variable, packed rows to gather, key over the gathered rows)`` for ``key``,
        or None where the view's own rows must be indexed instead (a sharded table, a read inside a traced
        step, a key whose first axis is not a plain index or slice)."""
        from hybridtf._src.capture import context

        if self.sharded or not self._direct_indexing:
            return None
        if context.active() is not None and not tf.executing_eagerly():
            return None  # the conversion decides (a read in the model's forward pass is refused)
        parts = key if isinstance(key, tuple) else (key,)
        if parts and parts[0] is Ellipsis:
            parts = (slice(None), *parts)  # `...` may stand for no axis at all: rows first, then the rest
        if not parts:
            return None
        first, rest, n, offset = parts[0], tuple(parts[1:]), int(self.shape[0]), self.row_offset
        if isinstance(first, numbers.Integral) and not isinstance(first, bool):
            index = int(first)
            if not -n <= index < n:
                raise _out_of_range(self.table, index, n)
            return (offset + index % n, *rest), offset + index % n, rest
        if isinstance(first, slice) and all(
            b is None or (isinstance(b, numbers.Integral) and not isinstance(b, bool))
            for b in (first.start, first.stop, first.step)
        ):
            if first.step == 0:
                return None  # the tensor's own error
            start, stop, step = first.indices(n)
            packed_stop = offset + stop
            packed_key = (slice(offset + start, packed_stop if packed_stop >= 0 else None, step), *rest)
            rows = offset + start + step * tf.range(len(range(start, stop, step)), dtype=tf.int64)
            return packed_key, rows, (slice(None), *rest)
        if isinstance(first, (tf.Tensor, tf.Variable)) and first.shape.rank == 0 and first.dtype.is_integer:
            index = tf.cast(first, tf.int64)
            check = tf.debugging.Assert(
                (index >= -n) & (index < n),
                [f"an index out of range for embedding table {self.table!r}, which has {n} rows:", index],
            )
            with tf.control_dependencies([check]):
                row = offset + tf.math.floormod(index, n)
            return (row, *rest), row, rest
        return None

    # ---- whole-table writes ------------------------------------------------------------------------------------

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        del use_locking, name
        return self.assign(tf.convert_to_tensor(self) + tf.convert_to_tensor(delta, self.dtype), read_value=read_value)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        del use_locking, name
        return self.assign(tf.convert_to_tensor(self) - tf.convert_to_tensor(delta, self.dtype), read_value=read_value)

    # ---- sparse writes (tf.IndexedSlices of rows, as tf.Variable.scatter_*) -------------------------------------

    def scatter_update(self, sparse_delta, use_locking=False, name=None):
        del use_locking, name
        return self._scatter(sparse_delta, "update")

    def scatter_add(self, sparse_delta, use_locking=False, name=None):
        del use_locking, name
        return self._scatter(sparse_delta, "add")

    def scatter_sub(self, sparse_delta, use_locking=False, name=None):
        del use_locking, name
        return self._scatter(sparse_delta, "sub")

    def _scatter(self, sparse_delta, kind: str):
        if not isinstance(sparse_delta, tf.IndexedSlices):
            raise TypeError(
                f"scatter_{kind} of embedding table {self.table!r} takes a tf.IndexedSlices(values, row ids), "
                f"got {type(sparse_delta).__name__}."
            )
        n = int(self.shape[0])
        ids = tf.cast(sparse_delta.indices, tf.int64)
        values = tf.convert_to_tensor(sparse_delta.values, self.dtype)
        if tf.executing_eagerly() and tf.size(ids) > 0 and not bool(tf.reduce_all((ids >= 0) & (ids < n))):
            raise tf.errors.InvalidArgumentError(
                None,
                None,
                f"scatter_{kind} of embedding table {self.table!r}: row ids must be in [0, {n}), got ids from "
                f"{int(tf.reduce_min(ids))} to {int(tf.reduce_max(ids))}; nothing was written.",
            )
        check = tf.debugging.Assert(
            tf.reduce_all((ids >= 0) & (ids < n)),
            [
                f"scatter_{kind} of embedding table {self.table!r}: a row id outside [0, {n}); the ids span",
                tf.reduce_min(ids),
                "to",
                tf.reduce_max(ids),
            ],
        )
        with tf.control_dependencies([check]):
            if not self.sharded:
                shifted = tf.IndexedSlices(values, ids + self.row_offset)
                getattr(self.packed_variable, f"scatter_{kind}")(shifted)
                return tf.convert_to_tensor(self)
            rows, where = tf.convert_to_tensor(self), tf.expand_dims(ids, 1)
            if kind == "update":
                new = tf.tensor_scatter_nd_update(rows, where, values)
            else:
                new = tf.tensor_scatter_nd_add(rows, where, values if kind == "add" else -values)
            return self.assign(new)


def _operator(name: str):
    tensor_method = getattr(tf.Tensor, name)

    def method(self, *args):
        return tensor_method(tf.convert_to_tensor(self), *args)

    method.__name__ = name
    method.__doc__ = f"``{name}`` of the table's rows, as ``tf.Variable.{name}``."
    return method


# `==` / `!=` keep identity (views are dict keys in Keras's and hybridtf's bookkeeping); indexing is above.
for _name in sorted(tf.Tensor.OVERLOADABLE_OPERATORS - {"__eq__", "__ne__", "__getitem__"}):
    setattr(VariableLike, _name, _operator(_name))
del _name
