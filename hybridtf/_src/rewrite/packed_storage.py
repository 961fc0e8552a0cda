"""Packed-table storage and the per-table views that keep checkpoints per table.

Every packed table of the plan is one ``tf.Variable`` ``[rows, dim]``; the
tables packed into it are row ranges. A ``TableView`` stands where a table's
own variable used to be (e.g. ``Embedding.embeddings``): it saves and restores
its row range under the table's own checkpoint key, so a checkpoint written by
the packed model restores into the plain model and the other way round.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import save_context
from tensorflow.python.training.saving import saveable_object

from hybridtf._src.capture.subclassing import runtime_subclass
from hybridtf._src.distribute import local_broadcast, watchdog
from hybridtf._src.distribute.exchange import gather_member
from hybridtf._src.distribute.layout import ShardLayout
from hybridtf._src.distribute.world import World, current_world
from hybridtf._src.errors import HybridTFError
from hybridtf._src.plan.packing import PackingPlan
from hybridtf._src.rewrite.table_view_ops import VariableLike, checked_gather


class CheckpointLayoutError(HybridTFError, ValueError):
    """A checkpoint's table does not fit the model's table (shape or dtype)."""


def shared_scope(names) -> str:
    """The start of the name scopes of the variables ``names`` (``a/b/embeddings:0``) that all share, or ``""``.

    A packed variable is named under it (``wide/packed_1d_float32_model``), so code that picks
    variables by name or scope (``"wide" in v.name``) picks it with its tables. Keras uniquifies
    names (``wide``, ``wide_1``; layers ``wide_C1``, ``wide_C2``), which such a filter still matches;
    so this is the common prefix of the scope strings, without trailing separators.

    Example:
        >>> shared_scope(["wide/wide_u/embeddings:0", "wide_1/wide_i/embeddings:0"])
        'wide'
    """
    scopes = [name.split(":")[0].rpartition("/")[0] for name in names]
    first, last = min(scopes, default=""), max(scopes, default="")  # their common prefix is everyone's
    n = 0
    while n < len(first) and first[n] == last[n]:
        n += 1
    return first[:n].rstrip("/_-.")


class _ViewSaveable(saveable_object.SaveableObject):
    """A TF1 Saver's entry for a ``TableView``: the table's rows under one key (default: the plain variable's)."""

    def __init__(self, view, name=None):
        name = name or view.name.split(":")[0]
        spec = saveable_object.SaveSpec(
            view.rows_to_save, "", name, dtype=view.dtype, device=view.packed_variable.device
        )
        super().__init__(view, [spec], name)
        self._view = view

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        return self._view._write(restored_tensors[0], read_value=False)


_view_numbers = itertools.count(1)


class TableView(VariableLike, tf.__internal__.tracking.Trackable):
    """One table's rows ``[offset, offset + num_rows)`` inside a packed variable.

    Behaves like the table's variable for reading, assigning and
    checkpointing (key ``<path>/.ATTRIBUTES/VARIABLE_VALUE``, as a variable),
    and for indexing, operators and sparse writes (``VariableLike``).

    When the packed table is sharded over the ranks of a Horovod job
    (``layout``), ``variable`` is this rank's shard: reading gathers the
    table's rows from every rank (a collective: every rank reads), assigning
    and restoring keep this rank's rows. Checkpoints therefore always hold
    the whole table, whatever the number of ranks that wrote or read them.
    """

    # Keras optimizers key variables by ``_unique_id`` (``exclude_from_weight_decay(var_list=...)``): a view
    # answers with the key of the variable it replaced (set by ``optimize``), so exclusions made before
    # packing still name the table.
    _htf_plain_key: str | None = None

    @property
    def _unique_id(self) -> str:
        # else unique per view: two Tables sets may each hold a table "user" (a legacy optimizer keys slots by it)
        return self._htf_plain_key or f"hybridtf_table:{self.table}:{self._htf_view_number}"

    def __init__(
        self,
        variable: tf.Variable,
        offset: int,
        num_rows: int,
        table: str,
        layout: ShardLayout | None = None,
        world: World | None = None,
        name: str | None = None,
    ):
        self._variable = variable
        self._name = name
        self._offset = int(offset)
        self._num_rows = int(num_rows)
        self.table = table
        self._layout = layout
        self._world = world
        self._gathered = None  # the whole table, while PackedTables.gathered() is active
        self._htf_view_number = next(_view_numbers)

    def __repr__(self) -> str:
        # TensorFlow quotes this when a view reaches an API that wants a variable (tape.gradient sources, ...).
        return (
            f"<packed table {self.table!r}: rows {self._offset}..{self._offset + self._num_rows - 1} of variable "
            f"{getattr(self._variable, 'name', '?')!r}, not a tf.Variable itself; for gradients and optimizers use "
            "the packed variable, e.g. htf.keras.layer_variables(model, layers), or keep the table a variable of "
            "its own with optimize(model, exclude=[...])>"
        )

    @property
    def sharded(self) -> bool:
        return self._layout is not None

    @property
    def shape(self) -> tf.TensorShape:
        return tf.TensorShape([self._num_rows, self._variable.shape[-1]])

    @property
    def dtype(self) -> tf.DType:
        return self._variable.dtype

    @property
    def name(self) -> str:
        return self._name or f"{self.table}/embeddings:0"

    @property
    def packed_variable(self) -> tf.Variable:
        return self._variable

    @property
    def row_offset(self) -> int:
        return self._offset

    def local_rows(self) -> tuple[int, int]:
        """``[begin, end)``: this table's rows in ``packed_variable`` (this rank's shard when sharded)."""
        if self._layout is None:
            return self._offset, self._offset + self._num_rows
        local = self._layout.local_slice(self._offset, self._num_rows, self._world.rank)
        return local.start, local.stop

    def read_value(self) -> tf.Tensor:
        if self._layout is None:
            # A slice: its gradient is dense, as a read of the table's own variable (a penalty over the table in an
            # Estimator model_fn updates it densely, as the plain model_fn does).
            return self._variable[self._offset : self._offset + self._num_rows]
        if self._gathered is not None:
            return self._gathered
        return self._gather()

    def rows_as(self, dtype=None) -> tf.Tensor:
        """``read_value()`` for a tensor conversion that may ask for a dtype (checked)."""
        rows = self.read_value()
        if dtype is not None and not tf.as_dtype(dtype).is_compatible_with(rows.dtype):
            raise ValueError(f"embedding table {self.table!r} is {rows.dtype.name}, not {tf.as_dtype(dtype).name}.")
        return rows

    def _gather(self) -> tf.Tensor:
        name = f"hybridtf_gather_{self.table}_every_rank_must_call"
        with watchdog.collective_phase(self._world, watchdog.CHECKPOINT_GATHER, f"table {self.table!r}"):
            return gather_member(self._variable, self._layout, self._world, self._offset, self._num_rows, name)

    def rows_to_save(self) -> tf.Tensor:
        """``read_value()`` for a checkpoint or a copy out (no gradient): the rows gathered, not sliced.

        A slice reads the whole packed variable first, which TensorFlow copies once a sparse op has touched
        it: a checkpoint of every table's rows held one copy of the packed variable per table (a probe's
        28 tables packed in one 640 MB variable reached 22.7 GB in ``save_weights``).
        """
        if self._layout is None:
            return tf.gather(self._variable, tf.range(self._offset, self._offset + self._num_rows, dtype=tf.int64))
        return self.read_value()

    def numpy(self) -> np.ndarray:
        return self.rows_to_save().numpy()

    def __array__(self, dtype=None):  # np.asarray(view), as for a variable
        return np.asarray(self.numpy(), dtype=dtype)

    def gather(self, ids) -> tf.Tensor:
        """Rows ``ids`` of this table with plain TensorFlow ops (used for SavedModel export).

        Raises:
            tf.errors.InvalidArgumentError: an id is outside ``[0, num_rows)``
                (the message names the table).
        """
        if self._layout is not None:
            raise NotImplementedError(
                f"table {self.table!r} is sharded over {self._world.size} ranks; its rows cannot be gathered "
                "outside the packed lookup. Save the weights (model.save_weights on every rank), load them "
                "into the model in one process, and export from there."
            )
        return checked_gather(self._variable, self._offset, self._num_rows, self.table, ids)

    def assign(self, value, use_locking=None, name=None, read_value=True):
        """Writes the table's rows (this rank's shard of them) in place; like ``tf.Variable.assign``, returns
        the new rows with ``read_value`` (the default), else the assignment op (None eagerly)."""
        del use_locking, name
        return self._write(value, read_value, restoring=False)

    def _write(self, value, read_value=True, restoring=True):
        value = tf.convert_to_tensor(value, dtype=self.dtype)
        if not value.shape.is_compatible_with(self.shape):
            if not restoring:
                raise ValueError(
                    f"embedding table {self.table!r} has shape {self.shape.as_list()}; the value assigned has shape "
                    f"{value.shape.as_list()} (assign the whole table, or index the rows to write: table[i].assign)."
                )
            raise CheckpointLayoutError(
                f"table {self.table!r} has shape {self.shape.as_list()} but the value to restore has shape "
                f"{value.shape.as_list()}; the checkpoint was written for a different table layout "
                "(vocabulary size or embedding dim changed)."
            )
        rank = self._world.rank if self._layout is not None else 0
        op = _write_member(self._variable, self._layout, rank, self._offset, self._num_rows, value)
        if not read_value:
            return op
        with tf.control_dependencies([op] if op is not None else []):
            return self.read_value()

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": self.rows_to_save()}

    def _restore_from_tensors(self, restored_tensors):
        return self._write(restored_tensors["VARIABLE_VALUE"], read_value=False)

    def _gather_saveables_for_checkpoint(self):
        # A TF1 Saver (an Estimator model_fn's ``Saver({"emb": layer.embeddings})``) asks for this: a view saves
        # as the variable it stands for, under the Saver's key alone (TensorFlow's default for a Trackable
        # appends its tensor's name: "embVARIABLE_VALUE"). Object-based checkpoints use _serialize_to_tensors.
        return {"VARIABLE_VALUE": lambda name=None: _ViewSaveable(self, name)}

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
    def _distribute_strategy(self):
        # A legacy Keras optimizer's add_slot asks, when a checkpoint restores a slot of the view into it before
        # hybridtf hooked it (keras_legacy_slots moves that slot into the packed one when it hooks it).
        return getattr(self._variable, "_distribute_strategy", None)

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


class DirectTableReadError(HybridTFError, TypeError):
    """The model's own code reads a packed table's variable as a tensor, not through its layer's lookup."""


def _table_view_to_tensor(view: TableView, dtype=None, name=None, as_ref=False):
    """``tf.convert_to_tensor(layer.embeddings)`` of a packed table.

    Outside the optimized model's forward pass (eager inspection, a user's own
    function) this is the table's current rows. Inside it (the record and
    replay passes of a training or inference step) a read of the whole table
    would bypass the packed lookup and its sparse update, so it is refused with
    the fix.
    """
    from hybridtf._src.capture import context

    if context.active() is not None and not tf.executing_eagerly():
        raise DirectTableReadError(
            f"embedding table {view.table!r} is read directly by the model's code: its variable "
            "(`layer.embeddings`) is used as a tensor (e.g. passed to tf.nn.embedding_lookup / "
            "safe_embedding_lookup_sparse, a matmul or tied output weights) instead of through the layer's "
            "call. A packed table serves lookups through its layer only. Leave this table unpacked: "
            f"hybridtf.keras.optimize(model, exclude=[{view.table!r}]), or look it up by calling the layer."
        )
    return view.rows_as(dtype)


# TableView subclasses register theirs with a smaller priority (the Estimator record pass marks its tables there).
tf.register_tensor_conversion_function(TableView, _table_view_to_tensor)


def _assign_rows(var: tf.Variable, value, offset: int, count: int):
    """``var[offset : offset + count] = value`` in place; returns the op (None eagerly). The raw op:
    ``var[...].assign`` also reads the variable back, and a later assignment while that read is alive copies the
    whole variable first (measured: packing two 0.5 GB tables peaked 1.5 GB higher; restoring 20 tables of a
    0.3 GB packed table from a TF checkpoint peaked 0.7 GB above the model instead of 0.3 GB)."""
    return tf.raw_ops.ResourceStridedSliceAssign(
        ref=var.handle,
        begin=tf.constant([offset, 0], tf.int64),
        end=tf.constant([offset + count, int(var.shape[1])], tf.int64),
        strides=tf.constant([1, 1], tf.int64),
        value=value,
    )


def _write_member(var: tf.Variable, layout: ShardLayout | None, rank: int, offset: int, num_rows: int, value):
    """Writes a member's whole ``value`` (rows ``[offset, offset + num_rows)`` of its packed table) into ``var``:
    all of it, or ``rank``'s rows of it into its shard; returns the op (None eagerly)."""
    if layout is None:
        return _assign_rows(var, value, offset, num_rows)
    local = layout.local_slice(offset, num_rows, rank)
    return _assign_rows(var, layout.own_rows(value, offset, num_rows, rank), local.start, local.stop - local.start)


class PackedTables(tf.Module):
    """The variables of all packed tables of a plan, created from initial values.

    Args:
        plan: the packing plan.
        initial_values: table name -> ``[num_rows, dim]`` value (the table's
            current weights: an array or a tf.Variable), for every member of
            every packed table.
        trainable: whether the packed variables are trained.
        release: called as ``release(self, member_names)`` once those members'
            values are copied in (eagerly: after each member, ``self.packed``
            already holding its packed table; in graph mode: after each packed
            table), so that the caller can drop the originals (and its
            references in ``initial_values``). The peak is then about the
            tables not yet copied plus the packed table being built (twice
            the tables when one packed table holds them all).
        world: the Horovod job (default: ``current_world()``). With more
            than one rank, each packed table is sharded (``plan.placement``)
            and ``packed[name]`` is this rank's shard, or replicated; initial
            values are taken from rank 0 (broadcast), so every rank starts
            from the same tables.
        variable_names: packed table name -> the name of its variable in eager
            mode (default: the packed table's name); graph-mode callers name it
            with a variable creator.
    """

    def __init__(
        self,
        plan: PackingPlan,
        initial_values: Mapping,
        trainable: bool = True,
        release: Callable[[PackedTables, list[str]], None] | None = None,
        world: World | None = None,
        variable_names: Mapping[str, str] | None = None,
    ):
        super().__init__(name="hybridtf_packed_tables")
        self.plan = plan
        self.world = world if world is not None else current_world()
        self.packed = {}
        self.layouts: dict[str, ShardLayout | None] = {}
        self._views: dict[str, TableView] = {}
        # Untracked (not part of SavedModels): optimizer state is checkpointed through the optimizer.
        object.__setattr__(self, "_slot_views", {})
        self._slots: list = []
        # Member table -> its L1/L2 penalty (hybridtf._src.rewrite.regularization).
        self.regularizers: dict = {}
        # Set once an optimizer folds the penalties' gradients into its packed updates.
        self.fold_regularization = False
        for pt in plan.packed_tables:
            for m in pt.members:
                shape = tuple(tf.TensorShape(initial_values[m.name].shape).as_list())
                if shape != (m.num_rows, pt.dim):
                    raise ValueError(
                        f"table {m.name!r}: initial value has shape {shape}, plan says {(m.num_rows, pt.dim)}."
                    )
            placement = plan.placement(pt.name, self.world.size)
            layout = ShardLayout(pt.num_rows, self.world.size, plan.shard_strategy) if placement == "sharded" else None
            self.layouts[pt.name] = layout
            rows = layout.local_rows(self.world.rank) if layout else pt.num_rows
            if tf.executing_eagerly():
                # Zeros, then each member's rows copied in place: no concatenated temporary. Each member is
                # released as soon as its rows are in, so its own variable is freed before the next is copied.
                name = (variable_names or {}).get(pt.name, pt.name)
                var = tf.Variable(tf.zeros([rows, pt.dim], pt.dtype), name=name, trainable=trainable)
                self.packed[pt.name] = var
                for m in pt.members:
                    value = tf.cast(initial_values[m.name], pt.dtype)
                    if self.world.distributed:
                        with watchdog.collective_phase(self.world, watchdog.INITIAL_BROADCAST, f"table {m.name!r}"):
                            value = self.world.hvd.broadcast(value, 0, name=f"hybridtf_init_{m.name}")
                    _write_member(var, layout, self.world.rank, m.row_offset, m.num_rows, value)
                    del value
                    if release is not None:
                        release(self, [m.name])
            else:  # graph mode: the initial value must come with the variable's initializer
                parts = []
                for m in pt.members:
                    value = np.asarray(initial_values[m.name]).astype(pt.dtype, copy=False)
                    if layout is not None:
                        value = layout.own_rows(value, m.row_offset, m.num_rows, self.world.rank)
                    parts.append(value)
                self.packed[pt.name] = tf.Variable(np.concatenate(parts, axis=0), name=pt.name, trainable=trainable)
                if release is not None:
                    release(self, [m.name for m in pt.members])
            if layout is not None:  # rank-local: its gradient is never allreduced (distribute/gradients.py)
                object.__setattr__(self.packed[pt.name], "_htf_sharded_table", True)
        if self.sharded:  # Horovod's broadcast_variables (its recipes) must leave this rank's rows alone
            local_broadcast.register(self)

    @property
    def sharded(self) -> bool:
        """Whether any packed table is sharded over the ranks of a Horovod job."""
        return any(layout is not None for layout in self.layouts.values())

    def sharded_variables(self) -> list[tf.Variable]:
        """This rank's shards (model-parallel: their gradients are never allreduced)."""
        return [self.packed[name] for name, layout in self.layouts.items() if layout is not None]

    def local_variables(self) -> list[tf.Variable]:
        """The shards and their registered optimizer slots: rank-local, never broadcast or allreduced."""
        return self.sharded_variables() + list(self._slots)

    def replicated_variables(self) -> list[tf.Variable]:
        """Packed tables kept whole on every rank of a job (data-parallel, gradients allreduced)."""
        if not self.world.distributed:
            return []
        return [self.packed[name] for name, layout in self.layouts.items() if layout is None]

    @contextlib.contextmanager
    def gathered(self):
        """Gathers every sharded table once (a collective: every rank enters it, in the same order).

        Inside, the views read their whole tables from the gathered copies
        (no collective), so that one rank can write a checkpoint alone. Also
        covers the optimizer slot views made with ``slot_view`` (optimizer
        state is checkpointed through them, never as a whole sharded slot).
        """
        tables = [v for v in (self.view(m.name) for pt in self.plan.packed_tables for m in pt.members) if v.sharded]
        slots = [v for v in self._slot_views.values() if v.sharded]
        views = tables + slots
        what = f"{len(tables)} sharded tables" + (f" and {len(slots)} optimizer slots of them" if slots else "")
        try:
            with watchdog.collective_phase(self.world, watchdog.CHECKPOINT_GATHER, what):
                for v in views:
                    v._gathered = v._gather()
            yield
        finally:
            for v in views:
                v._gathered = None

    def register_sharded_slot(self, slot: tf.Variable, model_variable: tf.Variable) -> None:
        """Makes an optimizer slot of a shard checkpoint the whole table's slot (gathered like the table)."""
        for name, var in self.packed.items():
            if var is model_variable and self.layouts[name] is not None:
                slot.__class__ = runtime_subclass(_ShardedSlotMixin, type(slot))
                object.__setattr__(slot, "_htf_layout", self.layouts[name])
                object.__setattr__(slot, "_htf_world", self.world)
                object.__setattr__(slot, "_htf_gathered", None)
                self._slots.append(slot)
                return

    def slot_view(self, slot: tf.Variable, table: str) -> TableView:
        """Table ``table``'s rows of ``slot``, an optimizer slot of its packed table (same rows, same layout).

        Optimizer state is checkpointed through these views in the plain
        model's layout (one slot per table). Create them, on every rank in
        the same order, before ``gathered()``: that is where sharded views
        are gathered.
        """
        key = f"{id(slot)}/{table}"
        if key not in self._slot_views:
            packed_name, offset = self.plan.location(table)
            spec = self.plan.table(table)
            name = f"{slot.name.rsplit('/', 1)[0].rsplit(':', 1)[0]}/{table}:0"
            self._slot_views[key] = TableView(
                slot, offset, spec.num_rows, table, self.layouts[packed_name], self.world, name=name
            )
        return self._slot_views[key]

    def regularized_ranges(self, packed_name: str):
        """This rank's rows of ``packed_name``'s regularized members, or None if it has none.

        Returns:
            ``(ranges, l1, l2)``: int64 ``[R, 2]`` row ranges ``[begin, end)``
            of the (local) packed variable in ascending order, and float32
            ``[R]`` factors.
        """
        layout = self.layouts[packed_name]
        found = []
        for m in self.plan.packed_table(packed_name).members:
            spec = self.regularizers.get(m.name)
            if spec is None:
                continue
            if layout is None:
                begin, end = m.row_offset, m.row_offset + m.num_rows
            else:
                local = layout.local_slice(m.row_offset, m.num_rows, self.world.rank)
                begin, end = local.start, local.stop
            found.append((begin, end, spec.l1, spec.l2))
        if not found:
            return None
        found.sort()
        ranges = np.array([[b, e] for b, e, _, _ in found], dtype=np.int64)
        l1 = np.array([x for _, _, x, _ in found], dtype=np.float32)
        l2 = np.array([x for _, _, _, x in found], dtype=np.float32)
        return ranges, l1, l2

    def members(self, packed_name: str) -> dict[str, tuple[int, int]]:
        """Member table -> (row_offset, num_rows) of packed table ``packed_name``."""
        pt = self.plan.packed_table(packed_name)
        return {m.name: (m.row_offset, m.num_rows) for m in pt.members}

    def view(self, table: str) -> TableView:
        """The TableView of ``table`` (a member of some packed table)."""
        if table not in self._views:
            packed_name, offset = self.plan.location(table)
            spec = self.plan.table(table)
            self._views[table] = TableView(
                self.packed[packed_name], offset, spec.num_rows, table, self.layouts[packed_name], self.world
            )
        return self._views[table]


class _ShardedSlotMixin:
    """Per-instance override of an optimizer slot of a shard: checkpointed as the whole table's slot."""

    def _htf_gather(self):
        layout, name = self._htf_layout, f"hybridtf_gather_slot_{self._shared_name}"
        return gather_member(self, layout, self._htf_world, 0, layout.num_rows, name)

    def _serialize_to_tensors(self):
        value = self._htf_gathered if self._htf_gathered is not None else self._htf_gather()
        return {"VARIABLE_VALUE": value}

    def _restore_from_tensors(self, restored_tensors):
        layout, world = self._htf_layout, self._htf_world
        value = restored_tensors["VARIABLE_VALUE"]
        if value.shape[0] != layout.num_rows:
            raise CheckpointLayoutError(
                f"optimizer slot {self.name} is the slot of a {layout.num_rows}-row packed table, but the "
                f"checkpoint holds {value.shape[0]} rows; the checkpoint was written for a different table layout."
            )
        return self.assign(layout.own_rows(value, 0, layout.num_rows, world.rank))
