"""Packed-table storage and the per-table views that keep checkpoints per table.

Every packed table of the plan is one ``tf.Variable`` ``[rows, dim]``; the
tables packed into it are row ranges. A ``TableView`` stands where a table's
own variable used to be (e.g. ``Embedding.embeddings``): it saves and restores
its row range under the table's own checkpoint key, so a checkpoint written by
the packed model restores into the plain model and the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import save_context

from hybridtf._src.errors import HybridTFError
from hybridtf._src.plan.packing import PackingPlan


class CheckpointLayoutError(HybridTFError, ValueError):
    """A checkpoint's table does not fit the model's table (shape or dtype)."""


class TableView(tf.__internal__.tracking.Trackable):
    """One table's rows ``[offset, offset + num_rows)`` inside a packed variable.

    Behaves like the table's variable for reading, assigning and
    checkpointing (key ``<path>/.ATTRIBUTES/VARIABLE_VALUE``, as a variable).
    """

    def __init__(self, variable: tf.Variable, offset: int, num_rows: int, table: str):
        self._variable = variable
        self._offset = int(offset)
        self._num_rows = int(num_rows)
        self.table = table

    @property
    def shape(self) -> tf.TensorShape:
        return tf.TensorShape([self._num_rows, self._variable.shape[-1]])

    @property
    def dtype(self) -> tf.DType:
        return self._variable.dtype

    @property
    def name(self) -> str:
        return f"{self.table}/embeddings:0"

    @property
    def packed_variable(self) -> tf.Variable:
        return self._variable

    @property
    def row_offset(self) -> int:
        return self._offset

    def read_value(self) -> tf.Tensor:
        return self._variable[self._offset : self._offset + self._num_rows]

    def numpy(self) -> np.ndarray:
        return self.read_value().numpy()

    def gather(self, ids) -> tf.Tensor:
        """Rows ``ids`` of this table with plain TensorFlow ops (used for SavedModel export).

        Raises:
            tf.errors.InvalidArgumentError: an id is outside ``[0, num_rows)``
                (the message names the table).
        """
        ids = tf.cast(ids, tf.int64)
        in_range = tf.reduce_all((ids >= 0) & (ids < self._num_rows))
        check = tf.debugging.Assert(
            in_range, [f"embedding table {self.table!r}: id out of range [0, {self._num_rows})"], summarize=0
        )
        with tf.control_dependencies([check]):
            return tf.gather(self._variable, ids + self._offset)

    def assign(self, value):
        value = tf.convert_to_tensor(value, dtype=self.dtype)
        if not value.shape.is_compatible_with(self.shape):
            raise CheckpointLayoutError(
                f"table {self.table!r} has shape {self.shape.as_list()} but the value to restore has shape "
                f"{value.shape.as_list()}; the checkpoint was written for a different table layout "
                "(vocabulary size or embedding dim changed)."
            )
        return self._variable[self._offset : self._offset + self._num_rows].assign(value)

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": self.read_value()}

    def _restore_from_tensors(self, restored_tensors):
        return self.assign(restored_tensors["VARIABLE_VALUE"])

    # SavedModel export. The view is written as a variable node of its own
    # (name, shape, dtype) with its value in the checkpoint, so that
    # ``tf.keras.models.load_model`` restores it into the plain layer's
    # variable and ``tf.saved_model.load`` revives it as a variable. It is
    # saved from the export graph's copy of the packed variable, which is
    # therefore a child node mapped before the view.
    _PACKED_CHILD = "packed_variable"

    @property
    def _should_act_as_resource_variable(self):
        # TensorFlow's "is a resource variable" test is ``hasattr``: true only
        # while a SavedModel is written, so that it neither traces save/restore
        # functions for the view (Keras would attach them to the revived
        # layer's variable) nor writes it as a generic object.
        if save_context.in_save_context():
            return True
        raise AttributeError("_should_act_as_resource_variable")

    @property
    def _shared_name(self) -> str:
        return self.name[: -len(":0")]

    @property
    def trainable(self) -> bool:
        return self._variable.trainable

    @property
    def synchronization(self):
        return self._variable.synchronization

    @property
    def aggregation(self):
        return self._variable.aggregation

    def _write_object_proto(self, proto, options):
        resource_variable_ops.write_object_proto_for_resource_variable(self, proto, options, enforce_naming=False)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        if save_type == "savedmodel":
            return {self._PACKED_CHILD: self._variable}
        return {}

    def _deserialization_dependencies(self, children):
        return {k: v for k, v in children.items() if k == self._PACKED_CHILD}

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        object_map[self] = TableView(object_map[self._variable], self._offset, self._num_rows, self.table)
        return []


class PackedTables(tf.Module):
    """The variables of all packed tables of a plan, created from initial values.

    Args:
        plan: the packing plan.
        initial_values: table name -> ``[num_rows, dim]`` value (the table's
            current weights: an array or a tf.Variable), for every member of
            every packed table.
        trainable: whether the packed variables are trained.
        release: called as ``release(self, member_names)`` after each packed
            table is built and its members' values copied in, so that the
            caller can drop the originals (and its references in
            ``initial_values``). Building one packed table at a time this way
            keeps peak memory near one copy of the tables.
    """

    def __init__(
        self,
        plan: PackingPlan,
        initial_values: Mapping,
        trainable: bool = True,
        release: Callable[[PackedTables, list[str]], None] | None = None,
    ):
        super().__init__(name="hybridtf_packed_tables")
        self.plan = plan
        self.packed = {}
        for pt in plan.packed_tables:
            for m in pt.members:
                shape = tuple(tf.TensorShape(initial_values[m.name].shape).as_list())
                if shape != (m.num_rows, pt.dim):
                    raise ValueError(
                        f"table {m.name!r}: initial value has shape {shape}, plan says {(m.num_rows, pt.dim)}."
                    )
            if tf.executing_eagerly():
                # Zeros, then each member's rows copied in place: no concatenated temporary.
                var = tf.Variable(tf.zeros([pt.num_rows, pt.dim], pt.dtype), name=pt.name, trainable=trainable)
                for m in pt.members:
                    var[m.row_offset : m.row_offset + m.num_rows].assign(tf.cast(initial_values[m.name], pt.dtype))
            else:  # graph mode: the initial value must come with the variable's initializer
                parts = [np.asarray(initial_values[m.name]).astype(pt.dtype, copy=False) for m in pt.members]
                var = tf.Variable(np.concatenate(parts, axis=0), name=pt.name, trainable=trainable)
            self.packed[pt.name] = var
            if release is not None:
                release(self, [m.name for m in pt.members])

    def members(self, packed_name: str) -> dict[str, tuple[int, int]]:
        """Member table -> (row_offset, num_rows) of packed table ``packed_name``."""
        pt = self.plan.packed_table(packed_name)
        return {m.name: (m.row_offset, m.num_rows) for m in pt.members}

    def view(self, table: str) -> TableView:
        """The TableView of ``table`` (a member of some packed table)."""
        packed_name, offset = self.plan.location(table)
        spec = self.plan.table(table)
        return TableView(self.packed[packed_name], offset, spec.num_rows, table)
