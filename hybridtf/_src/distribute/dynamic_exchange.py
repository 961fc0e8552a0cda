"""Dynamic (HybridHash) tables sharded by id over the ranks of a Horovod job.

Ownership. Rank ``r`` of ``n`` owns the ids whose ``owner_of(id, n) == r``:
the SplitMix64 finalizer of the id's 64 bits (wrapping uint64 arithmetic)
modulo ``n``. Raw ids are often hashes already, but small sequential ids, or
hashes whose low bits are biased, would skew ``id % n``; the finalizer mixes
every bit into the low ones, so ownership is balanced for both. It is fixed
(no seed): a checkpoint written at ``N`` ranks restores at ``M`` by filtering
the whole table with the same function.

Forward (one table, one step), with ``distinct`` the rank's distinct ids and
their in-batch counts::

    distinct ids, counts --sorted by owner--> alltoall --> (id, count) from every rank
      --unique, counts summed--> find-or-insert in this rank's shard --> rows
      --alltoall back--> rows of the rank's distinct ids (in their order)

Backward: the rank's gradient rows of its distinct ids travel the same route
to their owners, which sum them per id (ranks in rank order: deterministic)
and apply the table's fused update once, on the distinct ids they own. Like
the static tables' shards (``gradients.py``), the gradient that reaches the
owner is the *sum* over ranks of each rank's local-loss gradient; the
``1 / size`` that makes it the global batch's average is applied by the
averaging machinery, which treats the distinct-rows buffers as local
(model-parallel) variables: ``reduce_gradients``,
``hybridtf.horovod.DistributedGradientTape`` / ``average_gradients``, or a
Horovod optimizer with ``hybridtf.horovod.local_variables(model)``
registered. A new id's initial row depends on (seed, id, initializer) only,
so N ranks train exactly what one process trains on the global batch.

A packed store (``rewrite/packed_dynamic.py``) keyed by (member, id) takes
the same route with the pair owned by its id alone: ``sharded_packed_lookup``
sends (id, member, count) triples in one alltoall for the whole group, the
owner uniques the pairs and finds-or-inserts once; ``owner_packed_gradients``
brings the gradient rows back to it for one fused update. ``DynamicEmbedding``
layers and ``hybridtf.embedding.Tables`` dynamic tables use ``sharded_lookup``.

Checkpoints hold the whole table, the same tensors as one process writes
(ids ascending): ``full_export`` gathers every rank's shard (a collective:
every rank saves), ``own_part`` keeps the rows this rank owns at restore.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import tensorflow as tf

from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import World

# SplitMix64's increment and finalizer multipliers (Steele, Lea, Flood 2014).
_GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


def owner_of(ids: tf.Tensor, size: int) -> tf.Tensor:
    """The owning rank (int32) of each int64 id in a job of ``size`` ranks (see the module docstring).

    Example:
        >>> owner_of(tf.constant([0, 1, 2, 3], tf.int64), 2).numpy().tolist()
        [1, 1, 0, 1]
    """
    u64 = tf.uint64
    z = tf.bitcast(tf.convert_to_tensor(ids, tf.int64), u64) + tf.constant(_GAMMA, u64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(30, u64))) * tf.constant(_MUL1, u64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(27, u64))) * tf.constant(_MUL2, u64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(31, u64)))
    return tf.cast(tf.math.floormod(z, tf.constant(size, u64)), tf.int32)


def owner_of_numpy(ids, size: int) -> np.ndarray:
    """``owner_of`` in NumPy (the same function; for tests and offline re-sharding)."""
    z = np.asarray(ids, np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(_GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MUL1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MUL2)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(size)).astype(np.int32)


def _route(ids: tf.Tensor, size: int):
    """``(order, splits)``: the ids' positions sorted by owner (stable) and how many go to each rank."""
    owner = owner_of(ids, size)
    order = tf.argsort(owner, stable=True)
    splits = tf.math.bincount(owner, minlength=size, maxlength=size, dtype=tf.int32)
    return order, splits


