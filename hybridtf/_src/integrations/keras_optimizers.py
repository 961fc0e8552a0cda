"""Keras optimizers and hybridtf: LazyAdam, and fused updates of packed tables.

An optimized model routes the gradient of each packed table (one IndexedSlices
with distinct rows per step) to one fused ``HybridTF>SparseApply*`` op that
uses the Keras optimizer's own slot variables and hyperparameters, instead of
Keras's per-variable chain (dedup, scatter, gather, sqrt, ...). Everything
else goes through the Keras optimizer unchanged. Only configurations whose
math the fused ops reproduce exactly are fused; anything else (momentum,
AMSGrad, clipping, weight decay, EMA, other optimizers) uses Keras as is.

A packed table with L1/L2-regularized members gets the regularizer's gradient
from the optimizer (``hybridtf._src.rewrite.regularization``): inside the fused
update (``HybridTF>RegularizedApply*``), or added to the gradient Keras applies.
"""

from __future__ import annotations

import logging
import re

import tensorflow as tf

from hybridtf._src.capture.subclassing import runtime_subclass
from hybridtf._src.distribute import gradients
from hybridtf._src.gradient_registry import graph_owned_gradients
from hybridtf._src.integrations import keras_end_of_data, keras_kept_rows, keras_legacy_slots, keras_slots
from hybridtf._src.integrations.keras_horovod_classes import (
    horovod_class_with,
    is_horovod_class,
    is_horovod_distributed,
)
from hybridtf._src.integrations.keras_lazy_adam import LazyAdam, _check_lazy, _mark_lazy
from hybridtf._src.rewrite import gradient_norms, regularization
from hybridtf._src.run import regularized_apply, sparse_apply


def user_class(optimizer, skip: tuple = ()) -> type:
    """The optimizer's own class, under hybridtf's (and ``skip``'s) and Horovod's run-time subclasses."""
    mixins = (_HybridOptimizerMixin, *skip)
    for cls in type(optimizer).__mro__:
        if issubclass(cls, mixins) or is_horovod_class(cls):
            continue
        return cls
    return type(optimizer)


_log = logging.getLogger("hybridtf")


def clipping_can_be_exact(model, optimizer=None) -> bool:
    """Whether ``clipnorm`` / ``global_clipnorm`` / ``clipvalue`` of ``optimizer`` (default: ``model``'s compiled
    one) can be made exact on ``model``'s packed tables.

    Its packed tables' per-lookup gradients are measured or clipped (``rewrite/gradient_norms.py``) in one
    process, for a Keras optimizer without a loss-scale wrapper (its gradients are scaled), in a model
    without micro-batches or dynamic tables (their updates take other routes).
    """
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer) or loss_scale_inner(optimizer) is not None:
        return False
    if not (optimizer.clipnorm or optimizer.global_clipnorm or optimizer.clipvalue):
        return False
    storage = model._htf_runtime.storage
    micro = getattr(model, "_htf_micro", None)
    if storage.world.distributed or getattr(model, "_htf_pending", None) is not None:
        return False
    if micro is not None and micro.num_micro_batches > 1:
        return False
    # A dynamic table's distinct-rows buffer names its layer (caching/optimizer.py reads the same attribute).
    return not any(getattr(v, "_htf_dynamic_embedding", None) is not None for v in model.trainable_variables)


def _clipping_context(world) -> str:
    """Why a packed model's clipping is not made exact: named in the warning (one process is, mostly)."""
    if world.distributed:
        return (
            f"under Horovod ({world.size} ranks) hybridtf does not clip the packed tables as Keras would (in one "
            "process, without micro-batches or dynamic tables, it does)"
        )
    return (
        "with micro-batches, dynamic tables or a loss-scale optimizer hybridtf does not clip the packed tables "
        "as Keras would (without them it does)"
    )


def _legacy_clipping_context(optimizer) -> str:
    """Why a legacy optimizer's clipping is not made exact, and the optimizer that would be (named in the warning)."""
    if not keras_legacy_slots.is_legacy(optimizer):
        return ""
    name = user_class(optimizer).__name__
    current = getattr(tf.keras.optimizers, name, None)
    instead = f"tf.keras.optimizers.{name} with the same settings clips exactly" if current is not None else ""
    why = "a tf.keras.optimizers.legacy optimizer clips inside its own apply_gradients, which hybridtf does not hook"
    return f"{why} ({instead})" if instead else why


