"""Packed HybridHash: the DynamicEmbedding tables of a group share one store and one chain.

PICASSO's packed HybridHash (§III-B D-packing applied to §III-D caching):
``hybridtf.keras.optimize`` groups the model's ``DynamicEmbedding`` layers by
what a store holds for all its tables (dim, hot size, warm-up, flush interval,
count decay, eviction policy, TTL) and gives each group ONE HybridHash store,
keyed by (member, id): every int64 id of every member stays distinct, and each
member keeps its own seed and initializer, so its rows are exactly those of
the unpacked layer. The store's hot tier holds ``sum(hot_rows)`` rows, chosen
by Algorithm 1 over all members.

One chain per group and step (``DynamicGroup.lookup``), built from the static
packed chain's fused pieces: the ids of every member's lookup, one tensor per
field (never concatenated), are made distinct over (member, id) by one
``HybridHashUniqueFields`` (``caching/member_unique.py``: unique ids, their
members, the int32 inverse and the counts), looked up by one find-or-insert op, written into one
trainable distinct-rows buffer, and ONE ``StitchCombine`` over the buffer's
value and the inverse gives every lookup's output (one-hot rows or pooled
bags), exactly as a static packed table's gathered rows do. So the dataflow
fusions (``rewrite/dataflow_fusion.py``: Concatenate -> StitchConcat, its
first Dense -> StitchConcatMatMul) apply to dynamic members as to static
ones; a model whose only packed tables are dynamic gets them through
``attach(..., fusion=...)``. Backward, StitchCombineGrad (or the fused
concat's gradient) sums every position's gradient into its distinct row:
the buffer's gradient is a dense ``[distinct, dim]`` tensor that goes
straight to ONE fused update per step (with the members vector) through
``dynamic_optimizer``'s hook, which ends the store's step once. No per-field
split, reshape gradient or segment sum remains.

Checkpoints stay per table: each member layer's ``table`` is a
``MemberTable`` that saves and restores only that member's (ids, rows, slots,
counts) under the layer's own checkpoint key, with the same tensors as an
unpacked ``HybridHashTable``, so packed and plain checkpoints load into each
other. Statistics (hit ratio, size, inserts, evictions) are per store: every
member layer reports its group's store.

Under Horovod (``hvd.init()`` before the model is built) each store is this
rank's shard: a (member, id) pair lives on the owner of its id alone
(``dynamic_exchange.owner_of``), as in the unpacked sharded layer. Per step
ONE alltoall carries the group's (id, member, count) triples to their owners,
which unique the pairs, sum the counts and find-or-insert once; the rows come
back by the reverse alltoall (``dynamic_exchange.sharded_packed_lookup``).
Backward, the buffer's gradient rows take the same route and the owner runs
ONE fused update on the pairs it owns. A ``MemberTable`` checkpoint then
holds the member's whole table (gathered; a restore keeps this rank's ids),
so checkpoints move between packed / unpacked models and N / M ranks.

Not packed (``model.hybridtf_skipped`` says why): layers with a ``capacity``
(eviction chooses victims per table; over a shared store it would choose
others), non-trainable or unbuilt layers, excluded ones, and, under Horovod,
layers built before ``hvd.init()`` (not sharded: their call raises).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading

import tensorflow as tf
from tensorflow.python.saved_model import save_context

from hybridtf._src import thread_state
from hybridtf._src.caching import fills
from hybridtf._src.caching.buffer_guard import guard
from hybridtf._src.caching.layer import DynamicEmbedding
from hybridtf._src.caching.member_unique import unique_member_fields
from hybridtf._src.caching.table import HybridHashTable, MemberInit, TableConfig
from hybridtf._src.capture import context
from hybridtf._src.capture.context import LookupRequest
from hybridtf._src.capture.keras_capture import SkippedLayer, to_compute_dtype
from hybridtf._src.capture.lookup_api import prepare_ids
from hybridtf._src.capture.subclassing import PlainConstruction, runtime_subclass
from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.distribute.world import current_world
from hybridtf._src.rewrite import dataflow_fusion
from hybridtf._src.rewrite.dynamic_member_table import MemberTable
from hybridtf._src.rewrite.lookup_chain import _reshape
from hybridtf._src.run import gradient_arrivals
from hybridtf._src.run.stitch_combine import stitch_combine

GROUP_FIELDS = ("dim", "hot_rows", "warmup_steps", "flush_every", "count_decay", "evict_policy", "ttl_steps")


@dataclasses.dataclass(frozen=True)
class DynamicGroupPlan:
    """One packed HybridHash store: its name, what its members share and the members, in order."""

    name: str
    dim: int
    hot_rows_per_table: int
    warmup_steps: int
    flush_every: int
    count_decay: float
    evict_policy: str
    ttl_steps: int
    members: tuple[str, ...]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["members"] = list(self.members)
        return d


@dataclasses.dataclass
class DynamicPacking:
    """What ``pack_dynamic`` did: the groups (with their runtimes) and the layers it left alone."""

    groups: list
    skipped: list

    @property
    def plan(self) -> list[DynamicGroupPlan]:
        return [g.plan for g in self.groups]

    @property
    def layer_names(self) -> set[str]:
        """The names of every DynamicEmbedding layer of the model, packed or not."""
        return {m for g in self.groups for m in g.plan.members} | {s.name for s in self.skipped}

    def to_json(self) -> str:
        return json.dumps([p.to_dict() for p in self.plan], indent=1)


_state = threading.local()


@contextlib.contextmanager
def training_lookups():
    """Stores looked up inside are looked up for training (micro-batches from the MLP run the lookups of the
    step outside the model's call, whose training flag they would otherwise read)."""
    with thread_state.setting(_state, "training", True, default=False):
        yield


def _training_flag() -> bool:
    """The training flag of the Keras call being traced (the model's), as a Python bool."""
    from keras.src.engine import base_layer_utils

    if getattr(_state, "training", False):
        return True
    training = base_layer_utils.call_context().training
    if training is None:
        training = tf.keras.backend.learning_phase()
    if isinstance(training, (tf.Tensor, tf.Variable)):
        training = tf.get_static_value(training)
    return bool(training)


class DynamicGroup:
    """A packed store, its distinct-rows buffer and the chain that serves its members' lookups.

    It is the ``_htf_runtime`` of its member layers (``rewrite.runtime.lookup_all``
    hands it their recorded requests) and the ``_htf_dynamic_embedding`` of its
    buffer (``caching.optimizer`` hands it the buffer's gradient).
    """

    def __init__(self, plan: DynamicGroupPlan, layers: list[DynamicEmbedding]):
        self.plan = plan
        self.layers = list(layers)
        self.member_of = {id(layer): m for m, layer in enumerate(layers)}
        first = layers[0]._table_config
        config = TableConfig(
            name=plan.name,
            dim=plan.dim,
            hot_rows=plan.hot_rows_per_table * len(layers),
            warmup_steps=first.warmup_steps,
            flush_every=first.flush_every,
            count_decay=first.count_decay,
            evict_policy=first.evict_policy,
            ttl_steps=first.ttl_steps,
            members=tuple(
                MemberInit(c.name, c.seed, c.initializer, c.init_a, c.init_b)
                for c in (layer._table_config for layer in layers)
            ),
        )
        self.table = HybridHashTable(config)
        self.world = current_world()
        if self.world.distributed:  # this rank's shard of the store (pairs owned by their id's hash)
            self.table.shard_over(self.world)
        with tf.init_scope():
            self.rows_buffer = tf.Variable(
                tf.zeros([0, plan.dim]),
                shape=tf.TensorShape([None, plan.dim]),
                trainable=True,
                name=f"{plan.name}_distinct_rows",
            )
            self.ids_buffer = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False)
            self.members_buffer = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False)
            # each distinct row's record index in the store: the update's hints (no second probe)
            self.records_buffer = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False)
            # Sharded: the distinct pairs this rank owns in the step and each received pair's position among them
            self.owned_ids = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False)
            self.owned_members = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False)
            self.owned_inverse = tf.Variable(tf.zeros([0], tf.int32), shape=tf.TensorShape([None]), trainable=False)
        self.rows_buffer._htf_dynamic_embedding = self
        guard(self.rows_buffer, plan.name)

    def lookup(self, requests) -> list:
        """One output per request of this group's members: one unique, one lookup, one StitchCombine."""
        training = _training_flag()
        with tf.name_scope(self.plan.name):
            parts = _DynamicParts(requests, self)
            unique_ids, unique_members, inverse, counts = unique_member_fields(parts.fields, parts.field_members)
            if training:
                owned = []
                accumulating = fills.active()  # a micro-batched step: one fill per micro-batch, appended
                if fills.appends(self):
                    self._check_appending(accumulating)
                if self.world.distributed:  # the pairs' owners find-or-insert them (one alltoall each way)
                    routed = dynamic_exchange.sharded_packed_lookup(
                        self.table, unique_ids, unique_members, counts, self.world, self._exchange_name, True
                    )
                    rows, records = routed.rows, routed.records
                    owned = [
                        self.owned_ids.assign(routed.owned_ids),
                        self.owned_members.assign(routed.owned_members),
                        self.owned_inverse.assign(routed.owned_inverse),
                    ]
                else:
                    rows, records = self.table.lookup_records(unique_ids, counts, members=unique_members)
                offset, filled = fills.fill(
                    self,
                    [
                        (self.ids_buffer, unique_ids),
                        (self.rows_buffer, rows),
                        (self.members_buffer, unique_members),
                        (self.records_buffer, records),
                    ],
                )
                with tf.control_dependencies(filled + owned):
                    if accumulating:  # this micro-batch's rows: an IndexedSlices gradient at their offsets
                        start = tf.constant(0, tf.int32) if offset is None else offset
                        rows = tf.gather(self.rows_buffer, start + tf.range(tf.shape(unique_ids)[0]))
                    else:
                        rows = self.rows_buffer.read_value()  # its gradient: one dense row per distinct (member, id)
            elif self.world.distributed:  # every rank looks up (a collective), nothing inserted
                rows = dynamic_exchange.sharded_packed_lookup(
                    self.table, unique_ids, unique_members, None, self.world, self._exchange_name, False
                ).rows
            else:
                rows = self.table.lookup(unique_ids, insert=False, members=unique_members)
            gradient_arrivals.register_fields(rows, [req.table for req in requests])
            outs = stitch_combine(
                rows,
                inverse,
                parts.sizes,
                parts.combiners,
                field_segments=parts.field_segments,
                segment_lengths=parts.segment_lengths,
            )
            return [
                _output(req.owner, ids, out, self.plan.dim) for req, ids, out in zip(requests, parts.prepared, outs)
            ]

    def _check_appending(self, accumulating: bool) -> None:
        """A second lookup of the store in one step: a micro-batch's (appended), else refused with the fix."""
        if self.world.distributed:
            raise ValueError(
                fills.SHARDED_MESSAGE.format(name=f"{self.plan.name!r} (the packed store of {list(self.plan.members)})")
            )
        if not accumulating:  # the first call read the buffer whole (a dense gradient of that call's rows)
            raise ValueError(
                f"the packed dynamic store {self.plan.name!r} (tables {list(self.plan.members)}) is looked up by two "
                "calls of the model in one training step, and a packed store's step buffer serves one call per "
                "step (micro-batched steps excepted). Call the model once per step (tf.concat the inputs and split "
                "the output), or leave these tables unpacked: htf.keras.optimize(model, exclude=[...]) (an unpacked "
                "DynamicEmbedding trains every call of a traced step)."
            )

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def _exchange_name(self) -> str:
        return f"hybridtf_dynamic_{self.plan.name}"

    def apply_gradient(self, grad, optimizer, kind: str):
        """The store's fused update for the buffer's gradient (called by the hooked optimizer), under the
        store's name scope (the report's timing counts it in the store's chain)."""
        with tf.name_scope(self.plan.name):
            return self._apply_gradient(grad, optimizer, kind)

    def _apply_gradient(self, grad, optimizer, kind: str):
        from hybridtf._src.run import sparse_apply

        ids = self.ids_buffer.read_value()
        members = self.members_buffer.read_value()
        records = self.records_buffer.read_value()
        n = tf.shape(ids)[0]
        if isinstance(grad, tf.IndexedSlices):
            grad = tf.math.unsorted_segment_sum(grad.values, grad.indices, n)
        grad = tf.cast(grad, tf.float32)
        if fills.repeated(self):  # filled once per micro-batch: one row per distinct (member, id) pair
            ids, grad, members, records = fills.distinct(ids, grad, members, records)
        fills.close(self)
        if self.world.distributed:  # the owners sum every rank's rows and update the pairs they own, once
            owned = self.owned_ids.read_value()
            grad = dynamic_exchange.owner_packed_gradients(
                ids, grad, self.owned_inverse.read_value(), tf.shape(owned)[0], self.world, self._exchange_name
            )
            ids, members = owned, self.owned_members.read_value()
        lr = tf.cast(optimizer.learning_rate, tf.float32)
        if kind == "sgd":
            return self.table.apply_sgd(ids, grad, lr, members=members, records=records)
        if kind == "adagrad":
            return self.table.apply_adagrad(
                ids,
                grad,
                lr,
                tf.constant(optimizer.epsilon, tf.float32),
                initial_accumulator_value=float(optimizer.initial_accumulator_value),
                members=members,
                records=records,
            )
        return self.table.apply_adam(
            ids,
            grad,
            sparse_apply.adam_alpha(optimizer, tf.float32),
            tf.constant(1 - optimizer.beta_1, tf.float32),
            tf.constant(1 - optimizer.beta_2, tf.float32),
            tf.constant(optimizer.epsilon, tf.float32),
            lazy=kind == "lazy_adam",
            members=members,
            records=records,
        )


