"""Name-based checkpoints of a wrapped model_fn in the plain model_fn's layout.

Estimator saves with ``tf.compat.v1.train.Saver``, which keys every variable
by its name. A packed variable, and each optimizer slot of it (a variable
named ``<packed name>/<slot>`` of the same shape, as every TF1 and Keras
optimizer names slots), is written as one entry per member table under the
plain model_fn's names: ``<layer>/embeddings`` and
``<layer>/embeddings/<slot>``. Checkpoints therefore move between the wrapped
and the plain model_fn (and between packings) in both directions.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import os

import tensorflow as tf
from tensorflow.python.training import training_util
from tensorflow.python.training.saving import saveable_object

from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.exchange import gather_member
from hybridtf._src.integrations import atomic_checkpoint, estimator_end_of_data

_log = logging.getLogger("hybridtf")


class _OneRead:
    """The variable's value, read once per graph for all of its entries.

    A variable a sparse op has touched is in copy-on-read mode: each read copies it whole.
    Read once per entry, a checkpoint of N tables packed together held N copies of the
    packed variable while it was written; sliced from one read, it holds one (the aligned
    row slices share that read's buffer). Eagerly, each call reads (a value is not reused).
    """

    def __init__(self, variable):
        self._variable = variable
        self._graph = self._read = None  # the graph of the last read, and that read

    def __call__(self):
        if tf.executing_eagerly():
            return self._variable.read_value()
        graph = tf.compat.v1.get_default_graph()
        if self._graph is not graph:
            with tf.control_dependencies(None):  # not tied to whichever entry asked first
                self._graph, self._read = graph, self._variable.read_value()
        return self._read


class PackedSaveable(saveable_object.SaveableObject):
    """Saves a packed variable (or a slot of it) as one checkpoint entry per member table.

    Args:
        variable: the packed variable or slot, ``[rows, dim]``.
        parts: ``(checkpoint key, row offset, num rows)`` of every member,
            covering all rows of ``variable``.
    """

    def __init__(self, variable, parts, shard=None):
        parts = sorted(parts, key=lambda p: p[1])
        self._shard = shard  # (ShardLayout, World) when ``variable`` is this rank's shard
        rows = 0
        expected = shard[0].num_rows if shard is not None else variable.shape[0]
        for _, offset, num in parts:
            if offset != rows:
                raise ValueError(f"packed variable {variable.name}: members do not tile its rows at row {rows}.")
            rows += num
        if expected is not None and rows != expected:
            raise ValueError(f"packed variable {variable.name}: members cover {rows} of its {expected} rows.")
        self._parts = parts
        self._variable = variable
        specs = []
        whole = _OneRead(variable)
        for key, offset, num in parts:

            def tensor(offset=offset, num=num):
                if shard is None:  # slices of one read (see _OneRead), as the shard's gathers below
                    return whole()[offset : offset + num]
                # the gather is a collective: once it is done every rank joined, and the save's write is not timed
                return watchdog.joined_marker(gather_member(whole(), *shard, offset, num))

            specs.append(saveable_object.SaveSpec(tensor, "", key, dtype=variable.dtype, device=variable.device))
        super().__init__(variable, specs, variable.op.name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        dim = self._variable.shape[1]
        checks = []
        for (key, _, num), value in zip(self._parts, restored_tensors):
            if value.shape.rank is not None and value.shape[0] is not None and value.shape[0] != num:
                raise ValueError(f"checkpoint entry {key!r} has {value.shape[0]} rows, the model's table has {num}.")
            # A graph's restored tensors have no static shape: checked when the restore runs (a wrong-sized
            # entry would otherwise resize the packed variable and fail later in a lookup).
            checks.append(
                tf.debugging.assert_equal(
                    tf.shape(value, out_type=tf.int64),
                    tf.constant([num, dim], tf.int64),
                    message=f"checkpoint entry {key!r} is not the model's table of shape [{num}, {dim}]: the "
                    "checkpoint was written by a model with another vocabulary size or dim for this table "
                    "(restore a checkpoint of this model, or warm-start only the tables that match)",
                )
            )
        with tf.control_dependencies(checks):
            values = [tf.identity(v) for v in restored_tensors]
        if self._shard is not None:  # keep this rank's rows of every member (consecutive local rows)
            layout, world = self._shard
            values = [layout.own_rows(v, offset, num, world.rank) for (_, offset, num), v in zip(self._parts, values)]
        return self._variable.assign(tf.concat(values, axis=0)).op


def _split_entry(key: str, var, packed: dict, members: dict, shards: dict, recorded: dict | None = None):
    """``var`` saved under ``key``, or a ``PackedSaveable`` when ``key`` names a packed variable or one shaped like it.

    A key of a packed variable ``p`` (``p`` itself, ``p/<slot>``, ``<optimizer>/p/<slot>``,
    ``p/ExponentialMovingAverage``: every TF1 and Keras optimizer, and the moving averages,
    name their variables so) is written as one entry per member table, ``p`` replaced by the
    table's plain key. For the packed variable itself, ``recorded`` (plain key -> the key the plain
    model_fn's own dict-keyed Saver gave that table's variable) wins: a moving averages' restore of
    some tables (``ema.variables_to_restore(deep_variables)``) reads each table where the plain
    model_fn does, whichever of them the packed variable holds.
    """
    if not isinstance(var, tf.Variable):
        return var
    recorded = recorded or {}
    for name, packed_var in packed.items():
        head, found, rest = f"/{key}/".partition(f"/{name}/")
        if found and var.shape == packed_var.shape:
            own = var is packed_var
            parts = [
                (recorded.get(member, member) if own and recorded else f"{head}/{member}/{rest}".strip("/"), off, num)
                for member, off, num in members[name]
            ]
            return PackedSaveable(var, parts, shards.get(name))
    return var


def _tiles(parts, rows) -> bool:
    at = 0
    for _, offset, num in sorted(parts, key=lambda p: p[1]):
        if offset != at:
            return False
        at += num
    return at == rows


def view_entries(var_list):
    """A ``tf.compat.v1.train.Saver``'s ``var_list`` with packed tables' views saved as the plain variables.

    A view (``layer.embeddings`` in a wrapped model_fn) is saved under its dict key, or in a list under
    the plain variable's name. The views of all the tables of one packed variable become one
    ``PackedSaveable`` (it restores the whole variable, so a Scaffold's Saver can restore an
    uninitialized one, as the plain Saver restores the tables' variables); a view of some of its tables
    saves and restores only its rows (the variable initialized first: a Saver of pretrained tables
    restored in ``Scaffold.init_fn``, or a side export).
    """
    from hybridtf._src.rewrite.packed_storage import TableView

    as_dict = isinstance(var_list, dict)
    items = list(var_list.items()) if as_dict else [(None, v) for v in tf.nest.flatten(var_list)]
    if not any(isinstance(v, TableView) for _, v in items):
        return var_list
    groups: dict = {}  # id(packed variable) -> [(key, view)]
    kept = []
    for key, value in items:
        if isinstance(value, TableView):
            groups.setdefault(id(value.packed_variable), []).append((key or value.name.split(":")[0], value))
        else:
            kept.append((key, value))
    for views in groups.values():
        view = views[0][1]
        parts = [(key, v.row_offset, int(v.shape[0])) for key, v in views]
        shard = (view._layout, view._world) if view.sharded else None
        rows = shard[0].num_rows if shard is not None else view.packed_variable.shape[0]
        if _tiles(parts, rows):
            kept.append((views[0][0], PackedSaveable(view.packed_variable, parts, shard)))
        else:
            kept.extend(views)  # each view's own entry (TableView._gather_saveables_for_checkpoint)
    return dict(kept) if as_dict else [value for _, value in kept]


def _own_saver(spec, savers: list):
    """The model_fn's own Saver: its Scaffold's, else the first of the graph's ``SAVERS`` collection (or None)."""
    scaffold = getattr(spec, "scaffold", None)
    if scaffold is not None and scaffold.saver is not None:
        return scaffold.saver
    return savers[0] if savers else None


def recorded_keys(record_spec, record_graph, tables: dict) -> dict:
    """Plain key -> the key of that table in the plain model_fn's own dict-keyed Saver (empty: no such Saver).

    Args:
        record_spec: the plain model_fn's EstimatorSpec (the record pass).
        record_graph: its graph.
        tables: plain checkpoint key -> the table's variable in ``record_graph``.
    """
    own = _own_saver(record_spec, record_graph.get_collection(tf.compat.v1.GraphKeys.SAVERS))
    var_list = getattr(own, "_var_list", None)
    if not isinstance(var_list, dict):
        return {}
    by_var = {}
    for key, var in var_list.items():
        if isinstance(var, tf.Variable):
            by_var.setdefault(id(var), key)
    return {plain: by_var.get(id(var), plain) for plain, var in tables.items()}


def saver_var_list(packed: dict, members: dict, shards: dict | None = None, var_list=None, recorded=None):
    """The Saver's var_list, packed variables and their slots split per table.

    Args:
        packed: packed variable op name -> packed variable.
        members: packed variable op name -> [(checkpoint key, offset, rows)].
        shards: packed variable op name -> (ShardLayout, World) for this rank's shards.
        var_list: a Saver's own ``var_list`` (a list, or a dict checkpoint key -> variable);
            None: every saveable of the graph.
        recorded: for a dict ``var_list``: plain key -> the key the plain model_fn's Saver gave
            that table (``recorded_keys``).

    Returns:
        A list (a dict for a dict ``var_list``) of variables and ``PackedSaveable`` s.
    """
    from tensorflow.python.ops import variables as variables_module

    shards = shards or {}
    if isinstance(var_list, dict):  # checkpoint key -> variable (e.g. ExponentialMovingAverage.variables_to_restore())
        return {key: _split_entry(key, var, packed, members, shards, recorded) for key, var in var_list.items()}
    items = variables_module._all_saveable_objects() if var_list is None else var_list
    return [
        _split_entry(var.op.name, var, packed, members, shards) if isinstance(var, tf.Variable) else var
        for var in items
    ]


class CrashSafeSaver(tf.compat.v1.train.Saver):
    """A Saver whose saves never leave the newest complete checkpoint unreadable (``atomic_checkpoint``).

    Saving to a new prefix (``model.ckpt-<step>``) is safe in TensorFlow
    already: the state file names it only once it is complete. Saving again
    to the prefix the state file names (an Estimator restarted from
    ``model.ckpt-N`` saves step N again when its session starts) overwrote
    it in place; here the old files are kept as a backup the state file
    names until the new ones are complete. ``*_temp`` directories and state
    temporaries that killed saves left are removed at the next save or
    restore.
    """

    def save(self, sess, save_path, global_step=None, latest_filename=None, **kwargs):
        if global_step is not None and not isinstance(global_step, numbers.Number):
            global_step = training_util.global_step(sess, global_step)
        prefix = f"{save_path}-{int(global_step)}" if global_step is not None else save_path
        estimator_end_of_data.before_save(sess, global_step)  # a train call that ran its input to the end
        with atomic_checkpoint.protected(os.fspath(prefix), latest_filename), _gather_phase(sess):
            return super().save(sess, save_path, global_step=global_step, latest_filename=latest_filename, **kwargs)

    def restore(self, sess, save_path):
        if isinstance(save_path, (str, os.PathLike)):
            save_path = atomic_checkpoint.resolve(save_path)
        return super().restore(sess, save_path)


def _gather_phase(sess):
    """The watchdog's checkpoint-gather phase around a save whose graph gathers tables sharded over Horovod ranks.

    A rank whose input ended before the others' saves its last checkpoint while they wait in their next step:
    its gather would wait forever. Armed, it ends the job after ``HYBRIDTF_COLLECTIVE_TIMEOUT_S`` with the
    watchdog's error. The gathers' ``joined_marker`` ops disarm it once every rank joined (the write is not
    timed). Nothing is armed in one process or without sharded tables.
    """
    from hybridtf._src.integrations.horovod_hooks import sharded_world

    graph = getattr(sess, "graph", None)
    world = sharded_world(graph) if graph is not None else None
    if world is None:
        return contextlib.nullcontext()
    return watchdog.collective_phase(world, watchdog.CHECKPOINT_GATHER, "Estimator checkpoint", session_run=True)


def _config_saver(config, **kwargs) -> CrashSafeSaver:
    """A sharded ``CrashSafeSaver`` keeping checkpoints as the Estimator's ``RunConfig`` says (its defaults without
    one), as the Estimator's own default Saver does."""
    keep_max = getattr(config, "keep_checkpoint_max", 5) if config is not None else 5
    keep_hours = getattr(config, "keep_checkpoint_every_n_hours", 10000.0) if config is not None else 10000.0
    return CrashSafeSaver(
        sharded=True, max_to_keep=keep_max, keep_checkpoint_every_n_hours=keep_hours, save_relative_paths=True, **kwargs
    )


def crash_safe_default_saver(spec, config):
    """``spec`` with a ``CrashSafeSaver`` over the graph's default entries when the model_fn brings no Saver.

    For graphs with nothing packed (PREDICT runs the plain model_fn): they save and restore as
    TensorFlow's default Saver would, and their restore removes what killed saves left.
    """
    scaffold = spec.scaffold
    if scaffold.saver is not None or tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS):
        return spec
    saver = _config_saver(config, allow_empty=True)
    _publish(saver)
    return spec._replace(scaffold=tf.compat.v1.train.Scaffold(saver=saver, copy_from_scaffold=scaffold))


