"""The functional lookup API (``hybridtf.embedding``) and the id handling all lookups share.

``Tables`` owns a set of embedding tables, packed by a ``PackingPlan`` into a
few variables (``PackedTables``), and runs their lookups like captured Keras
layers do: every ``Tables.lookup`` goes through the capture context, so that
outside any context it runs on its own (one fused chain for that lookup, exact
by itself), and inside ``hybridtf.function`` it is recorded and replayed, all
lookups of a traced step running as one chain per packed table.

The helpers at the top (``placeholder``, ``plain_lookup``, ``own_lookup``;
``prepare_ids`` from ``capture/ids.py``) are shared with the ``EmbeddingBag`` layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as eager_context
from tensorflow.python.saved_model import save_context

from hybridtf._src.capture import context
from hybridtf._src.capture.context import LookupRequest, record_pass_runs_lookups
from hybridtf._src.capture.ids import prepare_ids
from hybridtf._src.distribute.world import mirroring_strategy, strategy_fix
from hybridtf._src.plan.packing import PackingPlan, plan_packing
from hybridtf._src.plan.tables import TableSpec
from hybridtf._src.rewrite.lookup_chain import packed_lookup
from hybridtf._src.rewrite.packed_storage import PackedTables
from hybridtf._src.rewrite.runtime import PackedRuntime
from hybridtf._src.rewrite.table_view_ops import checked_gather


def placeholder(ids, combiner: str, dim: int, dtype: tf.DType, direct_fn=None):
    """The stand-in of a lookup's output while recording: zeros, or ``direct_fn()`` (see above).

    Example:
        >>> placeholder(tf.constant([1, 2]), "none", 4, tf.float32).shape
        TensorShape([2, 4])
    """
    if direct_fn is not None and record_pass_runs_lookups():
        return direct_fn()
    if combiner != "none":
        return tf.zeros(tf.stack([ids.nrows(out_type=tf.int32), dim]), dtype)
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(tf.zeros(tf.stack([tf.size(ids.flat_values), dim]), dtype))
    return tf.zeros(tf.concat([tf.shape(ids), [dim]], axis=0), dtype)


def plain_lookup(variable, offset: int, num_rows: int, table: str, ids, combiner: str):
    """A lookup with plain TensorFlow ops only (for SavedModel export).

    Rows ``[offset, offset + num_rows)`` of ``variable`` are the table; same
    math as the fused chain (sum / mean / sqrtn over bags, empty bags give
    zeros), so exported models load without hybridtf's op library.

    Example:
        >>> v = tf.Variable(tf.ones([5, 2]))
        >>> plain_lookup(v, 0, 5, "t", tf.ragged.constant([[1, 2], []]), "sum").numpy().tolist()
        [[2.0, 2.0], [0.0, 0.0]]
    """
    if combiner == "none":
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(checked_gather(variable, offset, num_rows, table, ids.flat_values))
        return checked_gather(variable, offset, num_rows, table, ids)
    rows = checked_gather(variable, offset, num_rows, table, ids.flat_values)
    sums = tf.math.unsorted_segment_sum(rows, ids.value_rowids(), ids.nrows())
    if combiner == "sum":
        return sums
    lengths = tf.cast(ids.row_lengths(), sums.dtype)
    scale = lengths if combiner == "mean" else tf.sqrt(lengths)
    return tf.math.divide_no_nan(sums, scale[:, None])


def own_lookup(variable, table: str, num_rows: int, requests: Sequence[LookupRequest], name: str | None = None):
    """Runs ``requests`` of one table that has a variable of its own, as one fused chain.

    Example:
        >>> v = tf.Variable(tf.ones([5, 2]))
        >>> own_lookup(v, "t", 5, [LookupRequest("t", tf.constant([1, 2]))])[0].shape
        TensorShape([2, 2])
    """
    return packed_lookup(variable, {table: (0, num_rows)}, list(requests), name=name or table)


# ---------------------------------------------------------------------------------------------
# Functional API


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One embedding table of a ``Tables`` set.

    Attributes:
        name: unique name of the table (its checkpoint key inside ``Tables``).
        num_rows: vocabulary size; ids are in ``[0, num_rows)``.
        dim: embedding width.
        initializer: a Keras initializer (name, instance or config), a
            callable ``(shape, dtype) -> values``, or an array-like of shape
            ``[num_rows, dim]`` holding the initial values.
        dtype: ``"float32"`` (the only dtype supported so far).

    Raises:
        ValueError: a field is out of range (the message names the table).

    Example:
        >>> cfg = TableConfig("user_id", num_rows=1000, dim=16, initializer="glorot_uniform")
        >>> cfg.spec().pack_key
        (16, 'float32', 'model')
    """

    name: str
    num_rows: int
    dim: int
    initializer: Any = "uniform"
    dtype: str = "float32"

    def __post_init__(self):
        self.spec()  # validates name, num_rows, dim, dtype
        if self.dtype != "float32":
            raise ValueError(f"table {self.name!r}: dtype {self.dtype!r} is not supported yet (float32 only).")

    def spec(self) -> TableSpec:
        """The planner's view of this table (all tables of a ``Tables`` set share one optimizer).

        Example:
            >>> TableConfig("user", 1000, 16).spec().num_rows
            1000
        """
        return TableSpec(self.name, self.num_rows, self.dim, self.dtype, "model")

    def initial_value(self) -> np.ndarray:
        """The table's initial values, ``[num_rows, dim]`` (computed eagerly, also in graph mode).

        Raises:
            ValueError: an array initializer of the wrong shape.

        Example:
            >>> TableConfig("t", 2, 3, initializer="zeros").initial_value()
            array([[0., 0., 0.],
                   [0., 0., 0.]], dtype=float32)
        """
        shape = (self.num_rows, self.dim)
        init = self.initializer
        if isinstance(init, (np.ndarray, list, tuple)) or tf.is_tensor(init):
            value = np.asarray(init.numpy() if hasattr(init, "numpy") else init, dtype=self.dtype)
            if value.shape != shape:
                raise ValueError(f"table {self.name!r}: initial values have shape {value.shape}, expected {shape}.")
            return value
        if not callable(init) or isinstance(init, dict):
            init = tf.keras.initializers.get(init)
        with tf.init_scope(), eager_context.eager_mode():
            value = np.asarray(init(shape=shape, dtype=tf.as_dtype(self.dtype)), dtype=self.dtype)
        if value.shape != shape:
            raise ValueError(f"table {self.name!r}: the initializer returned shape {value.shape}, expected {shape}.")
        return value


