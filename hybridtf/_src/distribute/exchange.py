"""Cross-rank parts of a packed lookup under model parallelism.

Forward, for the unique ids of one packed table (grouped by owning rank by
UniquePartition, ``partition_sizes`` = how many go to each rank)::

    unique ids --alltoall--> ids this rank owns (from every rank)
      --UniquePartition(1)--> distinct local rows --gather(shard)--> rows
      --alltoall back--> rows in the order of the unique ids

The second UniquePartition makes the shard's gradient one row per distinct
row even when several ranks asked for the same row: its backward sums the
ranks' gradients (in rank order, deterministic), so the fused sparse update
of the shard sees distinct rows, like the one-process chain. Backward,
Horovod's alltoall gradient sends the gradient rows back to their owners.

Before any exchange of a step, ``agree_on_valid_ids`` makes every rank see
every rank's count of out-of-vocabulary ids (one small allreduce), so an
invalid id on one rank stops the step on all ranks with the same error
instead of leaving the others waiting in an alltoall.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from hybridtf._src.distribute.layout import ShardLayout
from hybridtf._src.distribute.world import World
from hybridtf._src.run.gather_rows import gather_variable_rows
from hybridtf._src.run.unique_partition import unique_partition


def partition_ids(packed_ids: tf.Tensor, layout: ShardLayout):
    """UniquePartition of a packed table's ids by owning rank (ascending ids inside each rank)."""
    if layout.strategy == "mod":
        return unique_partition(packed_ids, layout.size, strategy="mod", sort_ids=True)
    return unique_partition(packed_ids, layout.size, strategy="range", range_bounds=layout.bounds, sort_ids=True)


def _to_local(ids: tf.Tensor, layout: ShardLayout, rank: int) -> tf.Tensor:
    if layout.strategy == "mod":
        return ids // layout.size
    return ids - int(layout.bounds[rank])


def exchange_rows(shard: tf.Variable, unique, layout: ShardLayout, world: World, name: str) -> tf.Tensor:
    """The rows of ``unique.unique_ids`` (a ``partition_ids`` result), fetched from their owners.

    Args:
        shard: this rank's shard of the packed table, ``[local_rows, dim]``.
        unique: ``partition_ids(packed_ids, layout)``.
        layout: the table's sharding.
        world: the job (``size > 1``).
        name: a name unique to the packed table (Horovod matches collectives by name).

    Returns:
        ``[len(unique.unique_ids), dim]`` rows, differentiable into ``shard``.
    """
    hvd = world.hvd
    with tf.name_scope("exchange"):
        owned, received_splits = hvd.alltoall(unique.unique_ids, splits=unique.partition_sizes, name=f"{name}_ids")
        local = unique_partition(_to_local(owned, layout, world.rank), 1, sort_ids=True)
        rows = tf.gather(gather_variable_rows(shard, local.unique_ids), local.inverse)
        back, _ = hvd.alltoall(rows, splits=received_splits, name=f"{name}_rows")
        return back


def gather_member(shard, layout: ShardLayout, world: World, offset: int, count: int, name: str | None = None):
    """The whole rows ``[offset, offset + count)`` of a sharded packed table, from every rank's shard.

    A collective (allgather): every rank calls it, in the same order. Used to
    checkpoint shards (and their optimizer slots) as whole tables.
    """
    mine = tf.convert_to_tensor(shard)[layout.local_slice(offset, count, world.rank)]
    parts = world.hvd.allgather(mine, name=name)
    if layout.strategy == "range":  # rank order is row order
        return parts
    return tf.gather(parts, np.argsort(layout.gather_order(offset, count), kind="stable"))


def agree_on_valid_ids(world: World, invalid_counts: Sequence[tf.Tensor], vocabularies: Sequence[tuple[str, int]]):
    """An op that fails on every rank when any rank has an id outside its table's vocabulary.

    Args:
        world: the job (``size > 1``).
        invalid_counts: per packed table, int64 ``[fields]`` out-of-vocabulary
            counts from ``pack_ids(..., on_invalid="count")``.
        vocabularies: ``(table name, num_rows)`` of every field, in the order
            of the concatenated counts.

    Returns:
        An op (an Assert; in eager mode it has already run) that raises
        ``tf.errors.InvalidArgumentError`` naming the tables.
    """
    counts = tf.concat(list(invalid_counts), axis=0) if len(invalid_counts) > 1 else invalid_counts[0]
    total = world.hvd.allreduce(counts, op=world.hvd.Sum, name="hybridtf_id_check")
    labels = tf.constant([f"{t} (vocabulary [0, {n}))" for t, n in vocabularies])
    bad = tf.strings.reduce_join(tf.boolean_mask(labels, total > 0), separator=", ")
    return tf.debugging.Assert(
        tf.reduce_all(tf.equal(total, 0)),
        [
            "hybridtf: embedding table(s)",
            bad,
            "got ids outside their vocabulary on at least one rank (counts over all ranks:",
            total,
            "). Ids must be in [0, input_dim): check the features' hashing or vocabulary sizes. Every rank stops "
            "at this step, before exchanging ids.",
        ],
        summarize=64,
        name="hybridtf_ids_valid_on_every_rank",
    )
