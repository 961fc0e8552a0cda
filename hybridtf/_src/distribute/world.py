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