def inexact_settings(optimizer, exact_clipping: bool = False, clip_context: str = "") -> list[str]:
    """The settings of ``optimizer`` whose math differs on packed tables, each with the reason and the fix.

    Keras hands an embedding table's gradient to the optimizer as one row per
    lookup position (a repeated id's rows separately); a packed table's
    gradient has one summed row per distinct id and spans several tables. So
    gradient clipping, once it clips, and optimizers whose update couples a
    variable's rows or counts the model's variables, compute something else.
    """
    found = []
    base = user_class(optimizer)
    clip_fix = "clip the dense layers' gradients yourself in a custom step, or train without clipping"
    if clip_context:  # why hybridtf's exact clipping is off in this model
        clip_fix = f"{clip_context}; {clip_fix}"
    if getattr(optimizer, "clipnorm", None) is not None and not exact_clipping:
        found.append(
            "clipnorm: Keras clips each variable's gradient by its own norm, taken over the per-lookup rows; a "
            f"packed variable's gradient spans several tables and has one summed row per distinct id ({clip_fix})"
        )
    if getattr(optimizer, "global_clipnorm", None) is not None and not exact_clipping:
        found.append(
            "global_clipnorm: Keras's global norm counts an embedding gradient's per-lookup rows (a repeated id's "
            f"rows separately); a packed table's gradient has one summed row per distinct id ({clip_fix})"
        )
    if getattr(optimizer, "clipvalue", None) is not None and not exact_clipping:
        found.append(
            "clipvalue: Keras clips each lookup's gradient row before repeated ids are summed; a packed table "
            f"clips the summed row ({clip_fix})"
        )
    if base is getattr(tf.keras.optimizers, "Nadam", None):
        found.append(
            "Nadam: Keras's Nadam multiplies its shared u_product once per variable and step, so its updates "
            "depend on how many variables the model has, and a packed model has fewer; "
            "tf.keras.optimizers.legacy.Nadam has no such dependence and trains packed tables exactly"
        )
    if base is getattr(tf.keras.optimizers, "Adafactor", None):
        found.append(
            "Adafactor: its factored second moments and relative step average over a whole variable's rows "
            "and columns, and a packed variable holds several tables (use Adagrad, Adam or RMSprop, or leave "
            "the tables unpacked with optimize(model, exclude=[...]))"
        )
    return found


def warn_inexact(optimizer, exact_clipping: bool = False, clip_context: str = "") -> None:
    """Logs one warning naming ``optimizer``'s settings that are not exact on packed tables, if any.

    ``clip_context``: why hybridtf's exact clipping is off here (shown with the clipping settings).
    """
    inexact = inexact_settings(optimizer, exact_clipping, clip_context)
    if inexact:
        _log.warning(
            "hybridtf: the optimizer's packed-table updates will NOT equal the plain model's:\n%s",
            "\n".join(f"  - {reason}" for reason in inexact),
        )


def fusable(optimizer, skip: tuple = ()) -> str | None:
    """The fused update kind for ``optimizer`` ("sgd", "adagrad", "adam", "lazy_adam"), or None.

    ``skip``: further run-time mixin classes to look through (the dynamic-table hook's).
    """
    base = user_class(optimizer, skip)
    if getattr(optimizer, "_agg_helper", None) is not None:  # Horovod backward_passes_per_step > 1
        return None
    if any(getattr(optimizer, name, None) is not None for name in ("clipnorm", "clipvalue", "global_clipnorm")):
        return None
    if getattr(optimizer, "use_ema", False) or getattr(optimizer, "weight_decay", None):
        return None
    if base is tf.keras.optimizers.SGD:
        return "sgd" if optimizer.momentum == 0 and not optimizer.nesterov else None
    if base is tf.keras.optimizers.Adagrad:
        return "adagrad"
    if base is tf.keras.optimizers.Adam:
        return None if optimizer.amsgrad else "adam"
    if base is LazyAdam:
        return None if optimizer.amsgrad else "lazy_adam"
    return None


def current_learning_rate(optimizer) -> None:
    """Sets a Keras optimizer's learning rate for this step (a ``LearningRateSchedule`` at ``iterations``).

    Keras does it at the start of its ``apply_gradients``; hybridtf's fused updates read
    ``optimizer.learning_rate`` before calling it, and would otherwise use the previous step's rate.
    """
    if isinstance(getattr(optimizer, "_learning_rate", None), tf.keras.optimizers.schedules.LearningRateSchedule):
        optimizer._compute_current_learning_rate()  # (a LossScaleOptimizer has none: its inner one does this)


