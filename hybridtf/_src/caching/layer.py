"""``DynamicEmbedding``: a Keras embedding layer over a HybridHash table.

No ``input_dim``: any int64 id gets a row on first sight (its initial row
depends only on the layer's seed, the id and the initializer), so raw 64-bit
hashed ids need no bucketing.

How a step trains the table. The layer computes the distinct ids of its
input (``tf.unique_with_counts``), looks their rows up (find-or-insert; the
counts feed Algorithm 1's frequencies) and, when training, writes them into a
per-layer trainable buffer variable ``[n_distinct, dim]`` whose rows the
output gathers. The buffer's gradient is therefore the gradient of the
distinct rows; an optimizer hooked by ``dynamic_optimizer`` (or
``hook_optimizer``) sums it per distinct id and sends it, with the ids, to the
table's fused update (SGD, Adagrad, Adam, LazyAdam with the table's own
slots), which then ends Algorithm 1's step (flush check). The buffer is not
checkpointed; the table is (ids, rows, slots, counts): in TF checkpoints
(``save_weights``, ``tf.train.Checkpoint``) as the table's own entries, in
``.keras`` files through ``save_own_variables`` / ``load_own_variables``.

Under Horovod (``hvd.init()`` before the layer is built) the table is this
rank's shard: lookups and gradients go to the ids' owners through
``hybridtf/_src/distribute/dynamic_exchange.py`` (alltoall), so N ranks
train what one process trains on the global batch.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import zlib

import numpy as np
import tensorflow as tf
from tensorflow.python.saved_model import save_context

from hybridtf._src.caching import fills, serving
from hybridtf._src.caching.buffer_guard import guard
from hybridtf._src.caching.table import HybridHashTable, TableConfig, default_hot_rows
from hybridtf._src.capture import context
from hybridtf._src.capture.ids import prepare_ids
from hybridtf._src.capture.keras_capture import to_compute_dtype
from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.distribute.world import World, current_world, refuse_mirroring_strategy
from hybridtf._src.once import first_time

_log = logging.getLogger("hybridtf")
BAG_COMBINERS = ("sum", "mean", "sqrtn")
# A table's checkpoint entries (besides its name), as ``.keras`` files store them.
_KERAS_ENTRIES = ("ids", "rows", "slots", "counts", "slot_init", "step")


def _initializer_args(initializer, name: str) -> tuple[str, float, float]:
    """(kind, a, b) of a supported initializer (name, dict or Keras initializer instance)."""
    if isinstance(initializer, str):
        kinds = {"uniform": ("uniform", -0.05, 0.05), "normal": ("normal", 0.0, 0.05), "zeros": ("zeros", 0.0, 0.0)}
        if initializer not in kinds:
            raise ValueError(
                f"DynamicEmbedding {name!r}: initializer must be 'uniform', 'normal', 'zeros', a "
                f"tf.keras.initializers RandomUniform/RandomNormal/Zeros/Constant, got {initializer!r}."
            )
        return kinds[initializer]
    init = tf.keras.initializers
    if isinstance(initializer, init.RandomUniform):
        return "uniform", float(initializer.minval), float(initializer.maxval)
    if isinstance(initializer, init.RandomNormal):
        return "normal", float(initializer.mean), float(initializer.stddev)
    if isinstance(initializer, init.Zeros):
        return "zeros", 0.0, 0.0
    if isinstance(initializer, init.Constant):
        value = np.asarray(initializer.value)
        if value.size != 1 or not np.issubdtype(value.dtype, np.number):
            raise ValueError(
                f"DynamicEmbedding {name!r}: a Constant initializer of a dynamic table takes one number (every "
                f"value of every new row), got {initializer.value!r}. Rows are made per id as ids arrive, so "
                "there is no table-shaped array to copy; use Constant(<number>), 'uniform' or 'normal'."
            )
        return "constant", float(value.reshape(())), 0.0
    raise ValueError(
        f"DynamicEmbedding {name!r}: unsupported initializer {initializer!r}; rows must be a function of (seed, id) "
        "only, so use 'uniform', 'normal', 'zeros' or RandomUniform/RandomNormal/Zeros/Constant."
    )


def _in_legacy_hdf5(max_depth: int = 12) -> bool:
    """Whether Keras's legacy HDF5 writer or reader asks for the layer's weights (``hdf5_format._legacy_weights``)."""
    frame = sys._getframe(2)
    for _ in range(max_depth):
        if frame is None:
            return False
        if frame.f_code.co_name == "_legacy_weights" and "hdf5_format" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def check_graph_mode(kind: str, name: str) -> None:
    """Refuses a dynamic table's lookup in a TF1 graph that ``hybridtf.estimator.model_fn`` is not building.

    There (an unwrapped Estimator model_fn, a ``tf.compat.v1.Session`` loop)
    nothing registers the table with the graph's Saver: it trains, but no
    checkpoint holds it, so the next ``train`` / ``evaluate`` / ``predict``
    call starts from a fresh table, and an export needs hybridtf's ops.
    """
    if tf.compat.v1.executing_eagerly_outside_functions() or context.in_wrapped_model_fn():
        return
    raise context.CaptureError(
        f"{kind} {name!r} is looked up in a TF1 graph that hybridtf.estimator.model_fn is not building (an "
        "unwrapped Estimator model_fn, or a tf.compat.v1 Session graph). There no checkpoint would hold the table: "
        "what it learns would be lost at the next train / evaluate / predict call. Wrap the model_fn: "
        "tf.estimator.Estimator(hybridtf.estimator.model_fn(model_fn), ...), which saves and restores dynamic tables, "
        "flushes and exports them; outside Estimator, train dynamic tables in TF2 (Keras fit, tf.function or "
        "hybridtf.function)."
    )


def training_gather(owner, unique, inverse, counts):
    """A training lookup of a DynamicEmbedding or ``Tables`` dynamic table: ``owner``'s distinct ids
    ``unique`` are found or inserted (their ``counts`` feed Algorithm 1), written into its buffers
    (assigned, or appended to the step's earlier lookups: ``fills.py``) and gathered by ``inverse`` from the
    rows buffer, whose gradient the table's update consumes."""
    world = owner._shard_world
    if fills.appends(owner):
        if world.distributed:
            raise ValueError(
                fills.SHARDED_MESSAGE.format(name=repr(owner.name))
                + " Or, for a layer called on two inputs: wrap the model with hybridtf.keras.optimize (a table "
                "without capacity), whose packed store serves every call of a step with one exchange."
            )
        if owner.table.config.capacity:
            raise ValueError(fills.CAPACITY_MESSAGE.format(name=repr(owner.name)))
    received = getattr(owner, "_received_ids", None)
    rows, assigns = dynamic_exchange.training_rows(owner.table, unique, counts, world, owner._exchange_name, received)
    offset, filled = fills.fill(owner, [(owner._ids_buffer, unique), (owner._rows_buffer, rows)])
    with tf.control_dependencies(assigns + filled):
        return tf.gather(owner._rows_buffer, inverse if offset is None else inverse + offset)


@tf.keras.utils.register_keras_serializable(package="hybridtf")
class DynamicEmbedding(tf.keras.layers.Layer):
    """Embeddings of unbounded int64 ids, stored in a HybridHash table (hot/cold tiers).

    Like ``tf.keras.layers.Embedding`` (``combiner=None``: output
    ``ids.shape + [output_dim]``) or ``hybridtf.layers.EmbeddingBag``
    (``combiner="sum" | "mean" | "sqrtn"``: ragged, sparse or dense
    ``[batch, L]`` ids pooled to ``[batch, output_dim]``), but without
    ``input_dim``: every id (any int64 value, e.g. a 64-bit hash of a string)
    gets a row the first time it is seen in training. In inference, and in a
    frozen layer (``trainable=False``) also in training mode, an unseen id gets
    its initial row and is not inserted.

    Train it with an optimizer passed through ``hybridtf.keras.dynamic_optimizer``
    (SGD without momentum, Adagrad, Adam or ``hybridtf.keras.LazyAdam``): the
    table's rows are updated by one fused op with the table's own slots.

    Args:
        output_dim: row width.
        combiner: None (one row per id) or ``"sum" | "mean" | "sqrtn"``.
        hot_rows: rows of the hot tier (Algorithm 1's top-k); default 100,000, or
            a tenth of ``capacity`` (hot rows are never evicted, so fewer than it).
        warmup_steps: steps that only count frequencies before the first flush.
        flush_every: the hot tier is refilled every that many steps after warm-up.
        capacity: 0 (unbounded) or the most rows kept; rarer rows are evicted.
        embeddings_initializer: ``"uniform"`` (Keras' default, [-0.05, 0.05]),
            ``"normal"``, ``"zeros"`` or a Keras RandomUniform / RandomNormal /
            Zeros / Constant (its seed is ignored: see ``seed``).
        seed: the table's seed; default: derived from the layer's name.
        count_decay: counts are multiplied by it after each flush (1 = never).
        evict_policy: ``"lfu"`` or ``"lru"`` (with a capacity).
        ttl_steps: > 0: rows not seen for more than that many steps are evicted at flushes (a row last seen at
            step s survives the flushes up to step s + ttl_steps).
        **kwargs: ``tf.keras.layers.Layer`` arguments (``name``, ...).

    Raises:
        ValueError: bad sizes, combiner or initializer.

    Example:
        >>> ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
        >>> emb = htf.layers.DynamicEmbedding(16, hot_rows=10_000, name="user")(ids)   # [batch, 1, 16]
        >>> model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(emb)))
        >>> model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.05)), loss="mse")
    """

    def __init__(
        self,
        output_dim: int,
        combiner: str | None = None,
        hot_rows: int | None = None,
        warmup_steps: int = 100,
        flush_every: int = 100,
        capacity: int = 0,
        embeddings_initializer="uniform",
        seed: int | None = None,
        count_decay: float = 1.0,
        evict_policy: str = "lfu",
        ttl_steps: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if combiner is not None and combiner not in BAG_COMBINERS:
            raise ValueError(
                f"DynamicEmbedding {self.name!r}: combiner must be None or one of {BAG_COMBINERS}, got {combiner!r}."
            )
        kind, a, b = _initializer_args(embeddings_initializer, self.name)
        self.output_dim = output_dim
        self.combiner = combiner
        self.embeddings_initializer = embeddings_initializer
        self.seed = seed
        self._table_config = TableConfig(
            name=self.name,
            dim=output_dim,
            hot_rows=default_hot_rows(hot_rows, capacity),
            capacity=capacity,
            warmup_steps=warmup_steps,
            flush_every=flush_every,
            seed=zlib.crc32(self.name.encode()) if seed is None else seed,
            initializer=kind,
            init_a=a,
            init_b=b,
            count_decay=count_decay,
            evict_policy=evict_policy,
            ttl_steps=ttl_steps,
        )
        object.__setattr__(self, "table", None)

    def build(self, input_shape=None):
        refuse_mirroring_strategy(self)
        # Not auto-tracked: _trackable_children names it for checkpoints and leaves it out of SavedModels.
        world = current_world()
        if serving.serves_graph_rows():  # a wrapped Estimator's PREDICT graph: the checkpoint's rows, plain TF
            object.__setattr__(self, "table", serving.GraphServingRows(self._table_config))
            world = World()
        else:
            object.__setattr__(self, "table", HybridHashTable(self._table_config))
            if world.distributed:  # this rank's shard of the table (ids owned by hash, dynamic_exchange.py)
                self.table.shard_over(world)
            # A checkpoint restored before the layer was built (a subclassed model's load_weights before its first
            # call) left the table's entries pending under its name: restore them now, as Keras does for variables.
            self._handle_deferred_dependencies("table", self.table)
        # Untracked (never checkpointed): the distinct rows of the current step and their ids.
        with tf.init_scope():
            buffer = tf.Variable(
                tf.zeros([0, self.output_dim]),
                shape=tf.TensorShape([None, self.output_dim]),
                trainable=True,
                name=f"{self.name}_distinct_rows",
            )
            ids = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False)
            # Sharded: the ids this rank's shard received from every rank in the step's lookup.
            received = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False)
        object.__setattr__(self, "_rows_buffer", buffer)
        object.__setattr__(self, "_ids_buffer", ids)
        object.__setattr__(self, "_received_ids", received)
        if world.distributed and not tf.executing_eagerly():
            # A TF1 graph (Estimator model_fn): hybridtf.horovod.DistributedOptimizer registers the buffer as a
            # Horovod local variable (its owners receive every rank's rows: scaled by 1 / size, not allreduced).
            from hybridtf._src.integrations.horovod_hooks import LOCAL_VARIABLES

            tf.compat.v1.add_to_collection(LOCAL_VARIABLES, buffer)
        buffer._htf_dynamic_embedding = self  # the optimizer hook finds the layer through it
        guard(buffer, self.name)
        self.built = True

    @property
    def trainable_weights(self):
        if _in_legacy_hdf5():
            raise NotImplementedError(
                f"DynamicEmbedding {self.name!r}: the legacy HDF5 format (a .h5 path in save_weights / "
                "load_weights / save) holds a model's variables only, not a dynamic table's ids and rows (they live "
                "in its HybridHash store): the table would be lost. Use a .weights.h5 or .keras file, or a "
                "TensorFlow checkpoint (save_weights('ckpt'), tf.train.Checkpoint), which hold every table."
            )
        return [self._rows_buffer] if self.trainable and self.built else []

    @property
    def non_trainable_weights(self):
        return []

    def call(self, inputs, training=None):
        ids = inputs
        if not isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
            ids = tf.convert_to_tensor(ids)
        check_graph_mode("DynamicEmbedding", self.name)
        self.table.check_ids(ids)
        ids = prepare_ids(ids, self.combiner or "none", self.name, check_splits=True)
        flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.reshape(ids, [-1])
        flat = tf.cast(flat, tf.int64)
        saving = save_context.in_save_context()
        if context.is_recording() and not context.record_pass_runs_lookups() and not saving:
            # an optimized model's record pass: its outputs are discarded, touch nothing (hybridtf.function's
            # and Estimator's scratch-graph record passes never run and need the real lookup's gradient).
            # Not in a SavedModel export: Keras keeps each trace of a layer's call as one of its saved
            # functions, and the loaded model's call could pick the record pass's zeros.
            return self._combine(ids, tf.zeros(tf.stack([tf.size(flat), self.output_dim])))
        self._check_sharding()
        unique, inverse, counts = tf.unique_with_counts(flat, out_idx=tf.int32)
        if saving:  # SavedModel export: a static lookup + gather
            embedded = tf.gather(serving.serve(self, unique), inverse)
            training = None
        elif training and self.trainable and not getattr(self.table, "serving_only", False):
            # (a frozen layer looks up as in inference, as a frozen Keras Embedding trains nothing: no
            # insert, eviction or statistics, whatever `training` says)
            object.__setattr__(self, "_training_graph", tf.compat.v1.get_default_graph())  # trained here
            if tf.executing_eagerly() and not fills.appends(self):
                self._note_eager_fill()
            embedded = training_gather(self, unique, inverse, counts)
        elif self._shard_world.distributed:  # every rank looks up (a collective), nothing inserted
            world = self._shard_world
            rows = dynamic_exchange.sharded_lookup(self.table, unique, None, world, self._exchange_name, False).rows
            embedded = tf.gather(rows, inverse)
        else:
            embedded = tf.gather(self.table.lookup(unique, insert=False), inverse)
        return self._combine(ids, embedded)

    def _note_eager_fill(self) -> None:
        """Eager training calls: a second one before the buffer's update (a layer shared by two inputs) is named.

        A traced step trains every call (``fills.py``); eagerly a step has no graph,
        so a fill whose rows no update consumed yet is only known at the next fill
        (a skipped loss-scale step also leaves one): logged once per layer.
        """
        if getattr(self, "_eager_unapplied", False) and first_time(self, "_eager_warned"):
            _log.warning(
                "hybridtf: dynamic table %r was looked up again in training mode before its table was updated. If both "
                "calls feed one loss (a layer shared by two inputs), only the last call's rows are trained eagerly: "
                "run the step traced (fit without run_eagerly, tf.function), which trains both calls, or look all ids "
                "of the shared table up in one call (tf.concat them and split the output).",
                self.name,
            )
        object.__setattr__(self, "_eager_unapplied", True)

    def _check_sharding(self) -> None:
        """A table built in one process must not train on its own in each rank of a later Horovod job."""
        if not isinstance(self.table, HybridHashTable) or self.table.world.distributed:
            return
        world = current_world()
        if world.distributed:
            raise ValueError(
                f"DynamicEmbedding {self.name!r} was built before hvd.init(), so its table is not sharded over the "
                f"{world.size} Horovod ranks and each rank would train its own copy. Call hvd.init() before building "
                "the model (its tables are then sharded by id); to continue a one-process model, save_weights there "
                "and load them into the model built after hvd.init()."
            )

    @property
    def _shard_world(self) -> World:
        """The job the table is sharded over (a packed member's view, or the Tables API's table: none)."""
        return getattr(self.table, "world", None) or World()

    @property
    def _exchange_name(self) -> str:
        return f"hybridtf_dynamic_{self.name}"

    def _combine(self, ids, embedded):
        if self.combiner is None and isinstance(ids, tf.RaggedTensor):  # as Keras Embedding: [B, None, dim]
            out = ids.with_flat_values(embedded)
        elif self.combiner is None:
            shape = tf.concat([tf.shape(ids), [self.output_dim]], 0)
            out = tf.reshape(embedded, shape)
        else:
            out = tf.math.unsorted_segment_sum(embedded, ids.value_rowids(), ids.nrows())
            n = tf.cast(tf.maximum(ids.row_lengths(), 1), out.dtype)[:, None]
            if self.combiner == "mean":
                out = out / n
            elif self.combiner == "sqrtn":
                out = out / tf.sqrt(n)
        return to_compute_dtype(out, self.compute_dtype)

    def apply_gradient(self, grad, optimizer, kind: str):
        """The fused table update for the buffer's gradient (called by the hooked optimizer)."""
        from hybridtf._src.run import sparse_apply

        if tf.executing_eagerly():
            object.__setattr__(self, "_eager_unapplied", False)

        ids = self._ids_buffer.read_value()
        n = tf.shape(ids)[0]
        if isinstance(grad, tf.IndexedSlices):
            grad = tf.math.unsorted_segment_sum(grad.values, grad.indices, n)
        grad = tf.cast(grad, tf.float32)
        if fills.repeated(self):  # filled by several lookups (micro-batches, shared layer): one row per id
            ids, grad, _, _ = fills.distinct(ids, grad)
        fills.close(self)
        world = getattr(self.table, "world", None)  # also DynamicTable's (Tables API): never sharded
        if (
            world is not None and world.distributed
        ):  # the owners sum every rank's rows and update the distinct ids they own
            received = self._received_ids.read_value()
            ids, grad = dynamic_exchange.owner_gradients(ids, grad, received, world, self._exchange_name)
        lr = tf.cast(optimizer.learning_rate, tf.float32)
        if kind == "sgd":
            return self.table.apply_sgd(ids, grad, lr)
        if kind == "adagrad":
            return self.table.apply_adagrad(
                ids,
                grad,
                lr,
                tf.constant(optimizer.epsilon, tf.float32),
                initial_accumulator_value=float(optimizer.initial_accumulator_value),
            )
        return self.table.apply_adam(
            ids,
            grad,
            sparse_apply.adam_alpha(optimizer, tf.float32),
            tf.constant(1 - optimizer.beta_1, tf.float32),
            tf.constant(1 - optimizer.beta_2, tf.float32),
            tf.constant(optimizer.epsilon, tf.float32),
            lazy=kind == "lazy_adam",
        )

    def initial_rows(self, ids):
        """The rows ``ids`` (int64) get on first sight, also for ids already stored (trained); no table changes.

        Read from an empty scratch table of the same seed and initializer, kept
        untracked (never checkpointed).
        """
        if not self.built:
            self.build(None)
        scratch = getattr(self, "_initial_rows_table", None)
        if scratch is None:
            config = dataclasses.replace(self.table.config, hot_rows=1, capacity=0, members=())
            scratch = HybridHashTable(config)
            object.__setattr__(self, "_initial_rows_table", scratch)
        return scratch.lookup(tf.reshape(tf.cast(ids, tf.int64), [-1]), insert=False)

    def stats(self) -> dict:
        """The table's statistics (eager): size, hot_used, inserts, evictions, lookups, hits, ..."""
        return self.table.stats()

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        snapshot = serving.serving_snapshot(self) if save_type == "savedmodel" and self.table is not None else None
        children = dict(super()._trackable_children(save_type, **kwargs))
        if snapshot is not None:  # the export holds plain-TF copies, never the HybridHash resource
            children["serving"] = snapshot
        elif save_type != "savedmodel" and self.table is not None:
            children["table"] = self.table
        return children

    # --- .keras files (Keras' own saving): the table's checkpoint entries as arrays -------------------
    def save_own_variables(self, store):
        if self.table is None:  # never built: nothing learned (marked, so that a load knows the file had the layer)
            store["hybridhash_unbuilt"] = np.zeros([0], np.uint8)
            return
        entries = self.table._serialize_to_tensors()
        for key in _KERAS_ENTRIES:
            store[f"hybridhash_{key}"] = entries[key].numpy()
        store["hybridhash_table_name"] = np.frombuffer(self.table.name.encode(), np.uint8)

    def load_own_variables(self, store):
        keys = set(store.keys())
        if keys == {"hybridhash_unbuilt"}:  # saved before it was built: the table stays as it is
            return
        if not keys:
            raise ValueError(
                f"DynamicEmbedding {self.name!r}: the file holds no state for this layer, so its table would stay "
                "empty. It was saved from a model in which this layer is not a DynamicEmbedding (e.g. a "
                "tf.keras.layers.Embedding), or from another model. Load a file saved from this model (same "
                "layers, names and layer types)."
            )
        missing = [f"hybridhash_{k}" for k in (*_KERAS_ENTRIES, "table_name") if f"hybridhash_{k}" not in keys]
        if missing:
            raise ValueError(
                f"DynamicEmbedding {self.name!r}: the saved layer state lacks {missing}; it was not saved from a "
                "DynamicEmbedding. Load a file saved from this model (same layers and names)."
            )
        if self.table is None:
            self.build(None)
        entries = {key: tf.constant(np.asarray(store[f"hybridhash_{key}"])) for key in _KERAS_ENTRIES}
        entries["table_name"] = tf.constant(bytes(np.asarray(store["hybridhash_table_name"])).decode())
        self.table._restore_from_tensors(entries)

    def compute_output_shape(self, input_shape):
        if self.combiner is not None:
            return tf.TensorShape([tf.TensorShape(input_shape)[0], self.output_dim])
        return tf.TensorShape(input_shape).concatenate([self.output_dim])

    @property
    def _trackable_saved_model_saver(self):
        return serving.ServedFromFunctions(self)

    def get_config(self):
        config = super().get_config()
        c = self._table_config
        config.update(
            {
                "output_dim": self.output_dim,
                "combiner": self.combiner,
                "hot_rows": c.hot_rows,
                "warmup_steps": c.warmup_steps,
                "flush_every": c.flush_every,
                "capacity": c.capacity,
                "embeddings_initializer": self.embeddings_initializer
                if isinstance(self.embeddings_initializer, str)
                else tf.keras.initializers.serialize(self.embeddings_initializer),
                "seed": self.seed,
                "count_decay": c.count_decay,
                "evict_policy": c.evict_policy,
                "ttl_steps": c.ttl_steps,
            }
        )
        return config


serving.install_export_archive_hook(DynamicEmbedding)