class _DynamicParts:
    """The requests of one packed store as StitchCombine takes them: flat ids, members, sizes, bags."""

    def __init__(self, requests, group: DynamicGroup):
        self.prepared, self.combiners = [], []
        flats, member_list, bag_lengths, segments = [], [], [], []
        for req in requests:
            layer = req.owner
            ids = req.ids
            if not isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
                ids = tf.convert_to_tensor(ids)
            group.table.check_ids(ids)
            combiner = layer.combiner or "none"
            ids = prepare_ids(ids, combiner, layer.name, check_splits=True)
            flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids  # the unique op reads it flat
            if combiner != "none":  # a rank-2 RaggedTensor of bags
                bag_lengths.append(ids.row_lengths())
                segments.append(ids.nrows(out_type=tf.int64))
            else:
                segments.append(None)
            self.prepared.append(ids)
            self.combiners.append(combiner)
            flats.append(tf.cast(flat, tf.int64))
            member_list.append(group.member_of[id(layer)])
        static = [f.shape.num_elements() for f in flats]
        if all(n is not None for n in static):
            self.sizes = tf.constant(static, tf.int64)
        else:
            self.sizes = tf.stack([tf.size(f, out_type=tf.int64) for f in flats])
        self.fields = flats  # one tensor per field, never concatenated (HybridHashUniqueFields)
        self.field_members = tf.constant(member_list, tf.int64)
        if bag_lengths:
            self.field_segments = tf.stack([self.sizes[f] if s is None else s for f, s in enumerate(segments)])
            self.segment_lengths = tf.cast(tf.concat(bag_lengths, 0), tf.int64)
        else:
            self.field_segments = self.segment_lengths = None


