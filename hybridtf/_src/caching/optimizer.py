"""Training DynamicEmbedding tables with a Keras optimizer.

``dynamic_optimizer(opt)`` hooks a Keras optimizer in place (this instance
only, a run-time subclass as ``hybridtf.keras.optimize`` does): the gradient
of each DynamicEmbedding's distinct-rows buffer goes to that table's fused
update with the optimizer's hyperparameters (learning rate, epsilon, betas,
Adam's bias correction from ``optimizer.iterations``) and the table's own
slots; every other gradient goes through the Keras optimizer unchanged.

Under Horovod, a table sharded by id (``distribute/dynamic_exchange.py``)
sends the buffer's gradient rows to the ids' owners first; wrapped by
``hvd.DistributedOptimizer``, the hooked optimizer registers those buffers
as Horovod local variables (scaled by ``1 / size``, never allreduced).
"""

from __future__ import annotations

import logging

import tensorflow as tf

from hybridtf._src.caching.v1_optimizer import V1DynamicOptimizerMixin
from hybridtf._src.capture import context
from hybridtf._src.capture.subclassing import runtime_subclass
from hybridtf._src.distribute import gradients
from hybridtf._src.distribute.dynamic_exchange import is_rank_local
from hybridtf._src.distribute.world import current_world
from hybridtf._src.gradient_registry import graph_owned_gradients
from hybridtf._src.integrations import keras_end_of_data
from hybridtf._src.integrations.keras_horovod_classes import (
    horovod_class_with,
    is_horovod_class,
    is_horovod_distributed,
)
from hybridtf._src.integrations.keras_optimizers import (
    LazyAdam,
    current_learning_rate,
    fusable,
    loss_scale_inner,
    user_class,
)
from hybridtf._src.once import first_time

_log = logging.getLogger("hybridtf")


def _layer_of(variable):
    return getattr(variable, "_htf_dynamic_embedding", None)


def _user_names(owner) -> list:
    """The layer names a user knows ``owner`` by: a packed store's member layers, else its own name."""
    members = getattr(owner, "layers", None)  # packed_dynamic.DynamicGroup
    if isinstance(members, (list, tuple)) and members:
        return [getattr(layer, "name", str(layer)) for layer in members]
    return [owner.name]


def update_kind(optimizer) -> str | None:
    """The table update that reproduces ``optimizer`` ("sgd", "adagrad", "adam", "lazy_adam"), or None."""
    return fusable(optimizer, skip=(_DynamicOptimizerMixin,))


