"""``HybridHashTable``: a HybridHash store held by a TF resource handle.

The store (kernels/hybrid_hash) keeps each id's row and optimizer slots in a
cold hash map + arena, and the top-k most frequent rows in a dense hot tier
refreshed by Algorithm 1 (warm-up counting, a flush every ``flush_every``
steps). This class is a ``TrackableResource``: it is created on first use (in
eager mode or under ``tf.init_scope``), destroyed with its Python object, and
checkpointed (``tf.train.Checkpoint``, ``Model.save_weights``) as the tensors
of its export: ids (ascending), rows, slots, counts, slot initial values,
step and the table's name. The hot tier is written back before the export.

A packed store (``TableConfig.members``, PICASSO's packed HybridHash) holds
several tables keyed by (member, id); every op then takes a ``members``
vector (each id's member index) and each member keeps its own seed and
initializer. ``hybridtf/_src/rewrite/packed_dynamic.py`` builds them.

Under Horovod a table can be one rank's shard of a table sharded by id
(``shard_over``, ``distribute/dynamic_exchange.py``): its checkpoint then
holds the whole table (every shard gathered, ids ascending, the tensors one
process writes) and a restore keeps the ids this rank owns.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator

import tensorflow as tf

from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.distribute.world import World
from hybridtf._src.limits import INT64_MAX
from hybridtf._src.run.loader import load_ops

STAT_NAMES = (
    "size",
    "hot_used",
    "hot_rows",
    "inserts",
    "evictions",
    "lookups",
    "hits",
    "occurrences",
    "occurrence_hits",
    "step",
    "flushes",
    "last_step_lookups",
    "last_step_hits",
    "bytes",
    "hot_bytes",
    "num_slots",
)
INITIALIZERS = ("zeros", "constant", "uniform", "normal")
EVICT_POLICIES = ("lfu", "lru")
_uid = itertools.count()


@dataclasses.dataclass(frozen=True)
class MemberInit:
    """One table of a packed store: its name and how its new rows are initialized."""

    name: str
    seed: int
    initializer: str = "uniform"
    init_a: float = -0.05
    init_b: float = 0.05


def _members(members):
    return tf.zeros([0], tf.int64) if members is None else tf.cast(members, tf.int64)


DEFAULT_HOT_ROWS = 100_000


def _whole_number(value, what: str, table: str):
    """``value`` as a Python int if it is an integer (bool excluded) that fits int64; other values unchanged.

    The range checks that follow name what each setting may be; an integer beyond int64 (the op's
    attributes) or a fractional number is refused here, naming the setting.
    """
    if isinstance(value, bool):
        return value
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{table}: {what} must be an int, got {value!r}.") from None
    if not -INT64_MAX - 1 <= number <= INT64_MAX:
        raise ValueError(f"{table}: {what} = {number} does not fit int64 (at most 2**63 - 1).")
    return number


def wrong_table_message(name: str, saved: str) -> str:
    """The error of a restore whose checkpoint entry for table ``name`` holds table ``saved``."""
    return (
        f"HybridHash table {name!r}: the checkpoint entry holds table {saved!r}. A TensorFlow checkpoint matches "
        "a model's layers by their position in the model, not by name: build the model with its layers in the "
        f"order of the model that saved it (same layers, names and order), or, if {name!r} is table {saved!r} "
        f"renamed, name the layer {saved!r}."
    )


def default_hot_rows(hot_rows, capacity) -> int:
    """``hot_rows`` as given, or the default: 100,000, or a tenth of a capacity below a million rows."""
    if hot_rows is not None:
        return hot_rows
    if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity > 0:
        return max(1, min(DEFAULT_HOT_ROWS, capacity // 10))
    return DEFAULT_HOT_ROWS


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """What a HybridHash table is: validated in Python, then again in the kernel.

    Args:
        name: the table's name (errors and checkpoints name it).
        dim: row width.
        hot_rows: rows of the hot tier (> 0).
        capacity: 0 = unbounded, else the most rows kept (least-frequent evicted).
        warmup_steps: Algorithm 1's warm-up iterations (counting only).
        flush_every: the hot tier is refilled when ``step >= warmup_steps`` and
            ``step % flush_every == 0``.
        seed: the initial rows depend only on (seed, id, initializer).
        initializer: ``zeros | constant | uniform | normal``.
        init_a: minval (uniform), mean (normal) or the constant.
        init_b: maxval (uniform) or stddev (normal).
        count_decay: counts are multiplied by it after each flush (1 = never).
        evict_policy: ``lfu`` or ``lru`` (when the capacity is reached).
        ttl_steps: > 0: rows not seen for more than this many steps are evicted at flushes.
    """

    name: str
    dim: int
    hot_rows: int
    capacity: int = 0
    warmup_steps: int = 0
    flush_every: int = 1
    seed: int = 0
    initializer: str = "uniform"
    init_a: float = -0.05
    init_b: float = 0.05
    count_decay: float = 1.0
    evict_policy: str = "lfu"
    ttl_steps: int = 0
    members: tuple = ()

    def __post_init__(self):
        t = f"HybridHash table {self.name!r}"
        for what in ("dim", "hot_rows", "capacity", "warmup_steps", "flush_every", "seed", "ttl_steps"):
            # ints only (NumPy integers too), never a float that the op's int attribute would truncate
            object.__setattr__(self, what, _whole_number(getattr(self, what), what, t))
        fixes = {
            "dim": "Pass the embedding width (output_dim).",
            "hot_rows": "Pass the number of most frequent rows to keep in the hot tier, e.g. 10-20% of the distinct "
            "ids you expect (the rest stay in the hash map), or leave it out for the default.",
        }
        for what, fix in fixes.items():
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{t}: {what} must be a positive int, got {value!r}. {fix}")
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 0:
            raise ValueError(f"{t}: capacity must be 0 (unbounded) or a positive int, got {self.capacity!r}.")
        if self.capacity and self.hot_rows >= self.capacity:
            raise ValueError(
                f"{t}: hot_rows ({self.hot_rows}) must be smaller than capacity ({self.capacity}): eviction never "
                "removes hot rows, so once a flush made every row hot the full table could take no new id. Use a "
                "hot tier of a fraction of the capacity (e.g. hot_rows=capacity // 10), or capacity=0 (unbounded)."
            )
        steps_max = 0xFFFFFFFF  # the store counts steps in 32 bits
        if not (0 <= self.warmup_steps <= steps_max and 1 <= self.flush_every <= steps_max and self.ttl_steps >= 0):
            raise ValueError(
                f"{t}: need warmup_steps in [0, {steps_max}], flush_every in [1, {steps_max}] and ttl_steps >= 0 "
                f"(0 = off), got {self.warmup_steps}, {self.flush_every}, {self.ttl_steps}."
            )
        if self.initializer not in INITIALIZERS:
            raise ValueError(f"{t}: initializer must be one of {INITIALIZERS}, got {self.initializer!r}.")
        if self.evict_policy not in EVICT_POLICIES:
            raise ValueError(f"{t}: evict_policy must be one of {EVICT_POLICIES}, got {self.evict_policy!r}.")
        if not 0.0 < self.count_decay <= 1.0:
            raise ValueError(f"{t}: count_decay must be in (0, 1], got {self.count_decay!r}.")
        for init in (self, *self.members):
            if not (math.isfinite(init.init_a) and math.isfinite(init.init_b)):
                who = t if init is self else f"{t}, table {init.name!r}"
                raise ValueError(
                    f"{who}: the initializer's parameters must be finite, got {init.init_a!r} and {init.init_b!r} "
                    "(rows would be inf or NaN); check the embeddings_initializer's mean, stddev, minval, maxval or "
                    "value."
                )

    def op_attrs(self) -> dict:
        attrs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "members"}
        attrs["table_name"] = attrs.pop("name")
        attrs["seed"] = int(self.seed) & 0x7FFFFFFFFFFFFFFF
        if self.members:
            attrs["member_seeds"] = [int(m.seed) & 0x7FFFFFFFFFFFFFFF for m in self.members]
            attrs["member_initializers"] = [m.initializer for m in self.members]
            attrs["member_init_a"] = [float(m.init_a) for m in self.members]
            attrs["member_init_b"] = [float(m.init_b) for m in self.members]
        return attrs


class HybridHashTable(tf.saved_model.experimental.TrackableResource):
    """A HybridHash dynamic embedding table (any int64 id -> row).

    Args:
        config: a ``TableConfig``.

    Example:
        >>> table = HybridHashTable(TableConfig("items", dim=8, hot_rows=1000))
        >>> rows = table.lookup(tf.constant([3, 2**60], tf.int64))      # inserted
        >>> table.apply_adagrad(ids, grad_rows, lr=0.1, epsilon=1e-7)
    """

    def __init__(self, config: TableConfig):
        self._config = config
        self._world = World()
        self._shared_name = f"{config.name}_hybrid_hash_{next(_uid)}"
        self.imports = 0  # import_ calls (restores): a SavedModel snapshot of older content is stale
        super().__init__()
        with tf.init_scope():  # created once, outside any function being traced
            self.resource_handle  # noqa: B018

    @property
    def config(self) -> TableConfig:
        return self._config

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def world(self) -> World:
        """The Horovod job this table is sharded over by id (one process: not sharded)."""
        return self._world

    def shard_over(self, world: World) -> None:
        """This store becomes rank ``world.rank``'s shard (``distribute/dynamic_exchange.py``).

        Its checkpoints then hold the whole table (gathered from every rank,
        a collective) and a restore keeps the rows this rank owns, so a
        checkpoint moves between any numbers of ranks.
        """
        self._world = world

    def _create_resource(self):
        return load_ops().hybrid_tf_hybrid_hash_table(shared_name=self._shared_name, **self._config.op_attrs())

    def _destroy_resource(self):
        tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    # --- ops -------------------------------------------------------------------------------------
    def check_ids(self, ids):
        """Raises a TypeError naming the table unless ids are integers; returns them as int64."""
        dtype = tf.as_dtype(ids.dtype)
        if dtype not in (tf.int64, tf.int32):
            raise TypeError(
                f"HybridHash table {self.name!r}: ids must be int64 (or int32), got {dtype.name}. Fix: map "
                "strings to int64 ids first, e.g. tf.strings.to_hash_bucket_fast(x, 2**63 - 1) or "
                "tf.bitcast(tf.fingerprint(...), tf.int64); reinterpret uint64 hashes with tf.bitcast(x, tf.int64) "
                "(a cast would wrap or clip them); cast small unsigned ints and floats with tf.cast(x, tf.int64)."
            )
        return tf.cast(ids, tf.int64) if dtype != tf.int64 else ids

    def lookup(self, ids, counts=None, insert: bool = True, members=None):
        """Rows ``[n, dim]`` of the 1-D ids (training: find-or-insert and count; else read only).

        ``members``: in a packed store, each id's member index (None: member 0).
        """
        ids = self.check_ids(tf.convert_to_tensor(ids))
        counts = tf.zeros([0], tf.int64) if counts is None else tf.cast(counts, tf.int64)
        return load_ops().hybrid_tf_hybrid_hash_lookup(
            self.resource_handle, ids, counts, _members(members), dim=self._config.dim, insert=insert
        )

    def lookup_records(self, ids, counts=None, members=None):
        """A training lookup that also returns each id's record hint: ``(rows [n, dim], records [n])``.

        ``records`` (each row's record index, with its hot-tier entry in the high bits) are hints for
        the ``records=`` argument of the fused updates of the same step: the update then reaches each
        row without probing the hash map again, and when it gets exactly this lookup's ids, members
        and records with no flush, eviction or import in between, without reading any record
        header. A stale hint (e.g. after a flush or import in between) is detected and probed
        instead, so it never changes a result.
        """
        ids = self.check_ids(tf.convert_to_tensor(ids))
        counts = tf.zeros([0], tf.int64) if counts is None else tf.cast(counts, tf.int64)
        return tuple(
            load_ops().hybrid_tf_hybrid_hash_lookup_records(
                self.resource_handle, ids, counts, _members(members), dim=self._config.dim
            )
        )

    def _apply(self, kind, records, *args, **attrs):
        """The fused update op ``kind`` (``records``: the lookup's record hints, or None to probe every id)."""
        args = (self.resource_handle, *args)
        if records is None:
            return getattr(load_ops(), f"hybrid_tf_hybrid_hash_apply_{kind}")(*args, **attrs)
        return getattr(load_ops(), f"hybrid_tf_hybrid_hash_apply_{kind}_records")(*args, records, **attrs)

    def apply_sgd(self, ids, grad, lr, end_step=True, members=None, records=None):
        return self._apply("sgd", records, ids, grad, lr, _members(members), end_step=end_step)

    def apply_adagrad(
        self, ids, grad, lr, epsilon, initial_accumulator_value=0.1, end_step=True, members=None, records=None
    ):
        return self._apply(
            "adagrad",
            records,
            ids,
            grad,
            lr,
            epsilon,
            _members(members),
            initial_accumulator_value=initial_accumulator_value,
            end_step=end_step,
        )

    def apply_adam(
        self,
        ids,
        grad,
        alpha,
        one_minus_beta1,
        one_minus_beta2,
        epsilon,
        lazy=False,
        end_step=True,
        members=None,
        records=None,
    ):
        args = (ids, grad, alpha, one_minus_beta1, one_minus_beta2, epsilon, _members(members))
        return self._apply("adam", records, *args, lazy=lazy, end_step=end_step)

    def decay_adam_moments(self, one_minus_beta1, one_minus_beta2):
        """Keras Adam's data-free moment decay alone on every stored row (the step that finds the end of the data)."""
        return load_ops().hybrid_tf_hybrid_hash_decay_adam_moments(
            self.resource_handle, one_minus_beta1, one_minus_beta2
        )

    def end_step(self):
        """Ends a step that had no update (Algorithm 1's flush check, step + 1)."""
        return load_ops().hybrid_tf_hybrid_hash_end_step(self.resource_handle)

    def flush(self):
        """Writes the hot tier back and refills it with the top-k rows by frequency now."""
        return load_ops().hybrid_tf_hybrid_hash_flush(self.resource_handle)

    def stats_tensor(self):
        """An int64 vector in ``STAT_NAMES`` order."""
        return load_ops().hybrid_tf_hybrid_hash_stats(self.resource_handle)

    def stats(self) -> dict:
        """The statistics as a dict of Python ints (eager), see ``STAT_NAMES``."""
        return dict(zip(STAT_NAMES, (int(v) for v in self.stats_tensor().numpy())))

    def export(self):
        """``(ids, rows, slots, counts, slot_init, step)``; ids ascending, hot tier written back first."""
        return self.export_with_members()[:6]

    def export_with_members(self):
        """``export()`` plus each row's member index; rows sorted by (member, id)."""
        return load_ops().hybrid_tf_hybrid_hash_export(self.resource_handle, dim=self._config.dim)

    def import_(self, ids, rows, slots, counts, slot_init, step, members=None, member: int = -1):
        """Replaces the content with an export (same table, same dim).

        ``member >= 0`` replaces that member's rows only (a packed store).
        """
        self.imports += 1
        return load_ops().hybrid_tf_hybrid_hash_import(
            self.resource_handle, ids, rows, slots, counts, slot_init, step, _members(members), member=member
        )

    # --- checkpoints -----------------------------------------------------------------------------
    def _serialize_to_tensors(self):
        return dynamic_exchange.checkpoint_tensors(self, self._world)

    def _restore_from_tensors(self, restored_tensors):
        t = restored_tensors
        saved_name = t["table_name"]
        if tf.executing_eagerly():
            saved = saved_name.numpy().decode()
            if saved != self.name:
                raise ValueError(wrong_table_message(self.name, saved))
            check = tf.no_op()
        else:
            check = tf.debugging.assert_equal(
                saved_name,
                tf.constant(self.name),
                message=f"HybridHash table {self.name!r}: the checkpoint entry holds another table; restore a "
                "checkpoint of this model (same layers, names and order)",
            )
        ids, rows, slots, counts = t["ids"], t["rows"], t["slots"], t["counts"]
        if self._world.distributed:  # the whole table was saved: keep this rank's ids
            ids, rows, slots, counts = dynamic_exchange.own_part(ids, rows, slots, counts, self._world)
        with tf.control_dependencies([check]):
            return self.import_(ids, rows, slots, counts, t["slot_init"], t["step"])
