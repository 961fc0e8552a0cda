"""Every rank of a Horovod job must optimize the same model with the same settings.

The packing plan decides which collectives each training step runs (which tables are sharded, how their
rows are spread, which ones are replicated), so ranks that planned differently exchange rows that do not
match: an id outside the table's rows on one rank, or a step where every rank waits in a different
collective. ``check_same_settings`` compares a digest of each setting over the ranks (one allgather when
``optimize`` runs) and names the ones that differ.
"""

from __future__ import annotations

import hashlib

import numpy as np
import tensorflow as tf

from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import World


def digest(value) -> int:
    """A stable int64 digest of ``repr(value)`` (the same in every process)."""
    return int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:8], "little", signed=True)


def check_same_settings(world: World, settings: dict, what: str) -> None:
    """Raises ValueError naming the settings whose values differ between the ranks (``world`` distributed).

    Args:
        world: the job.
        settings: setting name -> value (compared by ``repr``), in the same order on every rank.
        what: the model or model_fn, for the message.
    """
    if not world.distributed or not settings:
        return
    names = list(settings)
    local = tf.constant([[digest(name) for name in names] + [digest(settings[n]) for n in names]], tf.int64)
    with watchdog.collective_phase(world, watchdog.INITIAL_BROADCAST, f"{what}: the ranks' optimize settings"):
        gathered = np.asarray(world.hvd.allgather(local, name="hybridtf_optimize_settings"))
    if gathered.shape[1] != local.shape[1] or (gathered[:, : len(names)] != gathered[0, : len(names)]).any():
        raise ValueError(
            f"{what}: the Horovod ranks optimize different sets of settings; build and optimize the same model with "
            "the same hybridtf.keras.optimize arguments on every rank."
        )
    values = gathered[:, len(names) :]
    differ = [name for k, name in enumerate(names) if (values[:, k] != values[0, k]).any()]
    if differ:
        raise ValueError(
            f"{what}: the Horovod ranks differ in {', '.join(differ)} (this rank, {world.rank}: "
            + "; ".join(_shown(name, settings[name]) for name in differ)
            + "; each rank reports its own). Every rank must build the same model and call hybridtf.keras.optimize "
            "with the same arguments: the packing decides which rows each rank holds and exchanges."
        )


def _shown(name: str, value, limit: int = 1200) -> str:
    """``name=value`` for a message, cut (marked) past ``limit`` characters."""
    text = f"{name}={value!r}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