class _TablesRuntime:
    """Runs lookups of a ``Tables`` set: one chain per packed table, one per unpacked table."""

    def __init__(self, plan: PackingPlan, storage: PackedTables, own: Mapping[str, tf.Variable]):
        self.plan = plan
        self.storage = storage
        self.packed = PackedRuntime(plan, storage)
        self.own = own

    def lookup(self, requests: Sequence[LookupRequest]) -> list:
        outputs: list = [None] * len(requests)
        packed = [i for i, r in enumerate(requests) if r.table not in self.own]
        if packed:
            for i, out in zip(packed, self.packed.lookup([requests[i] for i in packed])):
                outputs[i] = out
        for name, variable in self.own.items():
            indices = [i for i, r in enumerate(requests) if r.table == name]
            if indices:
                results = own_lookup(variable, name, variable.shape[0], [requests[i] for i in indices])
                for i, out in zip(indices, results):
                    outputs[i] = out
        return outputs


def _check_plan(plan: PackingPlan, specs: Sequence[TableSpec]) -> None:
    have = {s.name: s for s in specs}
    planned = {t.name: t for t in plan.tables}
    for name in have.keys() - planned.keys():
        raise ValueError(f"table {name!r} is not in the given plan; plan the same tables as the TableConfigs.")
    for name in planned.keys() - have.keys():
        raise ValueError(f"the plan has table {name!r}, which is not one of the TableConfigs.")
    for name, spec in have.items():
        p = planned[name]
        if (p.num_rows, p.dim, p.dtype) != (spec.num_rows, spec.dim, spec.dtype):
            raise ValueError(
                f"the plan has table {name!r} as {p.num_rows} x {p.dim} {p.dtype}, its TableConfig says "
                f"{spec.num_rows} x {spec.dim} {spec.dtype}."
            )


