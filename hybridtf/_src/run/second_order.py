"""Second-order gradients through hybridtf's fused gradient ops: refused by name, never silently zero.

The gradient ops of the fused kernels (StitchCombineGrad, StitchConcatGrad,
StitchConcatMatMulGrad, StitchFMGrad, DiceGrad) have no gradient of their own.
Registering none (``tf.no_gradient``) would make TensorFlow treat it as zero,
so a step that differentiates a gradient (a gradient penalty through a nested
``GradientTape``) would train something else without a word. Instead each one
gets a gradient function that raises ``SecondOrderGradientError`` naming the
op and the fix when a second-order gradient reaches it.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.errors import HybridTFError


class SecondOrderGradientError(HybridTFError, NotImplementedError):
    """A gradient of a gradient would pass through a fused op's gradient, which has none."""


def refuse_second_order(op_name: str, fix: str) -> None:
    """Registers a gradient for ``op_name`` (a fused op's gradient op) that raises with ``fix``."""

    def _refuse(op, *grads):
        raise SecondOrderGradientError(
            f"hybridtf: a second-order gradient (the gradient of a gradient, e.g. a gradient penalty computed "
            f"with a nested GradientTape) passes through {op_name}, the gradient of a fused op, which has no "
            f"gradient of its own. {fix}"
        )

    tf.RegisterGradient(op_name)(_refuse)


FUSION_FIX = (
    "Turn the dataflow fusions off for such a model: hybridtf.keras.optimize(model, fuse_concat=False) "
    "(then no fused concatenation, first layer, sum, FM or Dice op is built)."
)
TABLE_FIX = (
    "Leave the tables whose rows are differentiated twice unpacked: hybridtf.keras.optimize(model, "
    "exclude=[...table names...])."
)
