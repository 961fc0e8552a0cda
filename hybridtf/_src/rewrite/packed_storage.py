"""Packed-table storage and the per-table views that keep checkpoints per table.

Every packed table of the plan is one ``tf.Variable`` ``[rows, dim]``; the
tables packed into it are row ranges. A ``TableView`` stands where a table's
own variable used to be (e.g. ``Embedding.embeddings``): it saves and restores
its row range under the table's own checkpoint key, so a checkpoint written by
the packed model restores into the plain model and the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

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


class PackedTables(tf.Module):
    """The variables of all packed tables of a plan, created from initial values.

    Args:
        plan: the packing plan.
        initial_values: table name -> ``[num_rows, dim]`` array (the table's
            current weights), for every member of every packed table.
        trainable: whether the packed variables are trained.
    """

    def __init__(self, plan: PackingPlan, initial_values: Mapping[str, np.ndarray], trainable: bool = True):
        super().__init__(name="hybridtf_packed_tables")
        self.plan = plan
        self.packed = {}
        for pt in plan.packed_tables:
            parts = []
            for m in pt.members:
                value = np.asarray(initial_values[m.name])
                if value.shape != (m.num_rows, pt.dim):
                    raise ValueError(
                        f"table {m.name!r}: initial value has shape {value.shape}, plan says {(m.num_rows, pt.dim)}."
                    )
                parts.append(value.astype(pt.dtype, copy=False))
            self.packed[pt.name] = tf.Variable(np.concatenate(parts, axis=0), name=pt.name, trainable=trainable)

    def members(self, packed_name: str) -> dict[str, tuple[int, int]]:
        """Member table -> (row_offset, num_rows) of packed table ``packed_name``."""
        pt = self.plan.packed_table(packed_name)
        return {m.name: (m.row_offset, m.num_rows) for m in pt.members}

    def view(self, table: str) -> TableView:
        """The TableView of ``table`` (a member of some packed table)."""
        packed_name, offset = self.plan.location(table)
        spec = self.plan.table(table)
        return TableView(self.packed[packed_name], offset, spec.num_rows, table)
