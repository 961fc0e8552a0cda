"""Fuzz cases of Dice and DiceGrad (kernels/dice): valid inputs and bad shapes / epsilons. See cases.py.

NumPy only: the parent process of a fuzz run regenerates cases from it.
"""

from __future__ import annotations

import numpy as np

from tests.fuzz.cases import _float_dtype, _pick

CLASSES = ("valid", "bad_attrs", "empty", "mismatched")


def _statistics(x):
    flat = x.astype(np.float64).reshape(-1, x.shape[-1])
    mean = flat.mean(0)
    return mean.astype(x.dtype), ((flat - mean) ** 2).mean(0).astype(x.dtype)


def gen_dice(grad: bool):
    """Case generator of Dice (``grad`` False) or DiceGrad (True)."""

    def gen(rng, cls):
        dtype = _float_dtype(rng)
        units = int(rng.integers(1, 20))
        rows = int(rng.integers(1, 600))
        shape = (rows, units) if rng.integers(2) else (rows, int(rng.integers(1, 4)), units)
        x = (rng.standard_normal(shape) * _pick(rng, (0.5, 1.0, 10.0)) + _pick(rng, (0.0, 1.0, -3.0))).astype(dtype)
        alpha = rng.standard_normal(units).astype(dtype)
        epsilon = float(_pick(rng, (1e-9, 1e-3, 0.5)))
        valid = True
        if cls == "bad_attrs":
            epsilon, valid = float(_pick(rng, (-1.0, -1e-9, np.inf, np.nan))), False
        elif cls == "empty":
            x, valid = np.zeros((0, units) if rng.integers(2) else (3, 0, units), dtype), False
        elif cls == "mismatched":
            valid = False
            choice = int(rng.integers(3 if not grad else 5))
            if choice == 0:
                alpha = np.concatenate([alpha, alpha[:1]])  # one value too many
            elif choice == 1:
                x = x.reshape(-1)  # rank 1
            elif choice == 2:
                alpha = alpha.reshape(1, -1)  # not a vector
        mean, variance = _statistics(x) if x.size and x.ndim >= 2 else (alpha[:0], alpha[:0])
        inputs = dict(x=x, alpha=alpha, epsilon=epsilon)
        if grad:
            dy = rng.standard_normal(x.shape).astype(dtype)
            dmean = rng.standard_normal(mean.shape).astype(dtype)
            dvariance = rng.standard_normal(variance.shape).astype(dtype)
            if cls == "mismatched" and choice == 3:
                dy = dy.reshape(-1)[: max(dy.size - 1, 0)]  # not x's shape
            elif cls == "mismatched" and choice == 4:
                variance = variance[:-1]  # one value short
            inputs.update(dy=dy, dmean=dmean, dvariance=dvariance, mean=mean, variance=variance)
        return inputs, valid

    return gen
