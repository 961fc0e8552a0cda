"""Keeps Horovod's ``broadcast_variables`` off the rank-local shards of packed tables.

Horovod's recipes broadcast rank 0's variables to every rank: in TF2
``hvd.broadcast_variables(model.variables, root_rank=0)`` after the first
step, in TF1 ``hvd.BroadcastGlobalVariablesHook(0)`` /
``hvd.broadcast_global_variables(0)`` (which call ``broadcast_variables``).
A shard of a packed table holds this rank's rows, other rows than rank 0's
shard of the same shape: broadcast, every rank would train with rank 0's rows
in place of its own, silently. Once a job has sharded tables (a
``PackedStorage`` registers itself), ``horovod.tensorflow.broadcast_variables``
is wrapped once to leave such variables out (the shards, their registered
optimizer slots, and in a TF1 graph the collection of shards) and to log that it
did, once. Everything else is broadcast as Horovod does it.
"""

from __future__ import annotations

import functools
import logging
import weakref

_log = logging.getLogger("hybridtf")
_STORAGES: weakref.WeakSet = weakref.WeakSet()
_noted = False


def register(storage) -> None:
    """Leaves ``storage``'s rank-local variables out of every later ``hvd.broadcast_variables``."""
    _STORAGES.add(storage)
    hvd = getattr(storage.world, "hvd", None)
    if hvd is not None and not getattr(hvd.broadcast_variables, "_htf_skips_shards", False):
        hvd.broadcast_variables = _skipping_shards(hvd.broadcast_variables)


def _local_refs() -> set:
    refs = {v.ref() for storage in list(_STORAGES) for v in storage.local_variables()}
    import tensorflow as tf

    if not tf.executing_eagerly():  # a TF1 graph (Estimator): its shards and their slots
        from hybridtf._src.integrations.horovod_hooks import graph_local_variables

        refs |= {v.ref() for v in graph_local_variables()}
    return refs


def _skipping_shards(broadcast_variables):
    @functools.wraps(broadcast_variables)
    def wrapper(variables, root_rank, *args, **kwargs):
        global _noted
        variables = list(variables)
        local = _local_refs()
        kept = [v for v in variables if not hasattr(v, "ref") or v.ref() not in local]
        if len(kept) < len(variables) and not _noted:
            _noted = True
            _log.warning(
                "hybridtf: hvd.broadcast_variables leaves out %d rank-local variables (this rank's shards of "
                "packed tables and their optimizer slots): each rank holds other rows of those tables. The rest "
                "is broadcast from rank %s.",
                len(variables) - len(kept),
                root_rank,
            )
        return broadcast_variables(kept, root_rank, *args, **kwargs)

    wrapper._htf_skips_shards = True
    return wrapper
