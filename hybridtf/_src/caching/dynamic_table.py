"""Dynamic tables of the functional API: ``hybridtf.embedding.DynamicTableConfig`` and its runtime.

A ``Tables`` set may hold, next to its fixed-vocabulary tables, dynamic
tables: no ``num_rows``, any int64 id, stored in a HybridHash table (hot/cold
tiers, Algorithm 1). Each is a ``DynamicTable``: the ``HybridHashTable`` plus
the two per-step buffers that ``DynamicEmbedding`` uses (the distinct ids of
the step's lookup and a trainable ``[n_distinct, dim]`` variable holding
their rows). A training lookup finds-or-inserts the distinct ids, writes
their rows into the buffer and gathers the output from it, so the gradient
of the buffer is the gradient of the distinct rows; an optimizer passed
through ``hybridtf.keras.dynamic_optimizer`` (Keras, or ``tf.compat.v1.train``
in Estimator model_fns) sends it to the table's fused update, which ends
Algorithm 1's step (and flushes the hot tier when it is due).

Dynamic lookups run on their own (one HybridHash chain per lookup), also
inside ``hybridtf.function`` and Estimator model_fns: there is nothing to
pack across tables yet (one store per table). One training lookup per
dynamic table per step (graph mode): the buffer holds one lookup's rows.

Under Horovod (``hvd.init()`` before the ``Tables`` are built) each dynamic
table is this rank's shard, exactly as a ``DynamicEmbedding``'s: lookups and
gradients go to the ids' owners through
``hybridtf/_src/distribute/dynamic_exchange.py``, checkpoints hold the whole
table, so N ranks train what one process trains on the global batch. A table
built before ``hvd.init()`` and looked up in a job raises (it would train a
copy per rank).
"""

from __future__ import annotations

import dataclasses
import zlib

import tensorflow as tf

from hybridtf._src.caching import fills, serving
from hybridtf._src.caching.buffer_guard import guard
from hybridtf._src.caching.layer import DynamicEmbedding, _initializer_args, check_graph_mode, training_gather
from hybridtf._src.caching.table import HybridHashTable, default_hot_rows
from hybridtf._src.caching.table import TableConfig as HashConfig
from hybridtf._src.capture.ids import prepare_ids
from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.distribute.world import World, current_world


@dataclasses.dataclass(frozen=True)
class DynamicTableConfig:
    """One dynamic (HybridHash) table of a ``Tables`` set: no vocabulary, any int64 id.

    Attributes:
        name: unique name of the table (its checkpoint key inside ``Tables``).
        dim: embedding width.
        hot_rows: rows of the hot tier (Algorithm 1's top-k); default 100,000, or
            a tenth of ``capacity`` (hot rows are never evicted, so fewer than it).
        warmup_steps: steps that only count frequencies before the first flush.
        flush_every: the hot tier is refilled every that many steps after warm-up.
        capacity: 0 (unbounded) or the most rows kept; rarer rows are evicted.
        initializer: ``"uniform"`` ([-0.05, 0.05]), ``"normal"``, ``"zeros"`` or a
            Keras RandomUniform / RandomNormal / Zeros / Constant (seed ignored).
        seed: the table's seed (initial rows depend only on seed and id);
            default: derived from the name.
        count_decay: counts are multiplied by it after each flush (1 = never).
        evict_policy: ``"lfu"`` or ``"lru"`` (with a capacity).
        ttl_steps: > 0: rows not seen for more than that many steps are evicted at flushes.

    Raises:
        ValueError: a bad size or initializer (the message names the table).

    Example:
        >>> cfg = DynamicTableConfig("user_hash", dim=16, hot_rows=100_000, warmup_steps=100, flush_every=100)
        >>> tables = Tables([cfg, TableConfig("country", 250, 16)])
    """

    name: str
    dim: int
    hot_rows: int | None = None
    warmup_steps: int = 100
    flush_every: int = 100
    capacity: int = 0
    initializer: object = "uniform"
    seed: int | None = None
    count_decay: float = 1.0
    evict_policy: str = "lfu"
    ttl_steps: int = 0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a DynamicTableConfig needs a non-empty string name, got {self.name!r}.")
        self.hash_config()  # validates the sizes and the initializer

    def hash_config(self) -> HashConfig:
        """The HybridHash store's configuration of this table.

        Example:
            >>> DynamicTableConfig("u", 8, hot_rows=10).hash_config().hot_rows
            10
        """
        kind, a, b = _initializer_args(self.initializer, self.name)
        return HashConfig(
            name=self.name,
            dim=self.dim,
            hot_rows=default_hot_rows(self.hot_rows, self.capacity),
            capacity=self.capacity,
            warmup_steps=self.warmup_steps,
            flush_every=self.flush_every,
            seed=zlib.crc32(self.name.encode()) if self.seed is None else int(self.seed),
            initializer=kind,
            init_a=a,
            init_b=b,
            count_decay=self.count_decay,
            evict_policy=self.evict_policy,
            ttl_steps=self.ttl_steps,
        )