@dataclasses.dataclass
class Routed:
    """A sharded lookup's result: the rows, and what its backward needs (the ids this rank received)."""

    rows: tf.Tensor
    received_ids: tf.Tensor
    received_splits: tf.Tensor


def sharded_lookup(table, ids: tf.Tensor, counts, world: World, name: str, insert: bool) -> Routed:
    """Rows of this rank's distinct ``ids`` from their owners' shards (a collective: every rank calls it).

    Args:
        table: this rank's shard (a ``HybridHashTable``).
        ids: int64 ``[n]`` distinct ids of this rank's batch.
        counts: int64 ``[n]`` their occurrences (Algorithm 1's frequencies), or None (inference).
        world: the job (``size > 1``).
        name: unique per table (Horovod matches collectives by name).
        insert: training (find-or-insert, count) or read-only.

    Returns:
        ``Routed``: ``rows`` ``[n, dim]`` in the order of ``ids``.
    """
    hvd = world.hvd
    with tf.name_scope("dynamic_exchange"):
        order, splits = _route(ids, world.size)
        counts = tf.zeros_like(ids) if counts is None else tf.cast(counts, tf.int64)
        payload = tf.stack([tf.gather(ids, order), tf.gather(counts, order)], axis=1)
        received, received_splits = hvd.alltoall(payload, splits=splits, name=f"{name}_ids")
        received_ids = received[:, 0]
        owned, inverse = tf.unique(received_ids, out_idx=tf.int32)
        if insert:
            owned_counts = tf.math.unsorted_segment_sum(received[:, 1], inverse, tf.size(owned))
            rows = table.lookup(owned, owned_counts, insert=True)
        else:
            rows = table.lookup(owned, insert=False)
        back, _ = hvd.alltoall(tf.gather(rows, inverse), splits=received_splits, name=f"{name}_rows")
        rows = tf.gather(back, tf.math.invert_permutation(order))
    return Routed(rows, received_ids, received_splits)


def owner_gradients(ids: tf.Tensor, grad: tf.Tensor, received_ids: tf.Tensor, world: World, name: str):
    """Sends the gradient rows of this rank's distinct ``ids`` to their owners; sums them there per id.

    Args:
        ids: the distinct ids of this rank's lookup (the ``ids`` of ``sharded_lookup``).
        grad: float32 ``[n, dim]``, their gradient rows.
        received_ids: ``Routed.received_ids`` of that lookup.
        world: the job.
        name: the lookup's name.

    Returns:
        ``(owned_ids, summed)``: the distinct ids this rank owns (first-seen
        order, ranks in rank order) and the sum over ranks of their gradients.
    """
    with tf.name_scope("dynamic_exchange_grad"):
        order, splits = _route(ids, world.size)
        received, _ = world.hvd.alltoall(tf.gather(grad, order), splits=splits, name=f"{name}_grads")
        owned, inverse = tf.unique(received_ids, out_idx=tf.int32)
        return owned, tf.math.unsorted_segment_sum(received, inverse, tf.size(owned))


@dataclasses.dataclass
class RoutedPacked:
    """A sharded lookup of a packed store: the rows, and what its backward needs on the owner side.

    ``owned_ids`` / ``owned_members``: the distinct (member, id) pairs this rank
    received (first-seen order, ranks in rank order); ``owned_inverse``: each
    received pair's position among them; ``records``: the store's record hints
    of the owned pairs (training), or None.
    """

    rows: tf.Tensor
    owned_ids: tf.Tensor
    owned_members: tf.Tensor
    owned_inverse: tf.Tensor
    records: tf.Tensor | None