def _publish(saver) -> None:
    """Puts hybridtf's Saver in the graph's ``SAVERS`` collection, where the Estimator puts its default one.

    The Estimator adds its default Saver there only when the Scaffold brings none; a user's
    ``CheckpointSaverHook(model_dir, save_steps=...)`` (no Saver, no Scaffold) looks for it there and
    failed with "No items in collection savers" under the wrapped model_fn.
    """
    if not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS):
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)


def with_saver(spec, packed: dict, members: dict, config, shards: dict | None = None, recorded=None):
    """``spec`` with a Scaffold whose Saver writes the plain layout.

    A Saver of the user's own (the Scaffold's, or one in the ``SAVERS``
    collection) is rebuilt with the same settings and entries, its packed
    variables' entries split per table (``saver_var_list``): a model_fn that
    brings its Saver in one mode only (``max_to_keep`` in TRAIN, a moving
    averages' restore in EVAL) writes and reads one layout, the plain one.

    Returns:
        ``(spec, saver or None)``.
    """
    scaffold = spec.scaffold
    savers = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.SAVERS)
    own = _own_saver(spec, savers)
    if own is not None:
        saver = _rebuilt(own, packed, members, shards, recorded)
        if saver is None:
            return spec, None
        savers[:] = [saver if s is own else s for s in savers]
    else:
        saver = _config_saver(config, var_list=saver_var_list(packed, members, shards))
        _publish(saver)
    new_scaffold = tf.compat.v1.train.Scaffold(saver=saver, copy_from_scaffold=scaffold)
    return spec._replace(scaffold=new_scaffold), saver


