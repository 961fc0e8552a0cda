"""Training HybridHash tables with ``tf.compat.v1.train`` optimizers (Estimator model_fns, TF1 graphs).

``hybridtf.keras.dynamic_optimizer`` hooks a TF1 optimizer instance the same
way it hooks a Keras one (a run-time subclass of this instance only): in
``apply_gradients`` the gradient of each dynamic table's distinct-rows
buffer (a ``DynamicEmbedding`` layer or a ``hybridtf.embedding.Tables``
dynamic table) goes to the table's fused update with the optimizer's own
hyperparameters; every other gradient goes through the TF1 optimizer
unchanged.

Which update reproduces which optimizer (same math as TF1's sparse updates):

* ``GradientDescentOptimizer``: ``sgd``.
* ``AdagradOptimizer``: ``adagrad`` with epsilon 0 (TF1 Adagrad divides by
  ``sqrt(accum)``) and the optimizer's ``initial_accumulator_value``.
* ``AdamOptimizer``: ``adam`` (every stored row's moments decay each step, as
  TF1's sparse Adam does to the whole variable), with the bias correction
  from the optimizer's own ``beta1_power`` / ``beta2_power`` read before its
  ``_finish`` advances them.

Under Horovod, a ``DynamicEmbedding`` table sharded by id sends the
gradient rows to the ids' owners first (``distribute/dynamic_exchange.py``);
its buffer is a Horovod local variable (``hybridtf.horovod.DistributedOptimizer``
scales it by ``1 / size`` instead of allreducing it).

The table updates run inside the optimizer's ``apply_gradients`` (before
``_finish``), so ``global_step`` advances after them, as for any variable.
Adam's data-free decay of every row's moments, which the plain model_fn
also runs in the step that finds the end of the input, is applied by
``integrations/estimator_end_of_data.py``.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.caching import fills
from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.integrations import estimator_end_of_data

_V1 = tf.compat.v1.train


def owner_of(variable):
    """The dynamic table (layer or ``Tables`` entry) whose distinct-rows buffer ``variable`` is, or None."""
    return getattr(variable, "_htf_dynamic_embedding", None)


def v1_update_kind(optimizer) -> str | None:
    """The table update that reproduces a TF1 ``optimizer`` ("sgd", "adagrad", "adam"), or None."""
    base = next(c for c in type(optimizer).__mro__ if not issubclass(c, V1DynamicOptimizerMixin))
    if base is _V1.GradientDescentOptimizer:
        return "sgd"
    if base is _V1.AdagradOptimizer:
        return "adagrad"
    if base is _V1.AdamOptimizer:
        return "adam"
    return None


def _hyper(optimizer, value):
    value = optimizer._call_if_callable(value)
    return tf.cast(tf.convert_to_tensor(value), tf.float32)


def v1_table_update(optimizer, kind: str, owner, grad):
    """The fused update of ``owner``'s table for its buffer's gradient ``grad``, with ``optimizer``'s settings."""
    # TF1 graphs have no automatic control dependencies: read the step's ids after its gradient exists (the
    # gradient depends on the lookup, which writes the ids buffer first).
    with tf.control_dependencies([grad.values if isinstance(grad, tf.IndexedSlices) else grad]):
        ids = owner._ids_buffer.read_value()
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.math.unsorted_segment_sum(grad.values, grad.indices, tf.shape(ids)[0])
    grad = tf.cast(grad, tf.float32)
    if fills.repeated(owner):  # filled by several lookups (micro-batches, shared layer): one row per id
        ids, grad, _, _ = fills.distinct(ids, grad)
    fills.close(owner)
    table = owner.table
    world = getattr(table, "world", None)
    if world is not None and world.distributed:  # sharded by id: the owners sum every rank's rows
        with tf.control_dependencies([grad]):
            received = owner._received_ids.read_value()
        ids, grad = dynamic_exchange.owner_gradients(ids, grad, received, world, owner._exchange_name)
    if kind == "sgd":
        return table.apply_sgd(ids, grad, _hyper(optimizer, optimizer._learning_rate))
    if kind == "adagrad":
        return table.apply_adagrad(
            ids,
            grad,
            _hyper(optimizer, optimizer._learning_rate),
            tf.constant(0.0, tf.float32),
            initial_accumulator_value=float(optimizer._initial_accumulator_value),
        )
    beta1 = _hyper(optimizer, optimizer._beta1)
    beta2 = _hyper(optimizer, optimizer._beta2)
    beta1_power, beta2_power = (tf.cast(p, tf.float32) for p in optimizer._get_beta_accumulators())
    alpha = _hyper(optimizer, optimizer._lr) * tf.sqrt(1.0 - beta2_power) / (1.0 - beta1_power)
    estimator_end_of_data.note_adam(table, 1.0 - beta1, 1.0 - beta2)  # run only if the input ends in a step
    return table.apply_adam(ids, grad, alpha, 1.0 - beta1, 1.0 - beta2, _hyper(optimizer, optimizer._epsilon))


class V1DynamicOptimizerMixin:
    """Routes dynamic-table buffer gradients of a TF1 optimizer to the tables' fused updates."""

    _htf_pending = None

    def _htf_updates(self, dynamic, kind):
        with tf.name_scope("hybridtf_dynamic_update"):
            return [v1_table_update(self, kind, owner_of(v), g) for g, v in dynamic]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = tuple(grads_and_vars)
        dynamic = [(g, v) for g, v in grads_and_vars if g is not None and owner_of(v) is not None]
        if not dynamic:
            return super().apply_gradients(grads_and_vars, global_step, name)
        kind = v1_update_kind(self)
        if kind is None:
            raise ValueError(
                "dynamic embedding tables train with tf.compat.v1.train GradientDescentOptimizer, AdagradOptimizer "
                f"or AdamOptimizer; got {type(self).__name__}. "
                "Use one of those optimizers."
            )
        rest = [(g, v) for g, v in grads_and_vars if owner_of(v) is None]
        if any(g is not None for g, _ in rest):
            # The TF1 optimizer prepares its hyperparameters and slots; _finish below adds the table updates.
            self._htf_pending = (dynamic, kind)
            try:
                return super().apply_gradients(rest, global_step, name)
            finally:
                self._htf_pending = None
        # Only dynamic tables: what apply_gradients would do around them.
        with tf.name_scope(name or self.get_name()):
            if kind == "adam":
                first = min((v for _, v in dynamic), key=lambda v: v.name)
                with tf.init_scope():
                    self._create_non_slot_variable(initial_value=self._beta1, name="beta1_power", colocate_with=first)
                    self._create_non_slot_variable(initial_value=self._beta2, name="beta2_power", colocate_with=first)
            self._prepare()
            finish = self._finish(self._htf_updates(dynamic, kind), "update")
            if global_step is None:
                return finish
            with tf.control_dependencies([finish]):
                return global_step.assign_add(1)

    def _finish(self, update_ops, name_scope):
        pending, self._htf_pending = self._htf_pending, None
        if pending is not None:
            update_ops = list(update_ops) + self._htf_updates(*pending)
        return super()._finish(update_ops, name_scope)