class Tables(tf.Module):
    """A set of embedding tables, packed into a few variables, with fused lookups.

    The tables are planned with the packing planner (tables of the same dim
    share one packed variable, split into shards by CalcVParam) unless a
    ``plan`` is given; tables the plan leaves unpacked keep a variable of
    their own. Checkpoints stay per table: ``tf.train.Checkpoint(tables=t)``
    writes ``tables/<table name>/.ATTRIBUTES/VARIABLE_VALUE`` for every
    table, whatever the packing, so a checkpoint restores into another
    packing or into plain per-table variables tracked under the same names.

    ``lookup`` works eagerly, in ``tf.function`` and in TF1-style graphs
    (Estimator model_fns). Each lookup on its own runs one fused chain (pack
    ids -> Unique&Partition -> gather -> Stitch&Combine); inside
    ``hybridtf.function`` all lookups of a step run together, one chain per
    packed table. Train the tables with ``tables.trainable_variables``.

    Dynamic tables (``hybridtf.embedding.DynamicTableConfig``: no vocabulary,
    any int64 id, a HybridHash store with hot/cold tiers) can sit next to the
    fixed ones. Their lookups find-or-insert ids when ``training`` and run on
    their own (one HybridHash chain each, see ``caching/dynamic_table.py``);
    train them with an optimizer passed through
    ``hybridtf.keras.dynamic_optimizer`` (Keras, or ``tf.compat.v1.train`` in
    Estimator model_fns); checkpoints hold their ids, rows, optimizer slots
    and counts under ``tables/<table name>``.

    Args:
        tables: the ``TableConfig`` / ``DynamicTableConfig`` of every table
            (unique names).
        plan: a packing plan of exactly the fixed-vocabulary tables (e.g.
            edited and loaded from JSON); planned automatically when None.
        name: the module's name.

    Raises:
        ValueError: duplicate table names, or a plan that does not match.
        TypeError: an entry of ``tables`` is not a ``TableConfig`` or ``DynamicTableConfig``.

    Example:
        >>> tables = Tables([TableConfig("user", 1000, 8), TableConfig("item", 5000, 8)])
        >>> user = tables.lookup("user", tf.constant([3, 7]))                          # [2, 8]
        >>> items = tables.lookup("item", tf.ragged.constant([[1, 2], []]), "mean")    # [2, 8]
        >>> print(tables.plan)
    """

    def __init__(self, tables: Sequence[TableConfig], plan: PackingPlan | None = None, name: str = "hybridtf_tables"):
        from hybridtf._src.caching.dynamic_table import DynamicTable, DynamicTableConfig

        super().__init__(name=name)
        strategy = mirroring_strategy()
        if strategy is not None:
            raise ValueError(
                f"hybridtf.embedding.Tables {name!r} is created under {type(strategy).__name__}, {strategy_fix()}"
            )
        entries = list(tables)
        for c in entries:
            if not isinstance(c, (TableConfig, DynamicTableConfig)):
                raise TypeError(f"Tables takes TableConfig or DynamicTableConfig entries, got {type(c).__name__}.")
        if not entries:
            raise ValueError("Tables needs at least one TableConfig.")
        names = [c.name for c in entries]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"table name(s) {', '.join(map(repr, dupes))} are used twice; table names must be unique.")
        configs = [c for c in entries if isinstance(c, TableConfig)]
        self._dynamic = {c.name: DynamicTable(c) for c in entries if isinstance(c, DynamicTableConfig)}
        self._order = names
        specs = [c.spec() for c in configs]
        if plan is None:
            plan = plan_packing(specs)
        else:
            _check_plan(plan, specs)
        values = {c.name: c.initial_value() for c in configs}
        unpacked = [u.name for u in plan.unpacked]
        with tf.init_scope():
            storage = PackedTables(plan, {n: v for n, v in values.items() if n not in unpacked})
            own = {n: tf.Variable(values[n], name=n) for n in unpacked}
        self._configs = {c.name: c for c in configs}
        self._storage = storage
        self._own = own
        self._views = {c.name: storage.view(c.name) for c in configs if c.name not in own}
        self._htf_runtime = _TablesRuntime(plan, storage, own)

    @property
    def plan(self) -> PackingPlan:
        """The packing plan of these tables."""
        return self._storage.plan

    @property
    def table_names(self) -> list[str]:
        """The tables' names, in configuration order."""
        return list(self._order)

    @property
    def dynamic_tables(self) -> dict:
        """The dynamic tables by name (``DynamicTable``: ``.table`` is the HybridHash store, ``.stats()``)."""
        return dict(self._dynamic)

    def table(self, name: str):
        """Table ``name``'s weights: a ``TableView`` of its rows, or its own variable if unpacked.

        Both read (``read_value()``, ``numpy()``) and assign (``assign(value)``).

        Raises:
            ValueError: no table is called ``name``.

        Example:
            >>> tables.table("user").numpy().shape
            (1000, 8)
        """
        self._config(name)
        return self._own[name] if name in self._own else self._views[name]

    def _config(self, name: str) -> TableConfig:
        config = self._configs.get(name) if isinstance(name, str) else None
        if config is None:
            if isinstance(name, str) and name in self._dynamic:
                raise ValueError(
                    f"table {name!r} of {self.name!r} is a dynamic (HybridHash) table: it has no weights variable; "
                    f"use tables.dynamic_tables[{name!r}].table (export(), stats())."
                )
            shown = ", ".join(map(repr, self._order[:10])) + (", ..." if len(self._order) > 10 else "")
            raise ValueError(f"no embedding table named {name!r} in {self.name!r} (tables: {shown}).")
        return config

    @tf.autograph.experimental.do_not_convert
    def lookup(self, name: str, ids, combiner: str = "none", training: bool | None = None):
        """Looks up ``ids`` in table ``name``.

        Args:
            name: the table.
            ids: one-hot ids (``combiner="none"``): an int tensor of any shape
                or a ``tf.RaggedTensor``; output ``ids.shape + [dim]`` (ragged
                for ragged ids). Multi-hot bags (``"sum" | "mean" | "sqrtn"``):
                a rank-2 ``tf.RaggedTensor`` / ``tf.SparseTensor`` or a dense
                ``[batch, L]`` tensor (every entry counts); output
                ``[batch, dim]``, zeros for empty bags. A SparseTensor's row
                ``i`` bags its values at ``[i, j]`` for any ``j``, its indices
                in any order, as ``tf.nn.safe_embedding_lookup_sparse`` takes them.
            combiner: ``"none" | "sum" | "mean" | "sqrtn"``.
            training: dynamic tables only: True (and None) inserts unseen ids,
                counts them for Algorithm 1 and makes the rows trainable;
                False only reads (an unseen id gets its initial row and is
                not stored). Pass ``mode == tf.estimator.ModeKeys.TRAIN`` in
                model_fns. Fixed tables ignore it.

        Returns:
            The embeddings.

        Raises:
            ValueError: unknown table or combiner, or bags not of rank 2.
            TypeError: ids of an unsupported type or dtype.
            tf.errors.InvalidArgumentError: (when run) an id is outside
                ``[0, num_rows)``; the message names the table.

        Example:
            >>> emb = tables.lookup("item", tf.sparse.from_dense([[1, 0], [2, 3]]), combiner="sum")
        """
        if isinstance(name, str) and name in self._dynamic:
            return self._dynamic[name].lookup(ids, combiner, training is None or bool(training))
        config = self._config(name)
        ids = prepare_ids(ids, combiner, name)
        if save_context.in_save_context():
            return self._plain_lookup(name, ids, combiner)
        request = LookupRequest(name, ids, combiner, owner=self)

        def direct():
            return self._htf_runtime.lookup([request])[0]

        return context.dispatch(
            request, lambda: placeholder(ids, combiner, config.dim, tf.as_dtype(config.dtype), direct), direct
        )

    def _plain_lookup(self, name, ids, combiner):
        if name in self._own:
            variable = self._own[name]
            return plain_lookup(variable, 0, variable.shape[0], name, ids, combiner)
        view = self._views[name]
        return plain_lookup(view.packed_variable, view.row_offset, view.shape[0], name, ids, combiner)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = {name: self.table(name) for name in self._configs}
        children.update({name: t.table for name, t in self._dynamic.items()})
        if save_type == "savedmodel":  # traced functions capture the packed variables
            children["hybridtf_packed_tables"] = self._storage
        return children


@tf.autograph.experimental.do_not_convert
def lookup(tables: Tables, name: str, ids, combiner: str = "none", training: bool | None = None):
    """Functional form of ``tables.lookup(name, ids, combiner, training)``.

    Example:
        >>> emb = lookup(tables, "user", tf.constant([3, 7]))
    """
    if not isinstance(tables, Tables):
        raise TypeError(
            f"lookup() takes a hybridtf.embedding.Tables as its first argument, got {type(tables).__name__}."
        )
    return tables.lookup(name, ids, combiner, training)
