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

import numbers
import os

import tensorflow as tf
from tensorflow.python.training import training_util
from tensorflow.python.training.saving import saveable_object

from hybridtf._src.distribute.exchange import gather_member
from hybridtf._src.integrations import atomic_checkpoint


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
        for key, offset, num in parts:

            def tensor(offset=offset, num=num):
                if shard is None:
                    return variable.read_value()[offset : offset + num]
                return gather_member(variable.read_value(), *shard, offset, num)

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


def saver_var_list(packed: dict, members: dict, shards: dict | None = None) -> list:
    """The Saver's var_list: every saveable of the graph, packed variables and their slots split per table.

    Args:
        packed: packed variable op name -> packed variable.
        members: packed variable op name -> [(checkpoint key, offset, rows)].
        shards: packed variable op name -> (ShardLayout, World) for this rank's shards.

    Returns:
        A list of variables and ``PackedSaveable`` s.
    """
    from tensorflow.python.ops import variables as variables_module

    shards = shards or {}
    items = []
    for var in variables_module._all_saveable_objects():
        if not isinstance(var, tf.Variable):
            items.append(var)
            continue
        name = var.op.name
        if name in packed:
            items.append(PackedSaveable(var, members[name], shards.get(name)))
            continue
        # A slot of a packed variable, shaped like it: <packed>/<slot> (tf.compat.v1 optimizers) or
        # <optimizer>/<packed>/<slot> (Keras legacy optimizers in a model_fn); saved as each table's slot.
        owner = next((p for p in packed if f"/{p}/" in f"/{name}" and var.shape == packed[p].shape), None)
        if owner is not None:
            head, _, rest = f"/{name}".partition(f"/{owner}/")  # head: "" or "/<optimizer>"
            parts = [(f"{head}/{key}/{rest}"[1:], off, num) for key, off, num in members[owner]]
            items.append(PackedSaveable(var, parts, shards.get(owner)))
            continue
        items.append(var)
    return items


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
        with atomic_checkpoint.protected(os.fspath(prefix), latest_filename):
            return super().save(sess, save_path, global_step=global_step, latest_filename=latest_filename, **kwargs)

    def restore(self, sess, save_path):
        if isinstance(save_path, (str, os.PathLike)):
            save_path = atomic_checkpoint.resolve(save_path)
        return super().restore(sess, save_path)


def with_saver(spec, packed: dict, members: dict, config, shards: dict | None = None):
    """``spec`` with a Scaffold whose Saver writes the plain layout (a user's own Saver is kept).

    Returns:
        ``(spec, saver or None)``.
    """
    scaffold = spec.scaffold
    if scaffold is not None and scaffold.saver is not None:
        return spec, None
    if tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS):
        return spec, None
    keep_max = getattr(config, "keep_checkpoint_max", 5) if config is not None else 5
    keep_hours = getattr(config, "keep_checkpoint_every_n_hours", 10000.0) if config is not None else 10000.0
    saver = CrashSafeSaver(
        var_list=saver_var_list(packed, members, shards),
        sharded=True,
        max_to_keep=keep_max,
        keep_checkpoint_every_n_hours=keep_hours,
        save_relative_paths=True,
    )
    new_scaffold = tf.compat.v1.train.Scaffold(saver=saver, copy_from_scaffold=scaffold)
    return spec._replace(scaffold=new_scaffold), saver