class _HybridOptimizerMixin:
    """Per-instance override: fused updates for packed tables, Keras for the rest."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        restore = keras_kept_rows.keep_rows_without_gradient(self, grads_and_vars)  # tables without gradient
        with graph_owned_gradients():  # Keras aggregates dense gradients (all of them here) with a custom gradient
            result = self._htf_apply_gradients(grads_and_vars, *args, **kwargs)
        if restore is not None:
            restore()
        return result

    def _htf_apply_gradients(self, grads_and_vars, *args, **kwargs):
        current_learning_rate(self)  # the fused updates run before Keras's apply_gradients would set it
        storage = self._htf_storage
        if storage is not None and storage.world.distributed:
            gradients.check_shards_not_reduced(grads_and_vars, self._htf_sharded)
        if (
            storage is not None
            and storage.world.distributed
            and not is_horovod_distributed(self)
            and not gradients.already_averaged(grads_and_vars, self._htf_sharded)  # a custom step's tape did
        ):
            grads_and_vars = gradients.reduce_gradients(grads_and_vars, self._htf_sharded, storage.world)
        kind = fusable(self)
        fused = [
            (g, v) for g, v in grads_and_vars if kind and id(v) in self._htf_packed and isinstance(g, tf.IndexedSlices)
        ]
        if self._htf_reg:  # Keras's own update of a regularized packed table: add the penalty's gradient
            fused_ids = {id(v) for _, v in fused}
            grads_and_vars = [
                (regularization.with_regularization(g, v, self._htf_reg[id(v)]), v)
                if id(v) in self._htf_reg and id(v) not in fused_ids
                else (g, v)
                for g, v in grads_and_vars
            ]
        norms = getattr(storage, "gradient_norms", None)
        clips = bool(self.clipnorm or self.global_clipnorm or self.clipvalue)
        if norms is not None and clips and not fused:  # exact clipping: hybridtf clips, Keras must not clip again
            grads_and_vars = gradient_norms.clip(
                norms, grads_and_vars, self.clipnorm, self.global_clipnorm, self.clipvalue
            )
            object.__setattr__(self, "_htf_clipped", True)
            try:
                return super().apply_gradients(grads_and_vars, *args, **kwargs)
            finally:
                object.__setattr__(self, "_htf_clipped", False)
        if not fused:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        fused_ids = {id(v) for _, v in fused}
        rest = [(g, v) for g, v in grads_and_vars if id(v) not in fused_ids]
        with tf.init_scope():  # slots for every variable, as Keras would create them
            self.build([v for _, v in grads_and_vars])
        with tf.name_scope("hybridtf_fused_update"):
            for g, v in fused:
                self._htf_apply(kind, g, v)
        if rest:
            return super().apply_gradients(rest, *args, **kwargs)
        return self.iterations.assign_add(1)

    def _clip_gradients(self, grads):
        if self.__dict__.get("_htf_clipped"):  # clipped already, per table (rewrite/gradient_norms.py)
            return grads
        return super()._clip_gradients(grads)

    def _use_weight_decay(self, variable):
        # Weight decay is per variable: a packed variable is decayed when every member table would be, and
        # kept when none would be (excluded by name, e.g. "embeddings", or by variable: the table's view or
        # the variable it replaced).
        views = self._htf_members.get(id(variable))
        if not views:
            return super()._use_weight_decay(variable)
        names = getattr(self, "_exclude_from_weight_decay_names", None) or []
        keys = set(getattr(self, "_exclude_from_weight_decay", None) or [])
        excluded = [v.table for v in views if self._var_key(v) in keys or any(re.search(p, v.name) for p in names)]
        if not excluded:
            return super()._use_weight_decay(variable)
        if len(excluded) == len(views):
            return False
        raise ValueError(
            f"weight decay excludes tables {excluded} but not the other tables packed with them in one variable "
            f"({[v.table for v in views if v.table not in excluded]}); it is applied per variable. Exclude all of "
            f"them, or keep the excluded ones out of packing: htf.keras.optimize(model, exclude={excluded})."
        )

    def add_variable_from_reference(self, model_variable, variable_name, shape=None, initial_value=None):
        slot = super().add_variable_from_reference(model_variable, variable_name, shape, initial_value)
        self._htf_slot_of[id(slot)] = (model_variable, variable_name)
        storage = self._htf_storage
        if storage is not None and id(model_variable) in self._htf_sharded:
            storage.register_sharded_slot(slot, model_variable)
        return slot

    def build(self, var_list):
        if not getattr(self, "_built", False):
            object.__setattr__(self, "_htf_var_list", list(var_list))
            if self._htf_plain_order is not None:
                # A checkpoint read before the build restores slots through ``_variables`` in the
                # plain layout only, never by position in the slot lists build creates (_accumulators, ...).
                self._maybe_initialize_trackable()
                deferred = self._deferred_dependencies
                for name in [n for n in deferred if n != "_variables"]:
                    del deferred[name]
        super().build(var_list)
        try:
            items = self._htf_plain_variables()  # restores state a checkpoint read before the build left deferred
        except keras_slots.OptimizerLayoutError:
            self._htf_plain._maybe_initialize_trackable()
            if self._htf_plain._deferred_dependencies or "_htf_pending_values" in self.__dict__:
                raise  # state waiting to be restored would be lost
            return  # trains as usual; saving raises the same error
        pending = self.__dict__.pop("_htf_pending_values", None)
        if pending is not None:  # state of the plain model's optimizer (hybridize_optimizer)
            if len(items) != len(pending):
                raise keras_slots.OptimizerLayoutError(
                    f"optimizer '{self.name}' ({type(self).__name__}) had {len(pending)} variables for the plain "
                    f"model and has {len(items)} in its layout for the optimized one: its state cannot be carried "
                    "over. Compile the optimized model with a new optimizer to start afresh on purpose."
                )
            for item, value in zip(items, pending):
                item.assign(value)

    # Checkpoints and Keras files hold the optimizer's variables in the plain
    # model's positions (keras_slots): both layouts read and write the same state.

    def _htf_plain_variables(self) -> list:
        storage = self._htf_storage
        if storage is None or self._htf_plain_order is None:
            return list(self.variables)
        items = keras_slots.plain_variables(self, storage, self._htf_plain_order)
        self._htf_plain.update(items)
        return items

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "checkpoint" and self._htf_plain_order is not None:
            self._htf_plain_variables()
            children["_variables"] = self._htf_plain
            for name, child in list(children.items()):  # slot lists (_accumulators, _momentums, ...)
                if name != "_variables" and isinstance(child, list) and any(id(v) in self._htf_slot_of for v in child):
                    del children[name]
        return children

    def save_own_variables(self, store):
        for i, variable in enumerate(self._htf_plain_variables()):
            store[str(i)] = variable.numpy()
        _mark_lazy(store, self)

    def load_own_variables(self, store):
        _check_lazy(store, self)
        items = self._htf_plain_variables()
        if len(store.keys()) != len(items) and not getattr(self, "_built", False):
            # Not built for this file (model.load_weights builds it when the file fits a build over the model's
            # trainable variables): skipped as Keras skips an unbuilt optimizer's state in the plain model.
            _log.warning(
                "hybridtf: not loading the state of optimizer '%s' (%s): the file holds %d of its variables and it "
                "is not built (it trains only some of the model's variables, e.g. in a custom train_step). It starts "
                "afresh, as it would in the plain model; to keep its state use TensorFlow checkpoints "
                "(save_weights without .h5, tf.train.Checkpoint), which restore it when it is built.",
                self.name,
                type(self).__name__,
                len(store.keys()),
            )
            return
        if len(store.keys()) != len(items):
            raise keras_slots.OptimizerLayoutError(
                f"the file holds {len(store.keys())} variables of optimizer '{self.name}' "
                f"({type(self).__name__}), which has {len(items)} in the plain model's layout"
                + (" (it is not built yet)" if not getattr(self, "_built", False) else "")
                + ": loading would leave its slots at their initial values. Load the file into a model "
                "compiled with the same optimizer class (model.load_weights builds it first), or compile "
                "after loading to start the optimizer afresh on purpose."
            )
        for i, variable in enumerate(items):
            variable.assign(store[str(i)])

    def _htf_apply(self, kind, grad, var):
        """One fused sparse update of ``var``: the plain op, or the regularized one for a packed
        table with regularized members (same slots and hyperparameters, plus the members' ranges)."""
        dtype = var.dtype
        index = self._index_dict[self._var_key(var)]
        if tf.executing_eagerly() or grad.indices.op.type in ("ConcatV2", "Concat"):
            # The tape joined several lookups' gradients (the model called twice in a step, a layer also called
            # on its own): a chain's rows are distinct, their concatenation is not; the fused ops need distinct.
            # (Eagerly the producing op is unknown: always summed.)
            unique, position = tf.unique(grad.indices)
            grad = tf.IndexedSlices(
                tf.math.unsorted_segment_sum(grad.values, position, tf.size(unique)), unique, grad.dense_shape
            )
        if kind == "sgd":
            state, op = (tf.cast(self.learning_rate, dtype),), "sgd"
        elif kind == "adagrad":
            lr, eps = tf.cast(self.learning_rate, dtype), tf.constant(self.epsilon, dtype)
            state, op = (self._accumulators[index], lr, eps), "adagrad"
        else:
            op = "adam"
            state = (
                self._momentums[index],
                self._velocities[index],
                sparse_apply.adam_alpha(self, dtype),
                tf.constant(1 - self.beta_1, dtype),
                tf.constant(1 - self.beta_2, dtype),
                tf.constant(self.epsilon, dtype),
            )
        kwargs = {"lazy": kind == "lazy_adam"} if op == "adam" else {}
        reg = self._htf_reg.get(id(var))
        if kind == "adam":  # (the rows of its unregularized tables with gradient)
            keras_end_of_data.note_fused_adam(self, var, state[0], state[1])
        if reg is None:
            return getattr(sparse_apply, f"sparse_apply_{op}")(var, *state, grad.values, grad.indices, **kwargs)
        ranges, l1, l2 = (tf.constant(x) for x in reg)
        apply = getattr(regularized_apply, f"regularized_apply_{op}")
        return apply(var, *state, grad.values, grad.indices, ranges, l1, l2, **kwargs)


# Keras 2.15's loss-scale wrapper of a tf.keras.optimizers.Optimizer (mixed_float16).
_LOSS_SCALE_CLASSES = tuple(
    cls
    for cls in (getattr(getattr(tf.keras, "mixed_precision", None), "LossScaleOptimizer", None),)
    if isinstance(cls, type)
)


def loss_scale_inner(optimizer):
    """The inner optimizer of a Keras loss-scale wrapper (mixed_float16), else None."""
    return optimizer.inner_optimizer if isinstance(optimizer, _LOSS_SCALE_CLASSES) else None


class _LossScaleDelegate:
    """Per-instance override of a loss-scale wrapper whose inner optimizer hybridtf hooked.

    Keras files write the wrapper's ``variables`` (its inner optimizer's) by position; they go
    through the inner optimizer, which writes and reads them in the plain model's layout.
    """

    def save_own_variables(self, store):
        self.inner_optimizer.save_own_variables(store)

    def load_own_variables(self, store):
        self.inner_optimizer.load_own_variables(store)

    def _htf_plain_variables(self) -> list:
        return self.inner_optimizer._htf_plain_variables()


def hybridize_optimizer(
    optimizer,
    storage,
    fused_updates: bool = True,
    plain_order: list | None = None,
    exact_clipping: bool | None = None,
) -> None:
    """Hooks ``optimizer`` (in place, this instance only) into training of ``storage``'s packed tables.

    * Fused updates (``fused_updates``): one fused op per packed table whose
      gradient has distinct rows (every packed table in one process; the
      shards in a Horovod job).
    * In a Horovod job: the shards' gradients are model-parallel (never
      allreduced; scaled by ``1 / size`` to average over the ranks' batches)
      and every other gradient is averaged with allreduce — by Horovod when
      ``optimizer`` is a ``hvd.DistributedOptimizer`` (the shards are
      registered as its local variables), else by hybridtf. The slots of the
      shards are checkpointed as whole tables.
    * Checkpoints (``plain_order``: the plain model's trained variables, a
      table's name in place of its variable): the optimizer's variables are
      saved and restored at the plain model's positions, each packed slot as
      one slot per table (``keras_slots``). An optimizer already built for
      the plain model keeps its state: it is rebuilt for the packed
      variables and its slots are copied in per table.
    * ``exact_clipping`` (``clipping_can_be_exact`` of the compiled model):
      ``clipnorm`` / ``global_clipnorm`` measure each table's per-lookup
      gradient rows (``storage.gradient_norms``; ``clipvalue`` clips them) and
      clip as Keras clips the plain model; False turns that off (they are named in the
      inexact-settings warning); None leaves it as it is (an optimizer a
      custom step uses beside the compiled one).

    Raises:
        TypeError: in a Horovod job, an optimizer that is not a
            ``tf.keras.optimizers.Optimizer`` (hybridtf could not keep the
            shards out of the allreduce).
    """
    world = storage.world
    inner = loss_scale_inner(optimizer)
    if inner is not None:
        # Mixed precision: the loss-scale wrapper unscales the gradients and skips non-finite steps,
        # then calls its inner optimizer, which holds every slot: that one gets the fused updates and
        # the plain-layout state; the wrapper's Keras files delegate to it.
        hybridize_optimizer(inner, storage, fused_updates, plain_order)
        if not isinstance(optimizer, _LossScaleDelegate):
            optimizer.__class__ = runtime_subclass(_LossScaleDelegate, type(optimizer))
        return
    if keras_legacy_slots.is_legacy(optimizer):  # slots checkpointed per table through the object graph
        keras_legacy_slots.hook_legacy_slots(optimizer, storage)
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer):
        if storage.packed:  # a legacy optimizer clips in its own apply_gradients, on the packed rows
            warn_inexact(optimizer, clip_context=_legacy_clipping_context(optimizer))
        if world.distributed and storage.sharded:
            raise TypeError(
                f"a model with tables sharded over {world.size} Horovod ranks needs a tf.keras.optimizers.Optimizer "
                f"(optionally wrapped by hvd.DistributedOptimizer), got {type(optimizer).__name__}; hybridtf must "
                "keep the shards' gradients out of the allreduce."
            )
        return
    by_value = None if (optimizer.clipnorm or optimizer.global_clipnorm) else optimizer.clipvalue
    kept = getattr(storage, "gradient_norms", None)
    if exact_clipping and (kept is None or kept.clipvalue != by_value):  # measured, or clipped by value
        object.__setattr__(storage, "gradient_norms", gradient_norms.GradientNorms(storage, by_value))
    if exact_clipping is False:
        object.__setattr__(storage, "gradient_norms", None)
    if not isinstance(optimizer, _HybridOptimizerMixin) and storage.packed:
        warn_inexact(optimizer, bool(exact_clipping), _clipping_context(world))
    pending = None
    if not isinstance(optimizer, _HybridOptimizerMixin) and getattr(optimizer, "_built", False):
        pending = _take_plain_state(optimizer)
    if not isinstance(optimizer, _HybridOptimizerMixin):
        cls = type(optimizer)
        optimizer.__class__ = (
            horovod_class_with(_HybridOptimizerMixin, cls)
            if is_horovod_class(cls)
            else runtime_subclass(_HybridOptimizerMixin, cls)
        )
    replicated = {id(v) for v in storage.replicated_variables()}
    fused = [v for v in storage.packed.values() if id(v) not in replicated] if fused_updates else []
    object.__setattr__(optimizer, "_htf_packed", {id(v) for v in fused})
    object.__setattr__(optimizer, "_htf_sharded", {id(v) for v in storage.sharded_variables()})
    object.__setattr__(optimizer, "_htf_storage", storage)
    members = {}  # packed variable -> its member tables' views (weight-decay exclusions name those)
    for pt in storage.plan.packed_tables:
        if pt.name in storage.packed:
            members[id(storage.packed[pt.name])] = [storage.view(m.name) for m in pt.members]
    object.__setattr__(optimizer, "_htf_members", members)
    if "_htf_plain" not in optimizer.__dict__:
        object.__setattr__(optimizer, "_htf_plain", keras_slots.PlainSlots())
        object.__setattr__(optimizer, "_htf_slot_of", {})
    object.__setattr__(optimizer, "_htf_plain_order", plain_order)
    keras_slots.adopt_deferred_restore(optimizer)
    reg = {}
    for name, var in storage.packed.items():
        ranges = storage.regularized_ranges(name)
        if ranges is not None:
            reg[id(var)] = ranges
    object.__setattr__(optimizer, "_htf_reg", reg)
    storage.fold_regularization = True  # the penalties' gradients come from this optimizer now
    if world.distributed and is_horovod_distributed(optimizer):
        gradients.check_horovod_reduction("hvd.DistributedOptimizer", *gradients.horovod_reduction_of(optimizer))
        for v in storage.sharded_variables():
            optimizer.register_local_var(v)
    if pending is not None:
        object.__setattr__(optimizer, "_htf_pending_values", pending)


def _take_plain_state(optimizer) -> list:
    """The values of a built plain optimizer's variables; the optimizer is reset, to be built again.

    The values are assigned by the next ``build`` (at the packed variables'
    positions, through ``keras_slots``), so the optimized model resumes
    with the plain model's optimizer state.
    """
    values = [v.numpy() for v in optimizer.variables]
    optimizer._built = False
    optimizer._variables = [optimizer.iterations]
    return values
