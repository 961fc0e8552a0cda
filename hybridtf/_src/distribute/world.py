"""The Horovod job hybridtf runs in.

hybridtf never initializes Horovod and never imports it on its own: a model
is distributed when the user's script has imported ``horovod.tensorflow`` (or
``horovod.tensorflow.keras``) and called ``hvd.init()`` with more than one
process before ``hybridtf.keras.optimize`` (or before creating
``hybridtf.embedding.Tables``). Otherwise everything runs as one process.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any


@dataclasses.dataclass(frozen=True)
class World:
    """Rank and size of the job; ``hvd`` is ``horovod.tensorflow`` when ``size > 1``.

    Example:
        >>> World().size
        1
    """

    rank: int = 0
    size: int = 1
    hvd: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def distributed(self) -> bool:
        return self.size > 1


def current_world() -> World:
    """The current Horovod job, or a one-process world when Horovod is not imported/initialized.

    Example:
        >>> import horovod.tensorflow as hvd; hvd.init()
        >>> current_world().size == hvd.size()
        True
    """
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return World()
    try:
        if not hvd.is_initialized():
            return World()
        size, rank = int(hvd.size()), int(hvd.rank())
    except (ValueError, RuntimeError):  # e.g. Horovod shut down
        return World()
    return World(rank, size, hvd if size > 1 else None)


def mirroring_strategy():
    """The ``tf.distribute`` strategy in scope if it has several replicas or mirrors variables, else None.

    hybridtf's tables are one variable (or store) per process, updated by its own fused ops; data and
    model parallelism come from Horovod. The default strategy and ``OneDeviceStrategy`` are fine.
    """
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    return None if isinstance(strategy, tf.distribute.OneDeviceStrategy) else strategy


def strategy_fix(make: str = "Create them") -> str:
    """What to do instead of a mirroring strategy (the end of every refusal's message); ``make``: what to do
    outside ``strategy.scope()``."""
    return (
        "which hybridtf does not support: its tables are one variable per process, updated by hybridtf's fused "
        f"ops, and data/model parallelism comes from Horovod. {make} outside strategy.scope() and run one "
        "process per device with horovodrun (see docs/horovod_guide.md; OneDeviceStrategy is fine)."
    )


def refuse_mirroring_strategy(layer) -> None:
    """Raises ``ValueError`` when a hybridtf layer is built under a mirroring strategy (``mirroring_strategy``)."""
    strategy = mirroring_strategy()
    if strategy is not None:
        raise ValueError(
            f"{type(layer).__name__} {layer.name!r} is built under {type(strategy).__name__}, {strategy_fix()}"
        )