def _rebuilt(own, packed: dict, members: dict, shards: dict | None, recorded=None):
    """A ``CrashSafeSaver`` like the user's Saver ``own`` in the plain layout; None to keep ``own`` as it is.

    Kept: a Saver subclass (its own save / restore may rely on its entries) and
    a Saver that saves no packed variable.
    """
    if type(own) not in (tf.compat.v1.train.Saver, CrashSafeSaver):
        _log.warning(
            "hybridtf.estimator: the model_fn's Saver is a %s, kept as it is: it saves packed tables under their "
            "packed names, which the plain model_fn cannot restore (use a tf.compat.v1.train.Saver, which hybridtf "
            "rebuilds to write the plain layout).",
            type(own).__name__,
        )
        return None
    var_list = saver_var_list(packed, members, shards, own._var_list, recorded)
    entries = var_list.values() if isinstance(var_list, dict) else var_list
    if not any(isinstance(item, PackedSaveable) for item in entries):
        return None
    return CrashSafeSaver(
        var_list=var_list,
        reshape=own._reshape,
        sharded=own._sharded,
        max_to_keep=own._max_to_keep,
        keep_checkpoint_every_n_hours=own._keep_checkpoint_every_n_hours,
        restore_sequentially=own._restore_sequentially,
        allow_empty=own._allow_empty,
        write_version=own._write_version,
        pad_step_number=own._pad_step_number,
        save_relative_paths=own._save_relative_paths,
        filename=own._filename,
    )
