"""A dynamic table's distinct-rows buffer refuses optimizers that were not hooked for dynamic tables.

Each dynamic table (a ``DynamicEmbedding`` layer, a ``Tables`` dynamic table, a packed group of
an optimized model) reads a step's distinct rows into a trainable ``[None, dim]`` buffer variable,
and a hooked optimizer (``hybridtf.keras.dynamic_optimizer``) routes that buffer's gradient to the
table's fused update. An optimizer that is not hooked would treat the buffer as an ordinary
variable: Keras's optimizers fail building slots of shape ``[None, dim]`` with an error that names
neither the table nor the fix, and a slot-less one (``tf.keras.optimizers.legacy.SGD``) silently
updates the buffer, which the next lookup overwrites, so the table never trains.

``guard(buffer, owner_name)`` gives the buffer a run-time subclass whose ``constraint`` and
``_distributed_container`` (read by every Keras, legacy Keras and ``tf.compat.v1.train``
optimizer on each variable it builds slots for or updates) first look for the optimizer in the
calling frames: one that is not hooked raises a ``ValueError`` naming the table and the fix.
Every other reader gets the plain variable's behaviour. Only Python attribute reads at trace time
are affected; the variable's graph ops are unchanged.
"""

from __future__ import annotations

import sys

import tensorflow as tf

from hybridtf._src.capture.subclassing import runtime_subclass

_FRAMES = 8  # how far up the caller chain the optimizer is looked for (Keras: 1-3 frames)


def _optimizer_classes() -> tuple:
    return (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer, tf.compat.v1.train.Optimizer)


def _hooked_classes() -> tuple:
    from hybridtf._src.caching.optimizer import _DynamicOptimizerMixin
    from hybridtf._src.caching.v1_optimizer import V1DynamicOptimizerMixin

    return (_DynamicOptimizerMixin, V1DynamicOptimizerMixin)


def _calling_optimizer():
    """The nearest optimizer among the callers' ``self`` / ``optimizer`` locals, or None."""
    optimizers = _optimizer_classes()
    frame = sys._getframe(2)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        local = frame.f_locals
        for key in ("self", "optimizer"):
            candidate = local.get(key)
            if isinstance(candidate, optimizers):
                return candidate
        frame = frame.f_back
    return None


class _GuardedBuffer:
    """Mixin of a distinct-rows buffer's run-time class (see the module docstring)."""

    def _htf_check_optimizer(self):
        optimizer = _calling_optimizer()
        if optimizer is None or isinstance(optimizer, _hooked_classes()):
            return
        if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
            raise ValueError(
                f"dynamic table {self._htf_owner_name!r} is trained by the legacy Keras optimizer "
                f"{type(optimizer).__name__}, which cannot update dynamic tables: it would update the step's "
                "distinct-rows buffer instead of the table. Use tf.keras.optimizers.SGD, Adagrad or Adam (or "
                "hybridtf.keras.LazyAdam) through hybridtf.keras.dynamic_optimizer(optimizer)."
            )
        raise ValueError(
            f"dynamic table {self._htf_owner_name!r} is trained by optimizer {type(optimizer).__name__}, which "
            "is not hooked for dynamic tables: it would update the step's distinct-rows buffer instead of the "
            "table. Pass the optimizer through hybridtf.keras.dynamic_optimizer(optimizer) (Keras compile, custom "
            "loops and Estimator model_fns), or compile a model made by hybridtf.keras.optimize, whose compile "
            "hooks it."
        )

    @property
    def constraint(self):
        self._htf_check_optimizer()
        return super().constraint

    @property
    def _distributed_container(self):
        self._htf_check_optimizer()
        raise AttributeError("_distributed_container")  # a plain variable has none


def guard(buffer: tf.Variable, owner_name: str) -> tf.Variable:
    """Gives ``buffer`` (a dynamic table's distinct-rows variable) the optimizer check; returns it."""
    buffer.__class__ = runtime_subclass(_GuardedBuffer, type(buffer))
    buffer._htf_owner_name = owner_name
    return buffer