class DynamicTable(tf.Module):
    """A dynamic table of a ``Tables`` set: its HybridHash store and per-step buffers.

    Args:
        config: a ``DynamicTableConfig``.

    Example:
        >>> t = DynamicTable(DynamicTableConfig("u", 4, hot_rows=8))
        >>> t.lookup(tf.constant([7, 2**62]), "none", training=True).shape
        TensorShape([2, 4])
    """

    def __init__(self, config: DynamicTableConfig):
        super().__init__(name=None)
        self.config = config
        self.output_dim = config.dim
        hash_config = config.hash_config()
        serving_rows = serving.serves_graph_rows()  # a wrapped Estimator's PREDICT graph: plain TF lookups
        with tf.init_scope():
            table = serving.GraphServingRows(hash_config) if serving_rows else HybridHashTable(hash_config)
            rows = tf.Variable(
                tf.zeros([0, config.dim]),
                shape=tf.TensorShape([None, config.dim]),
                trainable=True,
                name=f"{config.name}_distinct_rows",
            )
            ids = tf.Variable(
                tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False, name=f"{config.name}_ids"
            )
            # Sharded: the ids this rank's shard received from every rank in the step's lookup.
            received = tf.Variable(
                tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False, name=f"{config.name}_received"
            )
        world = World() if serving_rows else current_world()
        if world.distributed:  # this rank's shard of the table (ids owned by hash, dynamic_exchange.py)
            table.shard_over(world)
            if not tf.executing_eagerly():
                # A TF1 graph (Estimator model_fn): hybridtf.horovod.DistributedOptimizer registers the buffer as
                # a Horovod local variable (its owners receive every rank's rows: scaled by 1 / size).
                from hybridtf._src.integrations.horovod_hooks import LOCAL_VARIABLES

                tf.compat.v1.add_to_collection(LOCAL_VARIABLES, rows)
        rows._htf_dynamic_embedding = self  # the optimizer hooks find the table through it
        guard(rows, config.name)
        self.table = table
        self._rows_buffer = rows
        self._ids_buffer = ids
        self._received_ids = received
        self._training_graph = None

    # The fused update of the buffer's gradient with a Keras optimizer: the same as the layer's.
    apply_gradient = DynamicEmbedding.apply_gradient
    _note_eager_fill = DynamicEmbedding._note_eager_fill

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def _shard_world(self) -> World:
        return self.table.world

    @property
    def _exchange_name(self) -> str:
        return f"hybridtf_dynamic_tables_{self.name}"

    def _check_sharding(self) -> None:
        """A table built in one process must not train on its own in each rank of a later Horovod job."""
        world = current_world()
        if world.distributed and not self.table.world.distributed and not getattr(self.table, "serving_only", False):
            raise ValueError(
                f"dynamic table {self.name!r} was built before hvd.init(), so it is not sharded over the "
                f"{world.size} Horovod ranks and each rank would train its own copy. Call hvd.init() before creating "
                "the hybridtf.embedding.Tables (its dynamic tables are then sharded by id); to continue a "
                "one-process table, checkpoint it there and restore it into the Tables built after hvd.init()."
            )

    def lookup(self, ids, combiner: str, training: bool):
        """Embeddings of ``ids`` (see ``Tables.lookup``); training: find-or-insert, count, fill the buffers."""
        if not isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
            ids = tf.convert_to_tensor(ids)
        check_graph_mode("dynamic table", self.name)
        self.table.check_ids(ids)
        self._check_sharding()
        world = self._shard_world
        ids = prepare_ids(ids, combiner, self.name, check_splits=True)
        flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.reshape(ids, [-1])
        unique, inverse, counts = tf.unique_with_counts(tf.cast(flat, tf.int64), out_idx=tf.int32)
        if training and not getattr(self.table, "serving_only", False):
            self._training_graph = tf.compat.v1.get_default_graph()  # trained in this graph
            if tf.executing_eagerly() and not fills.appends(self):
                self._note_eager_fill()
            embedded = training_gather(self, unique, inverse, counts)
        elif world.distributed:  # every rank looks up (a collective), nothing inserted
            rows = dynamic_exchange.sharded_lookup(self.table, unique, None, world, self._exchange_name, False).rows
            embedded = tf.gather(rows, inverse)
        else:
            embedded = tf.gather(self.table.lookup(unique, insert=False), inverse)
        return _combine(ids, embedded, combiner, self.output_dim)

    def stats(self) -> dict:
        """The table's statistics (eager): size, hot_used, inserts, evictions, lookups, hits, ..."""
        return self.table.stats()


def _combine(ids, embedded, combiner: str, dim: int):
    if combiner == "none":
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(embedded)
        return tf.reshape(embedded, tf.concat([tf.shape(ids), [dim]], 0))
    sums = tf.math.unsorted_segment_sum(embedded, ids.value_rowids(), ids.nrows())
    if combiner == "sum":
        return sums
    lengths = tf.cast(ids.row_lengths(), sums.dtype)
    scale = lengths if combiner == "mean" else tf.sqrt(lengths)
    return tf.math.divide_no_nan(sums, scale[:, None])
