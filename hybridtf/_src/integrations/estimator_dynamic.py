"""Dynamic (HybridHash) tables created inside a wrapped Estimator model_fn.

A ``DynamicEmbedding`` layer or a ``hybridtf.embedding.Tables`` dynamic table
built by the model_fn has, in the TF1 graph, a HybridHash resource and two
per-step buffers (the step's distinct ids and a trainable variable of their
rows). After the model_fn's real pass, ``finish_graph``:

* moves the buffers from ``GLOBAL_VARIABLES`` (and ``TRAINABLE_VARIABLES``,
  once the model_fn built its gradients) to ``LOCAL_VARIABLES``: they are
  initialized with the local variables and never checkpointed, broadcast or
  warm-started (they hold one step's rows, the table holds the state);
* registers one ``TableSaveable`` per table in ``SAVEABLE_OBJECTS``, so the
  Estimator's Saver (hybridtf's or the default one) writes the table's export
  (hot tier written back first): ``hybridtf_dynamic/<table>/{ids, rows,
  slots, counts, slot_init, step, table_name}``; restoring imports it (the
  name and the dim are checked) and rebuilds the hot tier from the counts;
* adds each table's flush to ``CACHE_MAINTENANCE`` (``CacheMaintenanceHook``
  runs it every N steps and when training ends) and its statistics op to
  the graph's ``EstimatorReport`` (``StatsHook`` logs hit ratios, sizes,
  inserts and evictions);
* under Horovod with more than one rank, ``DynamicEmbedding`` tables are
  sharded by id (``distribute/dynamic_exchange.py``): every rank saves the
  whole table (gathered, so every rank must save at the same steps, e.g.
  each with its own model_dir as for sharded static tables) and a restore
  or warm start keeps the ids the rank owns; so are ``hybridtf.embedding.Tables``
  dynamic tables created by the model_fn. A table that is not sharded (built
  before ``hvd.init()``) is refused above one rank, by name;
* in TRAIN mode, checks that every trainable dynamic table is looked up
  for training and has a fused update in the graph: a table read for
  inference (Keras leaves ``training`` unset in a model_fn) or whose buffer
  went through a plain optimizer would silently not learn.

``warm_start_from`` imports the selected tables from the warm-start
checkpoint (``estimator_dynamic_warm_start``). After the graph is built,
``check_checkpoint`` compares the dynamic tables of the model_dir's latest
checkpoint with the model_fn's, so that a restore into a model whose tables
differ fails with a message naming the tables.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object

from hybridtf._src.capture.context import CaptureError
from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.distribute.world import current_world
from hybridtf._src.integrations import estimator_dynamic_warm_start, estimator_end_of_data
from hybridtf._src.integrations.estimator_hooks import CACHE_MAINTENANCE

PREFIX = estimator_dynamic_warm_start.PREFIX  # checkpoint keys: <PREFIX>/<table>/<field>
_FIELDS = (*estimator_dynamic_warm_start.FIELDS, "table_name")
_APPLY_OPS = frozenset(
    f"HybridTF>HybridHashApply{kind}{hints}" for kind in ("Sgd", "Adagrad", "Adam") for hints in ("", "Records")
)


class TableSaveable(saveable_object.SaveableObject):
    """A HybridHash table in a name-based (TF1 Saver) checkpoint: its export, one entry per field.

    Args:
        table: a ``HybridHashTable`` of the current graph.
    """

    def __init__(self, table):
        self._table = table
        name = f"{PREFIX}/{table.name}"
        world = table.world
        export = dynamic_exchange.full_export(table, world) if world.distributed else table.export()
        tensors = [*export, tf.constant(table.name)]
        specs = [saveable_object.SaveSpec(t, "", f"{name}/{field}") for t, field in zip(tensors, _FIELDS)]
        # Named after the handle op: the SAVEABLE_OBJECTS collection is exported with SavedModels by op name.
        super().__init__(table.resource_handle, specs, table.resource_handle.op.name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        ids, rows, slots, counts, slot_init, step, saved_name = restored_tensors
        check = tf.debugging.assert_equal(
            saved_name,
            tf.constant(self._table.name),
            message=f"HybridHash table {self._table.name!r}: the checkpoint entry holds another table; restore a "
            "checkpoint of this model_fn (same table names)",
        )
        world = self._table.world
        if world.distributed:  # the whole table was saved: keep the ids this rank owns
            ids, rows, slots, counts = dynamic_exchange.own_part(ids, rows, slots, counts, world)
        with tf.control_dependencies([check]):
            return self._table.import_(ids, rows, slots, counts, slot_init, step)


def dynamic_owners(graph: tf.Graph) -> list:
    """The dynamic tables (layers or ``Tables`` entries) whose buffers live in ``graph``, in creation order."""
    found, seen = [], set()
    keys = (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    for key in keys:
        for var in graph.get_collection(key):
            owner = getattr(var, "_htf_dynamic_embedding", None)
            if owner is not None and id(owner) not in seen:
                seen.add(id(owner))
                found.append(owner)
    return found


def _move_to_local(graph: tf.Graph, variables) -> None:
    """Local variables from now on; out of TRAINABLE_VARIABLES too (the gradients exist), so that
    ``warm_start_from`` (which selects trainable variables by default) does not look them up."""
    local = graph.get_collection_ref(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    for key in (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES):
        ref = graph.get_collection_ref(key)
        ref[:] = [v for v in ref if not any(v is var for var in variables)]
    for var in variables:
        if not any(v is var for v in local):
            local.append(var)


def _updated_handles(graph: tf.Graph) -> set:
    """Names of the HybridHash handle ops that a fused update of ``graph`` writes to."""
    names = set()
    for op in graph.get_operations():
        if op.type in _APPLY_OPS:
            names.add(op.inputs[0].op.name)
    return names


def finish(spec, graph: tf.Graph, mode, report, config):
    """What ``estimator.build`` calls after the model_fn: ``finish_graph``, ``check_checkpoint``, warm start.

    Returns:
        ``spec``, with a Scaffold that warm-starts the dynamic tables when the calling Estimator warm-starts.
    """
    owners = finish_graph(graph, mode, report)
    check_checkpoint(owners, config)
    spec = estimator_end_of_data.with_hook(spec, graph, mode)
    with graph.as_default():
        return estimator_dynamic_warm_start.apply(spec, owners, mode)


def finish_graph(graph: tf.Graph, mode, report) -> list:
    """Checkpoints, maintenance, statistics and checks for the dynamic tables of ``graph`` (see above).

    Returns:
        The dynamic tables' owners found.

    Raises:
        CaptureError: (TRAIN) a dynamic table has no fused update; the message names it and the fix.
    """
    owners = dynamic_owners(graph)
    if not owners:
        return owners
    world = current_world()
    unsharded = [
        o.table.name for o in owners if not o.table.world.distributed and not getattr(o.table, "serving_only", False)
    ]
    if world.size > 1 and unsharded:
        raise CaptureError(
            f"hybridtf.estimator: dynamic table(s) {unsharded} under Horovod with {world.size} ranks: "
            "they were built before hvd.init(), so they are not sharded over the ranks and each rank would train "
            "its own copy. Call hvd.init() before the Estimator builds its graph (tables created by the model_fn "
            "are then sharded by id over the ranks), or train them in one process."
        )
    updated = _updated_handles(graph) if mode == tf.estimator.ModeKeys.TRAIN else set()
    with graph.as_default():
        for owner in owners:
            table = owner.table
            name = table.name
            buffers = [owner._rows_buffer, owner._ids_buffer]
            if getattr(owner, "_received_ids", None) is not None:
                buffers.append(owner._received_ids)
            _move_to_local(graph, buffers)
            if getattr(table, "serving_only", False):  # PREDICT: plain variables, restored by name (serving.py)
                continue
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, TableSaveable(table))
            with tf.name_scope(f"hybridtf_cache/{name}"):
                tf.compat.v1.add_to_collection(CACHE_MAINTENANCE, table.flush())
                report.dynamic_tables[name] = table.stats_tensor()
            if mode == tf.estimator.ModeKeys.TRAIN and getattr(owner, "trainable", True):
                _check_trained(owner, name, graph, updated)
    return owners


def _check_trained(owner, name: str, graph: tf.Graph, updated: set) -> None:
    if getattr(owner, "_training_graph", None) is not graph:
        raise CaptureError(
            f"hybridtf.estimator: dynamic table {name!r} is only read (an inference lookup) in this TRAIN graph, so "
            "it would neither store new ids nor learn. Call the layer with training=(mode == "
            "tf.estimator.ModeKeys.TRAIN) (Keras does not set it in a model_fn), or set layer.trainable = False "
            "to keep the table frozen."
        )
    if owner.table.resource_handle.op.name not in updated:
        raise CaptureError(
            f"hybridtf.estimator: dynamic table {name!r} is looked up for training but its fused update is not in "
            "the graph, so it would not learn. Pass the optimizer through hybridtf.keras.dynamic_optimizer(...) "
            "(tf.compat.v1.train GradientDescentOptimizer / AdagradOptimizer / AdamOptimizer) before minimize()."
        )


def _checkpoint_tables(model_dir) -> dict | None:
    """``{table name: dim}`` of the dynamic tables in ``model_dir``'s latest checkpoint (None: no checkpoint)."""
    if not model_dir:
        return None
    path = tf.train.latest_checkpoint(model_dir)
    if path is None:
        return None
    tables = {}
    for key, shape in tf.train.list_variables(path):
        if key.startswith(PREFIX + "/") and key.endswith("/rows") and len(shape) == 2:
            tables[key[len(PREFIX) + 1 : -len("/rows")]] = int(shape[1])
    return tables