class _DynamicOptimizerMixin:
    def compute_gradients(self, loss, var_list, tape=None):
        # Under a hvd.DistributedOptimizer (whose compute_gradients allreduces what this returns): the buffers
        # of tables sharded by id and the static tables' shards are Horovod local variables (their owners
        # receive every rank's rows).
        if hasattr(self, "register_local_var") and not callable(var_list):
            for v in var_list:
                if is_rank_local(v):
                    self.register_local_var(v)
        return super().compute_gradients(loss, var_list, tape)

    def build(self, var_list):
        # Distinct-rows buffers train through their tables' own slots: no Keras slots for them, so the
        # optimizer's variables (checkpointed by position) are the same packed or not.
        return super().build([v for v in var_list if _layer_of(v) is None])

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        with graph_owned_gradients():  # Keras aggregates dense gradients with a custom gradient
            return self._htf_apply_dynamic(grads_and_vars, *args, **kwargs)

    def _htf_apply_dynamic(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = _averaged_over_ranks(self, list(grads_and_vars))
        dynamic = [(g, v) for g, v in grads_and_vars if _layer_of(v) is not None]
        if not dynamic:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        kind = update_kind(self)
        if kind is None:
            tables = sorted({name for _, v in dynamic for name in _user_names(_layer_of(v))})
            raise ValueError(
                f"DynamicEmbedding tables {tables} cannot train with optimizer {self.name!r} "
                f"({user_class(self, (_DynamicOptimizerMixin,)).__name__}: {', '.join(_unsupported(self))}): their "
                "updates are fused into the HybridHash store, which implements SGD (momentum 0), Adagrad, Adam "
                "(amsgrad=False) and hybridtf.keras.LazyAdam without gradient clipping, weight decay (excluded "
                "variables or not) or EMA. Remove those settings, or use one of those optimizers."
            )
        if not tf.compat.v1.executing_eagerly_outside_functions() and not context.is_recording():
            # A TF1 graph (an Estimator model_fn) has no automatic control dependencies to order the step's
            # buffer fill before these updates: they read an empty buffer (a raw segment_ids error at run time).
            tables = sorted({name for _, v in dynamic for name in _user_names(_layer_of(v))})
            raise ValueError(
                f"DynamicEmbedding tables {tables} in a TF1 graph (an Estimator model_fn) train with a "
                "tf.compat.v1.train GradientDescentOptimizer, AdagradOptimizer or AdamOptimizer passed to "
                f"hybridtf.keras.dynamic_optimizer, not with the Keras optimizer {type(self).__name__}."
            )
        rest = [(g, v) for g, v in grads_and_vars if _layer_of(v) is None]
        current_learning_rate(self)  # this step's rate of a LearningRateSchedule, before the tables' updates
        updates = []
        with tf.name_scope("hybridtf_dynamic_update"):
            for g, v in dynamic:
                if g is not None:
                    update = _layer_of(v).apply_gradient(g, self, kind)
                    if kind == "adam":  # its decay of every stored row's moments also runs in the end-of-data step
                        keras_end_of_data.note_dynamic_adam(self, _layer_of(v).table)
                    with tf.control_dependencies([update]):
                        # The step's rows are consumed: the buffer is empty again, so a broadcast of the model's
                        # variables (Horovod's BroadcastGlobalVariablesCallback) sees one shape on every rank.
                        updates.append(v.assign(tf.zeros([0, v.shape[-1]], v.dtype), read_value=False))
                elif not context.is_recording():  # a record pass (htf.function's scratch graph) never runs
                    _note_no_gradient(_layer_of(v))
        if tf.compat.v1.executing_eagerly_outside_functions():
            # A traced step runs every stateful op (automatic control dependencies order those of one variable):
            # Keras's count of the step, a data-free op, also runs in the step that finds the end of the data,
            # as in the plain model; held back behind the tables' updates it did not (LazyAdam, Adam's bias
            # correction and learning-rate schedules then trained apart from the next epoch on).
            return super().apply_gradients(rest, *args, **kwargs) if rest else self.iterations.assign_add(1)
        with tf.control_dependencies(updates):
            if rest:
                return super().apply_gradients(rest, *args, **kwargs)
            return self.iterations.assign_add(1)


def _averaged_over_ranks(optimizer, grads_and_vars: list) -> list:
    """The step's gradients averaged over the ranks when nothing else averages them.

    A model whose only tables are dynamic ones sharded by id (or a ``Tables`` set with static tables sharded over
    the ranks, dynamic ones or not), trained on several ranks by an optimizer that is not
    a ``hvd.DistributedOptimizer``, in a step that did not average (no Horovod tape, no ``average_gradients``):
    hybridtf averages, as it does for a model with static tables (whose hook, ``_htf_storage``, averages the
    buffers too). Without it each rank trained its own dense layers, silently (found by a probe). An eager step's
    gradients cannot show whether a tape averaged them: warned once, left as they are. A traced step's show it
    (``gradients.already_averaged``; a step that trains tables only, by the shards' scaling).
    """
    if getattr(optimizer, "_htf_storage", None) is not None or is_horovod_distributed(optimizer):
        return grads_and_vars
    local = [v for g, v in grads_and_vars if g is not None and is_rank_local(v)]
    if not local:
        return grads_and_vars
    gradients.check_shards_not_reduced(grads_and_vars, set())
    if tf.executing_eagerly():
        if first_time(optimizer, "_htf_eager_unaveraged_told"):
            _log.warning(
                "hybridtf: optimizer %r trains tables sharded over the Horovod ranks in an eager step: "
                "hybridtf cannot tell whether the step averaged the dense gradients over the ranks, and leaves them "
                "as they are. Average them with htf.horovod.DistributedGradientTape(tape, model), or wrap the "
                "optimizer with hvd.DistributedOptimizer, or run the step traced (tf.function / Keras fit without "
                "run_eagerly), where hybridtf averages them.",
                optimizer.name,
            )
        return grads_and_vars
    if gradients.already_averaged(grads_and_vars, set()):
        return grads_and_vars
    return gradients.reduce_gradients(grads_and_vars, set(), current_world())


def _unsupported(optimizer) -> list[str]:
    """What keeps ``optimizer`` from training dynamic tables, for the error."""
    found = [f"{k}={v}" for k in ("clipnorm", "global_clipnorm", "clipvalue") if (v := getattr(optimizer, k, None))]
    if getattr(optimizer, "weight_decay", None):
        found.append(f"weight_decay={optimizer.weight_decay}")
    if getattr(optimizer, "use_ema", False):
        found.append("use_ema=True")
    if getattr(optimizer, "amsgrad", False):
        found.append("amsgrad=True")
    if getattr(optimizer, "_agg_helper", None) is not None:
        found.append("Horovod backward_passes_per_step > 1")
    momentum = getattr(optimizer, "momentum", 0)
    if isinstance(momentum, (int, float)) and momentum:
        found.append(f"momentum={momentum}")
    return found or ["an optimizer class without a fused table update"]


def _note_no_gradient(layer) -> None:
    """A dynamic table without a gradient in a step trains nothing: said once per table (its output under
    ``tf.stop_gradient``, or a custom loop that calls the model without ``training=True``, which looks its ids up
    read-only)."""
    if not first_time(layer, "_no_gradient_warned"):
        return
    _log.warning(
        "hybridtf: dynamic table %r got no gradient, so its rows are not trained in this step (as Keras skips a "
        "variable without gradient). If it should train: its output must reach the loss (not under tf.stop_gradient), "
        "and a training step must look its ids up in training mode: call the model (or layer) with training=True in a "
        "custom loop (Keras fit does); without it the lookup only reads rows and inserts no ids.",
        layer.name,
    )


def dynamic_optimizer(optimizer):
    """Hooks ``optimizer`` (in place) to train ``DynamicEmbedding`` tables; returns it.

    Args:
        optimizer: a ``tf.keras.optimizers`` SGD (no momentum), Adagrad, Adam
            or ``hybridtf.keras.LazyAdam`` instance (or its string name; in a
            ``LossScaleOptimizer``, whose inner optimizer is hooked), or a
            ``tf.compat.v1.train`` GradientDescentOptimizer, AdagradOptimizer or
            AdamOptimizer (Estimator model_fns; see ``caching/v1_optimizer.py``).

    Returns:
        The same optimizer object, now routing DynamicEmbedding gradients to
        the tables' fused updates.

    Raises:
        TypeError: neither a Keras nor a ``tf.compat.v1.train`` optimizer.

    Example:
        >>> model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adam(1e-3)), loss="mse")
    """
    if isinstance(optimizer, str):
        optimizer = tf.keras.optimizers.get(optimizer)
    inner = loss_scale_inner(optimizer)
    if inner is not None:  # mixed_float16: the wrapper calls its inner optimizer
        dynamic_optimizer(inner)
        return optimizer
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if not isinstance(optimizer, V1DynamicOptimizerMixin):
            optimizer.__class__ = runtime_subclass(V1DynamicOptimizerMixin, type(optimizer))
        return optimizer
    if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        raise TypeError(
            f"dynamic_optimizer cannot hook the legacy Keras optimizer {type(optimizer).__name__}: use "
            "tf.keras.optimizers.SGD, Adagrad or Adam (or hybridtf.keras.LazyAdam) instead."
        )
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer):
        raise TypeError(
            "dynamic_optimizer needs a tf.keras.optimizers.Optimizer or a tf.compat.v1.train.Optimizer, got "
            f"{type(optimizer).__name__}."
        )
    if not isinstance(optimizer, _DynamicOptimizerMixin):
        cls = type(optimizer)
        # hvd.DistributedOptimizer(opt) given first: its class cannot be subclassed (see horovod_class_with)
        optimizer.__class__ = (
            horovod_class_with(_DynamicOptimizerMixin, cls) if is_horovod_class(cls) else _hooked_class(cls)
        )
    return optimizer