def _output(layer, ids, out, dim: int):
    """A StitchCombine field output in the shape (and compute dtype) of the layer's own output."""
    if layer.combiner is None:
        out = _reshape(out, ids, dim)
    return to_compute_dtype(out, layer.compute_dtype)


class _PackedMemberMixin(PlainConstruction):
    """Per-instance overrides of a packed DynamicEmbedding: lookups go through the capture context."""

    @tf.autograph.experimental.do_not_convert
    def call(self, inputs, training=None):
        if save_context.in_save_context():  # SavedModel export: the layer's plain-TF snapshot of its rows
            return super().call(inputs, training=training)
        request = LookupRequest(self.name, inputs, self.combiner or "none", owner=self)
        return context.dispatch(request, lambda: self._htf_placeholder(inputs), lambda: self._htf_direct(request))

    def _htf_placeholder(self, inputs):
        ids = inputs
        if not isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
            ids = tf.convert_to_tensor(ids)
        ids = prepare_ids(ids, self.combiner or "none", self.name)
        if self.combiner is not None:
            return tf.zeros(tf.stack([ids.nrows(out_type=tf.int32), self.output_dim]), self.compute_dtype)
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(tf.zeros(tf.stack([tf.size(ids.flat_values), self.output_dim])))
        return tf.zeros(tf.concat([tf.shape(ids), [self.output_dim]], 0), self.compute_dtype)

    def _htf_direct(self, request):
        """The layer called on its own (outside the model's call): its group's chain for this lookup."""
        return self._htf_runtime.lookup([request])[0]

    @property
    def trainable_weights(self):
        # Every member shows the group's buffer (Keras dedups it in the model's weights), so each
        # layer keeps its checkpoint key (functional models number the layers that have weights).
        return [self._htf_runtime.rows_buffer] if self.trainable else []


