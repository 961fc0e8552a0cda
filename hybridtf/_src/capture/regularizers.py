"""Which embeddings regularizers hybridtf reproduces exactly, and their factors.

Keras adds a regularized table's penalty to ``model.losses`` and, through it,
a *dense* gradient over the whole table to the batch rows' gradient. hybridtf
keeps the penalty's value (the layer's regularizer evaluated on the table's
rows) and folds the gradient into the fused optimizer update of the packed
table. That needs the gradient's formula, so only regularizers of known math
are accepted: the ``L1``, ``L2`` and ``L1L2`` classes of ``tf.keras.regularizers``
(what ``l1``, ``l2``, ``l1_l2`` and the strings ``"l1"``, ``"l2"``,
``"l1_l2"`` give; DeepCTR uses these) and of the legacy
``tensorflow.python.keras.regularizers``, by exact class (a subclass may
change ``__call__``). Their gradients are ``l1 * sign(w)`` and
``2 * l2 * w``.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

try:  # TensorFlow's legacy copy of Keras (still shipped with TF 2.15)
    from tensorflow.python.keras import regularizers as legacy_regularizers
except ImportError:  # pragma: no cover - TensorFlow without it
    legacy_regularizers = None


@dataclasses.dataclass(frozen=True)
class RegularizerSpec:
    """The factors of an L1/L2 penalty whose gradient Keras adds densely to the table."""

    l1: float
    l2: float


def _classes(name):
    found = [getattr(tf.keras.regularizers, name)]
    if legacy_regularizers is not None and hasattr(legacy_regularizers, name):
        found.append(getattr(legacy_regularizers, name))
    return tuple(found)


def regularizer_spec(regularizer) -> tuple[RegularizerSpec | None, str | None]:
    """``(spec, None)`` for a reproducible regularizer, ``(None, reason)`` otherwise.

    ``spec`` is None with no reason when the penalty does not depend on the
    table (``L1L2(0, 0)`` returns a constant 0: no gradient, as in Keras).
    """
    if regularizer is None:
        return None, None
    cls = type(regularizer)
    if cls in _classes("L1"):
        return RegularizerSpec(float(regularizer.l1), 0.0), None
    if cls in _classes("L2"):
        return RegularizerSpec(0.0, float(regularizer.l2)), None
    if cls in _classes("L1L2"):
        l1, l2 = float(regularizer.l1), float(regularizer.l2)
        if not l1 and not l2:  # Keras's L1L2 adds neither term: a constant, no gradient
            return None, None
        return RegularizerSpec(l1, l2), None
    return None, (
        f"embeddings_regularizer {cls.__module__}.{cls.__qualname__} has no gradient formula hybridtf can fold "
        "into the packed update; use tf.keras.regularizers.l1 / l2 / l1_l2 (packed, same math) or keep it "
        "(the table stays unpacked)"
    )


def _penalty_variable(loss):
    """The variable a Keras weight-regularization loss is bound to (``add_loss`` wraps it in a partial)."""
    for _ in range(2):
        args = getattr(loss, "args", ())
        if not args:
            return None
        if isinstance(args[0], tf.Variable):
            return args[0]
        loss = args[0]
    return None


def find_penalty(layer, variable) -> int | None:
    """Index in ``layer._callable_losses`` of the regularization loss Keras's ``add_weight`` made for ``variable``."""
    for i, loss in enumerate(getattr(layer, "_callable_losses", ())):
        if _penalty_variable(loss) is variable:
            return i
    return None