def check_checkpoint(owners, config) -> None:
    """Raises a ValueError when ``config.model_dir``'s checkpoint holds other dynamic tables than ``owners``.

    Both must have the same table names and dims (the checkpoint is restored
    into the graph about to run); a model_dir without a checkpoint passes.
    """
    mine = {o.table.name: o.table.config.dim for o in owners}
    if not mine:
        return
    saved = _checkpoint_tables(getattr(config, "model_dir", None))
    if saved is None or saved == mine:
        return
    missing = sorted(set(mine) - set(saved))
    extra = sorted(set(saved) - set(mine))
    dims = sorted(n for n in set(mine) & set(saved) if mine[n] != saved[n])
    problems = []
    if missing:
        problems.append(f"the model_fn's dynamic table(s) {missing} are not in it")
    if extra:
        problems.append(f"it holds dynamic table(s) {extra} the model_fn does not declare")
    for n in dims:
        problems.append(f"table {n!r} has dim {saved[n]} there but {mine[n]} in the model_fn")
    raise ValueError(
        f"hybridtf.estimator: the checkpoint in {config.model_dir!r} does not match this model_fn's dynamic "
        f"tables: {'; '.join(problems)}. Restore it into the model_fn that wrote it (same table names and dims), "
        "or train the changed model in a new model_dir."
    )