class _DynamicModelMixin(PlainConstruction):
    """A model whose only packed tables are dynamic: its call records the lookups, then replays them."""

    @tf.autograph.experimental.do_not_convert
    def call(self, inputs, *args, **kwargs):
        if getattr(self, "_htf_runtime", None) is not None or context.active() is not None:
            return super().call(inputs, *args, **kwargs)  # the static packing's call records them too
        from hybridtf._src.integrations import keras_record
        from hybridtf._src.rewrite.runtime import lookup_all

        base_call = super().call
        inputs = keras_record.with_declared_shapes(self, inputs)  # generator batches: [None, None]
        if args:
            names = self._call_spec.arg_names[1 : 1 + len(args)]
            kwargs = {**dict(zip(names, args)), **kwargs}
        record_kwargs = dict(kwargs)
        if self._expects_training_arg:
            record_kwargs["training"] = False
        requests = keras_record.step_requests(self, base_call, inputs, record_kwargs, kwargs)
        outputs = lookup_all(requests)
        fusion = getattr(self, "_htf_dynamic_fusion", None) or {"enabled": False}
        with context.replaying(requests, outputs), dataflow_fusion.fusing(model=self, **fusion) as scope:
            result = base_call(inputs, **kwargs)
        if scope is None:
            return result
        result = scope.resolve(result)
        object.__setattr__(self, "_htf_fusion_log", scope.log)  # hybridtf_fused_*, as last traced
        return result