def _hooked_class(cls: type) -> type:
    """The run-time subclass ``(_DynamicOptimizerMixin, cls)``, registered for Keras deserialization.

    Saved in a ``.keras`` file (or a compile config) under ``hybridtf>Dynamic<Name>``, so that loading the
    model gives back a hooked optimizer: a plain one would try to build Keras slots for the tables'
    distinct-rows buffers (shape ``[None, dim]``) and fail.
    """
    sub = runtime_subclass(_DynamicOptimizerMixin, cls, public_path=False)  # loaded by its own name, below
    from keras.src.saving import object_registration

    name = f"hybridtf>Dynamic{cls.__name__}"
    if object_registration._GLOBAL_CUSTOM_OBJECTS.get(name, sub) is sub:  # another class of that name: not ours
        object_registration._GLOBAL_CUSTOM_OBJECTS[name] = sub
        object_registration._GLOBAL_CUSTOM_NAMES[sub] = name
    return sub


def hook_for_model(model, optimizer) -> None:
    """Hooks ``optimizer`` (in place) when ``model`` trains DynamicEmbedding tables and it is not hooked yet.

    ``compile`` of an optimized model calls this, so ``dynamic_optimizer`` is optional there. Optimizers
    hybridtf cannot hook (neither Keras nor ``tf.compat.v1.train``) are left alone.
    """
    optimizer = loss_scale_inner(optimizer) or optimizer
    if isinstance(optimizer, (_DynamicOptimizerMixin, V1DynamicOptimizerMixin)):
        return
    if not isinstance(optimizer, (tf.keras.optimizers.Optimizer, tf.compat.v1.train.Optimizer)):
        return
    if any(_layer_of(v) is not None for v in model.trainable_variables):
        dynamic_optimizer(optimizer)


# The optimizers dynamic tables train with: registered at import, so a saved model loads in a new process.
for _cls in (tf.keras.optimizers.SGD, tf.keras.optimizers.Adagrad, tf.keras.optimizers.Adam, LazyAdam):
    _hooked_class(_cls)
