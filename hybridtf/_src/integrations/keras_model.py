"""``hybridtf.keras.optimize``: packed embeddings for an unchanged Keras model.

The model instance is changed in place, per instance (no global patching):

* every packable ``tf.keras.layers.Embedding`` gets a run-time subclass whose
  lookups go through the capture context, and its ``embeddings`` variable is
  replaced by a view of its rows in a packed variable (same checkpoint key);
* the model gets a run-time subclass (same class name) whose ``call`` records
  the lookups (a pass with ``training=False``; its dead code is pruned by
  TensorFlow), computes them with one packed chain per packed table, and runs
  the real pass replaying the precomputed outputs;
* the packed variables join ``model.trainable_weights``, so ``compile`` /
  ``fit`` / ``evaluate`` / ``predict`` and the Keras optimizers work as usual:
  each packed table gets one sparse update with distinct rows per step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import tensorflow as tf
from tensorflow.python.eager import record

from hybridtf._src.caching.optimizer import hook_for_model as hook_dynamic_optimizer
from hybridtf._src.capture import context
from hybridtf._src.capture.keras_capture import SkippedLayer
from hybridtf._src.capture.subclassing import runtime_subclass
from hybridtf._src.distribute import agreement, dynamic_exchange
from hybridtf._src.integrations import (
    atomic_checkpoint,
    horovod_hooks,
    keras_callbacks,
    keras_end_of_data,
    keras_interleave,
    keras_notices,
    keras_record,
    keras_slots,
)
from hybridtf._src.integrations import keras_optimize_steps as steps
from hybridtf._src.integrations.keras_optimizers import clipping_can_be_exact, hybridize_optimizer, user_class
from hybridtf._src.integrations.keras_unpacked import (
    FusionListsMixin,
    UnpackedModelMixin,
    check_same_path,
    rank_local_variables,
    sharded_save_error,
    sharded_size,
    with_epoch_agreement,
    writes_here,
)
from hybridtf._src.integrations.keras_variables import hook_attribute_optimizers, note_split_train_step
from hybridtf._src.plan.packing import PackingPlan
from hybridtf._src.rewrite import dataflow_fusion, packed_dynamic
from hybridtf._src.rewrite.packed_storage import TableView
from hybridtf._src.rewrite.runtime import lookup_all

_log = logging.getLogger("hybridtf")


class _HybridModelMixin(
    keras_end_of_data.EndOfDataMixin, FusionListsMixin, steps.CheckpointIndexMixin, steps.PlainWeightsMixin
):
    """Per-instance overrides of an optimized Keras model (``get_weights`` / ``set_weights`` / ``count_params`` in the
    plain model's order and shapes, each table separately: ``PlainWeightsMixin``)."""

    @tf.autograph.experimental.do_not_convert
    def call(self, inputs, *args, **kwargs):
        base_call = super().call
        inputs = keras_record.with_declared_shapes(self, inputs)  # generator batches: [None, None]
        if record.could_possibly_record():  # under a gradient tape (a custom loop's step): nothing frozen alone
            keras_notices.refuse_frozen_packed_layers(self)
            keras_notices.refuse_world_change(self)
        if context.active() is not None:  # inside hybridtf.function: packed with the whole step
            with dataflow_fusion.fusing(model=self, **self._htf_fusion_options()) as scope:  # this forward pass only
                result = base_call(inputs, *args, **kwargs)
            result = scope.resolve(result) if scope is not None else result
            self._htf_note_fusions(scope)
            return result
        if args:  # e.g. call(inputs, training) from SavedModel tracing: name them
            names = self._call_spec.arg_names[1 : 1 + len(args)]
            kwargs = {**dict(zip(names, args)), **kwargs}
        record_kwargs = dict(kwargs)
        if self._expects_training_arg:
            record_kwargs["training"] = False
        requests = keras_record.step_requests(self, base_call, inputs, record_kwargs, kwargs)
        outputs = lookup_all(requests)
        with (
            context.replaying(requests, outputs),
            dataflow_fusion.fusing(model=self, **self._htf_fusion_options()) as scope,
        ):
            result = base_call(inputs, **kwargs)
        result = scope.resolve(result) if scope is not None else result
        self._htf_note_fusions(scope)
        return result

    def _htf_model_call(self):
        """The model's own ``call`` (its class's, before hybridtf's rewrite)."""
        return super().call

    def _htf_fusion_options(self) -> dict:
        if getattr(self._htf_runtime.storage, "gradient_norms", None) is not None:
            return {"enabled": False}  # exact clipping measures the lookups' own gradients
        return getattr(self, "_htf_fusion", None) or {"enabled": False}

    def _htf_note_fusions(self, scope) -> None:
        if scope is not None:  # as last traced
            object.__setattr__(self, "_htf_fusion_log", scope.log)

    def compile(self, *args, **kwargs):
        keras_notices.refuse_distribution_strategy(self, "compiled")
        keras_notices.refuse_frozen_packed_layers(self)
        keras_notices.refuse_world_change(self)
        super().compile(*args, **kwargs)
        keras_notices.run_without_xla(self)
        hook_dynamic_optimizer(self, self.optimizer)  # dynamic tables beside the packed ones
        hybridize_optimizer(
            self.optimizer,
            self._htf_runtime.storage,
            self._htf_fused_updates,
            self._htf_plain_trainable,
            exact_clipping=clipping_can_be_exact(self),
        )
        hook_attribute_optimizers(self)  # a custom train_step's own optimizers (self.wide_optimizer)

    def train_step(self, data):
        result = super().train_step(data)  # traced: a layer_variables call in the user's step has marked the model
        note_split_train_step(self)
        return result

    def fit(self, *args, **kwargs):
        storage = self._htf_runtime.storage
        keras_callbacks.adapt_callbacks(self, kwargs.get("callbacks"))  # .h5 checkpoints, table histograms
        with_epoch_agreement(self, kwargs)  # under Horovod: the ranks' batch counts at each epoch's end
        if storage.sharded:
            for callback in kwargs.get("callbacks") or ():
                horovod_hooks.shard_aware_callback(callback, storage, self)
        return super().fit(*args, **kwargs)

    @property
    def trainable_weights(self):
        weights = super().trainable_weights
        if not self.trainable:
            return weights
        return weights + [v for v in self._htf_runtime.storage.packed.values() if v.trainable]

    @property
    def non_trainable_weights(self):
        weights = super().non_trainable_weights
        if self.trainable:
            return weights
        return weights + list(self._htf_runtime.storage.packed.values())

    def get_weight_paths(self):
        """Keras's paths, and each packed table at its plain path (``emb.embeddings``) as its ``TableView``.

        Keras lists ``tf.Variable`` objects only; a packed layer's table is a view of
        the packed variable (it reads, assigns and converts like the table's variable).
        """
        paths = super().get_weight_paths()
        roots = [(layer, f"{layer.name}.") for layer in self.layers] if self._is_graph_network else [(self, "")]
        for root, prefix in roots:
            descendants, object_paths = tf.__internal__.tracking.ObjectGraphView(root).breadth_first_traversal()
            for obj in descendants:
                if isinstance(obj, TableView):
                    paths.setdefault(prefix + ".".join(ref.name for ref in object_paths[obj]), obj)
        return paths

    @property
    def _undeduplicated_weights(self):
        # ``weights`` / ``variables`` (and so ``summary``'s total, an EMA over
        # ``model.variables``) hold the packed variables too: no layer lists them among its own weights.
        return super()._undeduplicated_weights + list(self._htf_runtime.storage.packed.values())

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "savedmodel":  # traced functions capture the packed variables
            children["hybridtf_packed_tables"] = self._htf_runtime.storage
        return children

    def save_weights(self, filepath, overwrite=True, save_format=None, options=None):
        """Saves the weights in the plain model's per-table layout, crash-safe.

        A kill at any moment of the save leaves the newest complete
        checkpoint readable (``atomic_checkpoint``): the TensorFlow format
        keeps the previous checkpoint's files as a backup the state file names
        until the new one is complete; ``.weights.h5`` is written under a
        temporary name, then renamed. ``load_weights`` reads the newest
        complete one and removes what killed saves left.

        With tables sharded over the ranks of a Horovod job, every rank must
        call it with the same path (the tables are gathered, a collective);
        rank 0 writes the file, which any number of ranks (or the plain model)
        can restore. Without sharded tables every rank holds the same values:
        rank 0 writes, and the other ranks' calls write nothing (``writes_here``).
        """
        keras_notices.refuse_legacy_hdf5(filepath, save_format)
        storage = self._htf_runtime.storage
        base = super().save_weights

        def write():
            with atomic_checkpoint.crash_safe_path(filepath, overwrite) as path:
                base(path, overwrite=overwrite, save_format=save_format, options=options)

        dynamic = dynamic_exchange.sharded_tables(self)  # DynamicEmbedding tables sharded by id
        if not storage.sharded and not dynamic:
            return write() if writes_here(self, storage.world, filepath, "save_weights") else None
        check_same_path(self, storage.world, filepath)
        with contextlib.ExitStack() as stack:
            if storage.sharded:
                self._htf_optimizer_plain_variables()  # slot views exist on every rank before they are gathered
                stack.enter_context(storage.gathered())
            stack.enter_context(dynamic_exchange.gathered_exports(dynamic))
            if storage.world.rank == 0:
                write()
        # A barrier: the file is complete before any rank goes on (and maybe reads it).
        storage.world.hvd.allreduce(tf.constant(0), op=storage.world.hvd.Sum, name="hybridtf_saved_weights")
        return None

    def load_weights(self, filepath, skip_mismatch=False, by_name=False, options=None):
        keras_notices.refuse_legacy_hdf5(filepath, None)
        if str(filepath).endswith((".keras", ".weights.h5")):
            # Keras files hold the optimizer's state by position: build it first
            keras_slots.build_optimizer(self, filepath, user_class)
            atomic_checkpoint.clean_file(filepath, reading=True)  # temporaries of killed saves
        elif isinstance(filepath, (str, os.PathLike)) and not os.path.isdir(filepath):
            filepath = atomic_checkpoint.resolve(filepath)  # the newest complete checkpoint of this prefix
        with atomic_checkpoint.naming_damage(filepath):
            result = super().load_weights(filepath, skip_mismatch=skip_mismatch, by_name=by_name, options=options)
        # every rank restored the same checkpoint
        agreement.check_model_restored(self, self._htf_runtime.storage.world, rank_local_variables(self))
        return result

    def _htf_optimizer_plain_variables(self) -> None:
        optimizer = getattr(self, "optimizer", None)
        if hasattr(optimizer, "_htf_plain_variables"):
            optimizer._htf_plain_variables()

    def save(self, filepath, overwrite=True, save_format=None, **kwargs):
        keras_notices.refuse_legacy_hdf5(filepath, save_format)
        size = sharded_size(self)
        if size:
            raise sharded_save_error(size)
        if not writes_here(self, self._htf_runtime.storage.world, filepath, "save"):
            return None
        if isinstance(filepath, (str, os.PathLike)) and os.fspath(filepath).endswith(".keras"):
            with atomic_checkpoint.crash_safe_path(filepath, overwrite) as path:
                return super().save(path, overwrite=overwrite, save_format=save_format, **kwargs)
        return super().save(filepath, overwrite=overwrite, save_format=save_format, **kwargs)

    @property
    def hybridtf_plan(self) -> PackingPlan:
        """The packing plan this model runs with."""
        return self._htf_runtime.plan

    @property
    def hybridtf_skipped(self) -> list[SkippedLayer]:
        """Embedding layers left unpacked, with the reason."""
        return list(self._htf_skipped)

    @property
    def hybridtf_shared_uniques(self) -> dict[str, str]:
        """Packed tables that reuse another packed table's unique ids (table -> source), as last traced."""
        return dict(self._htf_runtime.shared_uniques)


def is_optimized(model) -> bool:
    """Whether ``optimize`` packed some of ``model``'s tables: static ones, or dynamic ones into a store.

    Example:
        >>> model = hybridtf.keras.optimize(build_my_model())  # doctest: +SKIP
        >>> hybridtf.keras.is_optimized(model)  # doctest: +SKIP
        True
    """
    return has_packed_tables(model) or isinstance(model, packed_dynamic._DynamicModelMixin)


def has_packed_tables(model) -> bool:
    """Whether ``optimize`` packed some of ``model``'s static tables (it has a packing runtime)."""
    return isinstance(model, _HybridModelMixin)


def optimize(
    model=None,
    *,
    plan: PackingPlan | None = None,
    exclude=(),
    force_groups=None,
    stats=None,
    max_shards: int | None = None,
    fused_updates: bool = True,
    shard_strategy: str = "mod",
    replicate_below_rows: int = 0,
    fuse_concat: bool = True,
    share_unique: bool = True,
    fuse_dense: bool | str = True,
    micro_batches: int | str = 1,
    interleave_from: str = "embedding",
    micro_batch_memory: float | None = None,
    interleave_groups=None,
    interleave_scale: float = 1.0,
    interleave_exclude=(),
):
    """Packs the embedding lookups of a Keras model; returns the same model, optimized.

    Every ``tf.keras.layers.Embedding`` that hybridtf can handle is packed with
    the others of the same dim and dtype into one table (D-packing), and all
    lookups of a packed table run as one fused chain per step (K-packing):
    PackIds -> UniquePartition -> gather -> StitchCombine, with one sparse
    update per packed table. The math is unchanged; the model keeps its
    weights, so wrapping a trained model changes no prediction. Layers that
    cannot be packed are left as they are (see ``model.hybridtf_skipped``).

    Also usable as a decorator on a function that builds and returns a model.

    Args:
        model: a built ``tf.keras.Model`` (functional or subclassed), or a
            model-building function (decorator use).
        plan: a packing plan to use as it is (e.g. edited and loaded from JSON).
        exclude: embedding tables to leave unpacked: table names (as
            ``model.hybridtf_plan`` lists them), layer names, layer names
            qualified by their sub-model (``"tower_b.emb"``, for sub-models
            that repeat a layer name) or the layer objects. A name several
            layers answer to is an error that lists them.
        force_groups: ``{group_name: [table names]}`` to force a grouping.
        stats: warm-up statistics per table (``hybridtf.plan.collect_stats``)
            for CalcVParam; uniform access is assumed without them.
        max_shards: at most this many shards per D-packing group when
            CalcVParam splits an above-average group (1: never split).
            Default: 8 when a GPU is visible, else 1 — on CPU the fused
            kernels are parallel inside, and every extra chain only adds ops
            (26-field W&D on 2 cores: 1.17x with 9 chains, 1.90x with 2).
        fused_updates: update each packed table with one fused op (Keras
            SGD without momentum, Adagrad, Adam, hybridtf LazyAdam; same
            math); other optimizers always use Keras's own updates.
        shard_strategy: under Horovod (``hvd.init()`` with several
            processes before ``optimize``): how each packed table's rows are
            spread over the ranks, ``"mod"`` (default) or ``"range"``.
        replicate_below_rows: under Horovod, packed tables with fewer rows
            stay whole on every rank and are trained data-parallel.
        fuse_concat: while a step is traced, a concatenation (``tf.concat``,
            ``tf.stack``, whatever layer calls it) or a sum (``Add``,
            ``tf.add_n``, ``+``) of packed lookups' outputs is computed with
            one StitchConcat op that writes every field straight into its
            columns (no per-field outputs, no concat, no split in the
            gradient; same values). ``False`` keeps the model's own ops
            (this and every other dataflow rewrite, see ``fuse_dense``).
        fuse_dense: a matrix product of such a fused concatenation (the
            MLP's first ``Dense``) is one StitchConcatMatMul through the
            distinct rows (same math, another summation order), where it
            pays: products of at most 64 units (``"always"``: any width). Also with
            ``fuse_concat``: a batched matmul of ``[B, m, 1]`` by
            ``[B, 1, n]`` (DCN's cross layer) is a broadcast multiply.
        share_unique: a packed table whose lookups all use ids that another
            packed table's chain already deduplicates (Wide & Deep: each
            feature's ids feed a wide and a deep table) takes its unique ids
            and inverse index from that chain with one cheap UniqueSubset op
            instead of its own PackIds + UniquePartition (same values, bit
            for bit). ``False`` gives every packed table its own chain.
        micro_batches: D-interleaving (PICASSO Eq. 2): each training step
            runs this many micro-batches and applies the summed gradients
            once (same math for mean losses; docs/user_guide.md). ``"auto"``:
            Eq. 2 picks it after a measured warm-up step, from the step's
            peak memory per example against ``micro_batch_memory``.
        interleave_from: ``"embedding"`` (the whole forward per micro-batch)
            or ``"mlp"`` (lookups once on the whole batch, the layers after
            them per micro-batch: bounds the MLP's peak memory).
        micro_batch_memory: Eq. 2's memory bound in bytes (default: half of
            the GPU's memory, or of the machine's RAM).
        interleave_groups: K-interleaving (Eq. 3): None (off), a number of
            groups, ``"auto"`` (Capacity_g from a measured warm-up step) or
            an ``InterleavingPlan``. Each group's chain stages run after the
            previous group's (control dependencies; bit-identical results).
        interleave_scale: factor on Eq. 3's Capacity_g (below 1: more groups).
        interleave_exclude: embedding tables (or packed tables) whose chains
            get no control dependencies.

    Returns:
        The optimized model (the same object).

    Raises:
        ValueError: the model is not built, or an invalid plan override (the
            message names the table or group).

    Example:
        >>> model = htf.keras.optimize(build_wide_and_deep())
        >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
        >>> model.fit(dataset, epochs=1)
    """
    options = dict(
        plan=plan,
        exclude=exclude,
        force_groups=force_groups,
        stats=stats,
        max_shards=max_shards,
        fused_updates=fused_updates,
        shard_strategy=shard_strategy,
        replicate_below_rows=replicate_below_rows,
        fuse_concat=fuse_concat,
        share_unique=share_unique,
        fuse_dense=fuse_dense,
        micro_batches=micro_batches,
        interleave_from=interleave_from,
        micro_batch_memory=micro_batch_memory,
        interleave_groups=interleave_groups,
        interleave_scale=interleave_scale,
        interleave_exclude=interleave_exclude,
    )
    if not (isinstance(fuse_dense, bool) or fuse_dense == "always"):
        raise ValueError(f"hybridtf.keras.optimize: fuse_dense must be True, False or 'always', got {fuse_dense!r}.")
    if model is None:
        return functools.partial(optimize, **options)
    if not isinstance(model, tf.keras.Model) and callable(model):
        builder = model

        @functools.wraps(builder)
        def build_and_optimize(*args, **kwargs):
            return optimize(builder(*args, **kwargs), **options)

        return build_and_optimize
    if not isinstance(model, tf.keras.Model):
        raise TypeError(f"optimize() takes a tf.keras.Model or a function returning one, got {type(model).__name__}.")
    if is_optimized(model) or isinstance(model, UnpackedModelMixin):
        return model
    if not model.built:
        raise ValueError("optimize() needs a built model: call it on a batch or call model.build(input_shape) first.")
    keras_notices.refuse_distribution_strategy(model, "optimized")
    keras_notices.refuse_layers_of_another_model(model)

    captured, skipped, specs = steps.capture(model)
    exclude, exclude_dynamic = steps.resolve_exclude(model, captured, packed_dynamic.dynamic_layers(model), exclude)
    dynamic = packed_dynamic.pack_dynamic(model, exclude=exclude_dynamic)  # one HybridHash store per group
    skipped = skipped + dynamic.skipped
    plan = steps.make_plan(
        specs,
        plan,
        stats=stats,
        exclude=exclude,  # the planner knows static tables
        force_groups=force_groups,
        max_shards=max_shards,
        shard_strategy=shard_strategy,
        replicate_below_rows=replicate_below_rows,
    )
    steps.check_ranks_agree(model, options, plan, [g.plan.members for g in dynamic.groups], captured)
    skipped = steps.skipped_layers(skipped, plan) + keras_notices.feature_column_layers(model)
    packed_names = {m.name for pt in plan.packed_tables for m in pt.members}
    keras_notices.warn_skipped(skipped, len(packed_names | {m for g in dynamic.groups for m in g.plan.members}))
    if not captured and not skipped and not dynamic.groups:
        keras_notices.warn_nothing_found(model)
    if not plan.packed_tables:
        _leave_unpacked(model, plan, skipped)
        packed_dynamic.attach(model, dynamic, fusion=dict(enabled=bool(fuse_concat), fuse_dense=fuse_dense))
        keras_interleave.attach_unpacked(model, plan, micro_batches=micro_batches, interleave_from=interleave_from)
        return model
    state = steps.pack_storage(model, plan, captured, share_unique=share_unique)
    _rewrite_model(model, state, skipped, fused_updates=fused_updates, fuse_concat=fuse_concat, fuse_dense=fuse_dense)
    steps.install_hooks(
        model,
        state,
        fused_updates=fused_updates,
        micro_batches=micro_batches,
        interleave_from=interleave_from,
        micro_batch_memory=micro_batch_memory,
        interleave_groups=interleave_groups,
        interleave_scale=interleave_scale,
        interleave_exclude=interleave_exclude,
    )
    packed_dynamic.attach(model, dynamic)
    model.train_function = model.test_function = model.predict_function = None
    return model


def _leave_unpacked(model: tf.keras.Model, plan: PackingPlan, skipped: list[SkippedLayer]) -> None:
    """Nothing to pack: the model stays as it is, with ``hybridtf_plan`` / ``hybridtf_skipped``."""
    model.__dict__.pop("call", None)
    model.__class__ = runtime_subclass(UnpackedModelMixin, type(model))
    object.__setattr__(model, "_htf_plan", plan)
    object.__setattr__(model, "_htf_skipped", skipped)
    if dynamic_exchange.sharded_tables(model):  # its steps exchange ids and rows: no rank waits forever
        horovod_hooks.guard_collectives(model)


def _rewrite_model(
    model: tf.keras.Model,
    state: steps.PackedState,
    skipped: list[SkippedLayer],
    *,
    fused_updates: bool,
    fuse_concat: bool,
    fuse_dense: bool,
) -> None:
    """Step 4 of ``optimize``: the model's run-time subclass that runs its step through the packed chains."""
    model.__dict__.pop("call", None)
    model.__class__ = runtime_subclass(_HybridModelMixin, type(model))
    object.__setattr__(model, "_htf_runtime", state.runtime)
    object.__setattr__(model, "_htf_skipped", skipped)
    object.__setattr__(model, "_htf_weighted_layers", state.weighted_layers)
    object.__setattr__(model, "_htf_plain_weights", state.plain_weights)
    object.__setattr__(model, "_htf_fused_updates", bool(fused_updates))
    object.__setattr__(model, "_htf_fusion", dict(enabled=bool(fuse_concat), fuse_dense=fuse_dense))
    object.__setattr__(model, "_htf_fusion_log", None)


__all__ = ["TableView", "has_packed_tables", "is_optimized", "optimize"]
