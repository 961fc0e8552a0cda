"""``MemberTable``: one DynamicEmbedding's view of a packed HybridHash store (``packed_dynamic.py``).

A packed member layer's ``table`` is this view where its own
``HybridHashTable`` was: reads (``lookup(insert=False)``, ``export``) see the
member's rows only, and its checkpoint entry holds the same tensors as an
unpacked table's (ids ascending, rows, slots, counts, slot_init, step,
table_name), so packed and unpacked checkpoints load into each other. Under
Horovod the store is this rank's shard: the view's ``world`` is the store's,
its checkpoint gathers the member's whole table (``dynamic_exchange.full_export``,
or the export ``gathered_exports`` prepared for ``save_weights``) and a restore
keeps the ids this rank owns (``own_part``), so checkpoints move N -> M ranks.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.caching.table import HybridHashTable, TableConfig, wrong_table_message
from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.distribute.world import World


class MemberTable(tf.__internal__.tracking.Trackable):
    """One member's part of a packed store, where the layer's own ``HybridHashTable`` was.

    Reads (``lookup(insert=False)``, ``export``) see this member's rows only;
    checkpoints save and restore them with the tensors of an unpacked table
    (ids ascending, rows, slots, counts, slot_init, step, table_name).
    ``stats()`` are the store's (all members).
    """

    def __init__(self, group, member: int, config: TableConfig):
        """``group``: the ``packed_dynamic.DynamicGroup`` whose store holds the member's rows."""
        self._group = group
        self._member = int(member)
        self._config = config

    @property
    def config(self) -> TableConfig:
        return self._config

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def store(self) -> HybridHashTable:
        return self._group.table

    @property
    def world(self) -> World:
        """The Horovod job the store is sharded over by id (one process: not sharded)."""
        return self.store.world

    def check_ids(self, ids):
        return self.store.check_ids(ids)

    def _members(self, ids):
        return tf.fill(tf.shape(ids, out_type=tf.int64), tf.constant(self._member, tf.int64))

    def lookup(self, ids, counts=None, insert: bool = True):
        if insert:
            raise ValueError(
                f"DynamicEmbedding {self.name!r} is packed into store {self._group.plan.name!r}: training lookups "
                "run through the optimized model's call (one chain per store). Call the model, not the layer."
            )
        ids = self.check_ids(tf.convert_to_tensor(ids))
        return self.store.lookup(ids, insert=False, members=self._members(ids))

    def export(self):
        ids, rows, slots, counts, slot_init, step, members = self.store.export_with_members()
        mine = tf.equal(members, self._member)
        return (
            tf.boolean_mask(ids, mine),
            tf.boolean_mask(rows, mine),
            tf.boolean_mask(slots, mine),
            tf.boolean_mask(counts, mine),
            slot_init,
            step,
        )

    def import_(self, ids, rows, slots, counts, slot_init, step):
        try:
            return self.store.import_(
                ids, rows, slots, counts, slot_init, step, self._members(ids), member=self._member
            )
        except tf.errors.InvalidArgumentError as error:  # the kernel knows the store and the member's index
            raise tf.errors.InvalidArgumentError(
                error.node_def,
                error.op,
                f"DynamicEmbedding {self.name!r} (member {self._member} of the packed store "
                f"{self._group.plan.name!r}) was not restored, its rows are unchanged: {error.message}",
            ) from error

    def stats(self) -> dict:
        return self.store.stats()

    def stats_tensor(self):
        return self.store.stats_tensor()

    def flush(self):
        return self.store.flush()

    def _serialize_to_tensors(self):
        return dynamic_exchange.checkpoint_tensors(self, self.world)

    def _restore_from_tensors(self, restored_tensors):
        t = restored_tensors
        if tf.executing_eagerly():
            saved = t["table_name"].numpy().decode()
            if saved != self.name:
                raise ValueError(wrong_table_message(self.name, saved))
            check = tf.no_op()
        else:
            check = tf.debugging.assert_equal(
                t["table_name"],
                tf.constant(self.name),
                message=f"HybridHash table {self.name!r}: the checkpoint entry holds another table; restore a "
                "checkpoint of this model (same layers, names and order)",
            )
        ids, rows, slots, counts = t["ids"], t["rows"], t["slots"], t["counts"]
        width = rows.shape[-1] if rows.shape.rank == 2 else None
        if width is not None and width != self.config.dim:  # named here: the store's kernel names the store
            raise ValueError(
                f"HybridHash table {self.name!r} has dim {self.config.dim} but the checkpoint's rows are "
                f"{rows.shape.as_list()}: it holds a table of dim {width}. Restore a checkpoint of this model, or "
                f"build the layer with output_dim={width}."
            )
        if self.world.distributed:  # the whole table was saved: keep this rank's ids
            ids, rows, slots, counts = dynamic_exchange.own_part(ids, rows, slots, counts, self.world)
        with tf.control_dependencies([check]):
            return self.import_(ids, rows, slots, counts, t["slot_init"], t["step"])


__all__ = ["MemberTable"]