def sharded_packed_lookup(table, ids, members, counts, world: World, name: str, insert: bool) -> RoutedPacked:
    """``sharded_lookup`` for a packed store keyed by (member, id): one alltoall for the whole group.

    Each pair goes to the owner of its id alone (``owner_of(id, n)``), so a
    member's rows live on the rank that owns them in the unpacked sharded
    layer (checkpoints stay per table and move N -> M). The owner makes the
    received pairs distinct, sums their counts, finds-or-inserts once
    (``lookup_records``: hints for the step's fused update) and returns the
    rows by the reverse alltoall.

    Args:
        table: this rank's shard of the packed store (a ``HybridHashTable`` with members).
        ids: int64 ``[n]`` ids of this rank's distinct (member, id) pairs.
        members: int64 ``[n]`` their members.
        counts: int64 ``[n]`` their occurrences, or None (inference).
        world: the job (``size > 1``).
        name: unique per store (Horovod matches collectives by name).
        insert: training (find-or-insert, count) or read-only.

    Returns:
        ``RoutedPacked``: ``rows`` ``[n, dim]`` in the order of ``ids``.
    """
    hvd = world.hvd
    with tf.name_scope("dynamic_exchange_packed"):
        order, splits = _route(ids, world.size)
        counts = tf.zeros_like(ids) if counts is None else tf.cast(counts, tf.int64)
        payload = tf.stack([tf.gather(t, order) for t in (ids, tf.cast(members, tf.int64), counts)], axis=1)
        received, received_splits = hvd.alltoall(payload, splits=splits, name=f"{name}_ids")
        # distinct (id, member) rows, first occurrence first
        pairs, inverse = tf.raw_ops.UniqueV2(x=received[:, :2], axis=[0], out_idx=tf.int32)
        owned_ids, owned_members = pairs[:, 0], pairs[:, 1]
        records = None
        if insert:
            owned_counts = tf.math.unsorted_segment_sum(received[:, 2], inverse, tf.shape(pairs)[0])
            rows, records = table.lookup_records(owned_ids, owned_counts, members=owned_members)
        else:
            rows = table.lookup(owned_ids, insert=False, members=owned_members)
        back, _ = hvd.alltoall(tf.gather(rows, inverse), splits=received_splits, name=f"{name}_rows")
        rows = tf.gather(back, tf.math.invert_permutation(order))
    return RoutedPacked(rows, owned_ids, owned_members, inverse, records)


def owner_packed_gradients(ids, grad, owned_inverse, num_owned, world: World, name: str):
    """Sends the gradient rows of a packed store's distinct pairs to their owners; sums them there per pair.

    Args:
        ids: the ids of the rank's distinct pairs (the ``ids`` of ``sharded_packed_lookup``).
        grad: float32 ``[n, dim]``, their gradient rows.
        owned_inverse: ``RoutedPacked.owned_inverse`` of that lookup.
        num_owned: how many distinct pairs this rank owns (``RoutedPacked.owned_ids``' size).
        world: the job.
        name: the store's exchange name.

    Returns:
        float32 ``[num_owned, dim]``: the sum over ranks of each owned pair's gradient.
    """
    with tf.name_scope("dynamic_exchange_packed_grad"):
        order, splits = _route(ids, world.size)
        received, _ = world.hvd.alltoall(tf.gather(grad, order), splits=splits, name=f"{name}_grads")
        return tf.math.unsorted_segment_sum(received, owned_inverse, num_owned)


def full_export(table, world: World):
    """The whole sharded table as one process exports it: ``(ids, rows, slots, counts, slot_init, step)``.

    A collective (allgather; every rank calls it, in the same order). Ids
    ascending; ``slot_init`` and ``step`` are the same on every rank.
    """
    ids, rows, slots, counts, slot_init, step = table.export()
    hvd = world.hvd
    name = f"hybridtf_dynamic_export_{table.name}"
    gathered = [hvd.allgather(t, name=f"{name}_{k}") for k, t in enumerate((ids, rows, slots, counts))]
    order = tf.argsort(gathered[0])
    ids, rows, slots, counts = (tf.gather(t, order) for t in gathered)
    return ids, rows, slots, counts, slot_init, step