def _group_key(layer) -> tuple:
    c = layer._table_config
    return (c.dim, c.hot_rows, c.warmup_steps, c.flush_every, c.count_decay, c.evict_policy, c.ttl_steps)


def is_packed_member(layer) -> bool:
    """Whether ``layer`` is a DynamicEmbedding that ``optimize`` packed into a group's store."""
    return isinstance(layer, _PackedMemberMixin)


def dynamic_layers(model) -> list:
    """The model's ``DynamicEmbedding`` layers, each once, in layer order."""
    seen, out = set(), []
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, DynamicEmbedding) and id(layer) not in seen:
            seen.add(id(layer))
            out.append(layer)
    return out


def pack_dynamic(model, exclude=()) -> DynamicPacking:
    """Groups the model's DynamicEmbedding layers into packed stores and moves their rows there.

    Args:
        model: a built Keras model.
        exclude: the layer objects to leave unpacked (``optimize`` resolves its names to them).

    Returns:
        A ``DynamicPacking`` (groups and skipped layers with the reason).

    Example:
        >>> packing = pack_dynamic(model)
        >>> [g.plan.members for g in packing.groups]
        [('user', 'item', 'ad')]
    """
    skipped, by_key = [], {}
    for layer in dynamic_layers(model):
        c = layer._table_config
        if any(layer is x for x in exclude):
            skipped.append(SkippedLayer(layer.name, "excluded by user (optimize(exclude=...))"))
        elif layer.table is None:
            skipped.append(SkippedLayer(layer.name, "DynamicEmbedding not built: build the model before optimize()"))
        elif current_world().distributed and not layer.table.world.distributed:
            skipped.append(
                SkippedLayer(
                    layer.name,
                    f"DynamicEmbedding built before hvd.init(): its table is not sharded over the "
                    f"{current_world().size} ranks (its call raises); build the model after hvd.init()",
                )
            )
        elif not layer.trainable:
            skipped.append(SkippedLayer(layer.name, "non-trainable DynamicEmbedding: left as its own store"))
        elif c.capacity:
            skipped.append(
                SkippedLayer(
                    layer.name,
                    f"DynamicEmbedding with capacity={c.capacity}: eviction chooses victims per table, a packed "
                    "store would choose them over all its tables; set capacity=0 (unbounded) or ttl_steps to pack it",
                )
            )
        else:
            by_key.setdefault(_group_key(layer), []).append(layer)
    groups = []
    for k, (key, layers) in enumerate(by_key.items()):
        dim, hot, warmup, flush, decay, policy, ttl = key
        # Under Horovod a group of one is packed too: its store's chain serves every call of a step with one
        # exchange, where the unpacked sharded layer refuses a second call (a layer shared by two inputs).
        if len(layers) == 1 and not current_world().distributed:
            skipped.append(SkippedLayer(layers[0].name, "the only DynamicEmbedding with its settings: nothing to pack"))
            continue
        name = f"hybridtf_dynamic_d{dim}" + (f"_{k}" if len(by_key) > 1 else "")
        plan = DynamicGroupPlan(name, dim, hot, warmup, flush, decay, policy, ttl, tuple(x.name for x in layers))
        group = DynamicGroup(plan, layers)
        for m, layer in enumerate(layers):
            old = layer.table
            view = MemberTable(group, m, layer._table_config)
            view.import_(*old.export())  # a trained layer keeps its rows, slots and counts
            layer.__dict__.pop("call", None)
            layer.__class__ = runtime_subclass(_PackedMemberMixin, type(layer))
            object.__setattr__(layer, "table", view)
            object.__setattr__(layer, "_htf_runtime", group)
        groups.append(group)
    return DynamicPacking(groups, skipped)


def attach(model, packing: DynamicPacking, fusion: dict | None = None) -> None:
    """Gives ``model`` the call that records and replays its dynamic lookups (when it has packed stores).

    ``fusion``: ``dataflow_fusion.fusing`` options for a model whose only packed tables are
    dynamic (its replay pass then fuses concatenations and the first Dense over the stores'
    StitchCombine outputs as for static tables); None: no fusion.
    """
    object.__setattr__(model, "_htf_dynamic", packing)
    object.__setattr__(model, "_htf_dynamic_fusion", dict(fusion) if fusion else None)
    if not packing.groups:
        return
    model.__dict__.pop("call", None)
    model.__class__ = runtime_subclass(_DynamicModelMixin, type(model))
    model.train_function = model.test_function = model.predict_function = None


__all__ = ["DynamicGroup", "DynamicGroupPlan", "DynamicPacking", "MemberTable", "attach", "pack_dynamic"]