def sharded_tables(model) -> list:
    """The HybridHash tables sharded by id of ``model``'s layers and ``Tables`` (model order, the same on every rank).

    ``DynamicEmbedding`` layers (their ``table``: a store, or a packed member's
    view) and the dynamic tables of ``hybridtf.embedding.Tables`` the model tracks.
    """
    out, seen = [], set()
    for module in model._flatten_modules(include_self=False):  # layers and tf.Modules (Tables), in order
        candidates = [getattr(module, "table", None)]
        dynamic = getattr(module, "dynamic_tables", None)
        if isinstance(dynamic, dict):  # a Tables set: its DynamicTable entries
            candidates.extend(t.table for t in dynamic.values())
        for table in candidates:
            world = getattr(table, "world", None)
            if isinstance(world, World) and world.distributed and id(table) not in seen:
                seen.add(id(table))
                out.append(table)
    return out


@contextlib.contextmanager
def gathered_exports(tables):
    """Every rank gathers its sharded ``tables`` now (collectives); inside, their checkpoints use that export.

    So one rank alone can then write a checkpoint holding the whole tables
    (``save_weights``: every rank calls it, rank 0 writes the file).
    """
    if tables:
        with watchdog.collective_phase(tables[0].world, watchdog.CHECKPOINT_GATHER, f"{len(tables)} dynamic tables"):
            for table in tables:
                table._htf_gathered = full_export(table, table.world)
    try:
        yield
    finally:
        for table in tables:
            table._htf_gathered = None


def own_part(ids, rows, slots, counts, world: World):
    """The rows of a whole-table export that ``world.rank`` owns (order kept)."""
    ids = tf.reshape(ids, [-1])  # restored tensors may come without a static shape (TF1 Saver)
    mine = tf.reshape(tf.where(tf.equal(owner_of(ids, world.size), world.rank)), [-1])
    return tuple(tf.gather(t, mine) for t in (ids, rows, slots, counts))


def is_sharded_dynamic_buffer(variable) -> bool:
    """Whether ``variable`` is the distinct-rows buffer of a dynamic table sharded by id (a local variable)."""
    owner = getattr(variable, "_htf_dynamic_embedding", None)
    world = getattr(getattr(owner, "table", None), "world", None)
    return world is not None and world.distributed


def is_rank_local(variable) -> bool:
    """Whether ``variable``'s gradient is this rank's own, never allreduced: a packed static table's shard
    (``packed_storage`` marks it) or the distinct-rows buffer of a dynamic table sharded by id."""
    return is_sharded_dynamic_buffer(variable) or bool(getattr(variable, "_htf_sharded_table", False))


def sharded_dynamic_buffers(model) -> list:
    """The distinct-rows buffers of ``model``'s dynamic tables sharded by id (its local variables)."""
    return [v for v in getattr(model, "trainable_variables", []) if is_sharded_dynamic_buffer(v)]


def checkpoint_tensors(table, world: World) -> dict:
    """A dynamic table's checkpoint entries: its whole table as one process writes it.

    ``save_weights``' gathered exports when set (``gathered_exports``), else under
    Horovod every shard's export gathered (``full_export``, a collective), else
    the local store's export. ``table`` is a ``HybridHashTable`` or a packed
    store's member view.
    """
    gathered = getattr(table, "_htf_gathered", None)
    if gathered is not None:
        ids, rows, slots, counts, slot_init, step = gathered
    elif world.distributed:
        ids, rows, slots, counts, slot_init, step = full_export(table, world)
        if not tf.executing_eagerly():  # an Estimator's save: once gathered, every rank joined (watchdog)
            ids = watchdog.joined_marker(ids)
    else:
        ids, rows, slots, counts, slot_init, step = table.export()
    return {
        "ids": ids,
        "rows": rows,
        "slots": slots,
        "counts": counts,
        "slot_init": slot_init,
        "step": step,
        "table_name": tf.constant(table.name),
    }


def training_rows(table, unique: tf.Tensor, counts: tf.Tensor, world: World, name: str, received_ids):
    """The rows of a training step's distinct ids, found or inserted: (rows, assign ops to run first).

    Under Horovod they come from their owners' shards (``sharded_lookup``) and the
    ids this rank received are kept in ``received_ids`` for the owner-side
    update; in one process from the local store.
    """
    if world.distributed:
        routed = sharded_lookup(table, unique, counts, world, name, True)
        return routed.rows, [received_ids.assign(routed.received_ids)]
    return table.lookup(unique, counts, insert=True), []
