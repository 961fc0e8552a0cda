"""Packed embeddings for ``tf.estimator`` (TF1-style model_fns) and hybridtf's SessionRunHooks.

``model_fn(user_model_fn)`` returns a model_fn whose embedding lookups —
``tf.keras.layers.Embedding`` and ``hybridtf.layers.EmbeddingBag`` layers
created inside the model_fn, and ``hybridtf.embedding.Tables`` lookups — run
as a few packed, fused chains, with the same math and the plain model_fn's
checkpoint layout. ``hooks()`` returns the SessionRunHooks to pass to
``Estimator.train`` or ``tf.compat.v1.train.MonitoredTrainingSession``.

Example:
    >>> import hybridtf.estimator as htf_estimator
    >>> est = tf.estimator.Estimator(htf_estimator.model_fn(my_model_fn), model_dir="/tmp/model")
    >>> est.train(train_input_fn, steps=1000, hooks=htf_estimator.hooks(every_n_steps=100))
    >>> est.evaluate(eval_input_fn)
    >>> est.export_saved_model("/tmp/export", serving_input_receiver_fn)
"""

from __future__ import annotations

from hybridtf._src.integrations.estimator import model_fn
from hybridtf._src.integrations.estimator_hooks import (
    CACHE_MAINTENANCE,
    CacheMaintenanceHook,
    EstimatorReport,
    StatsHook,
    horovod_broadcast_hook,
    report_of,
)
from hybridtf._src.rewrite.micro_batch_fn import micro_batch_gradients
from hybridtf._src.run.loader import load_ops as _load_ops


def load_ops() -> None:
    """Loads hybridtf's op library, so that SavedModels exported by a wrapped Estimator load.

    Exports of a wrapped model_fn with static functional ``Tables`` lookups
    contain hybridtf's ops (other exports, dynamic tables included, are plain TensorFlow); call
    this before ``tf.saved_model.load`` in a process that has not used hybridtf yet.

    Raises:
        hybridtf.errors.OpLibraryError: the library is missing or was built for another TensorFlow.

    Example:
        >>> htf_estimator.load_ops()
        >>> predict = tf.saved_model.load(export_dir).signatures["serving_default"]
    """
    _load_ops()


def hooks(
    every_n_steps: int | None = 100,
    *,
    batch_size: int | None = None,
    cache_every_n_steps: int | None = None,
    broadcast: bool = True,
    log_fn=None,
) -> list:
    """hybridtf's SessionRunHooks for ``Estimator.train`` or ``MonitoredTrainingSession``.

    * ``StatsHook``: at the start, what was packed (lookups, packed chains,
      step op counts plain -> hybridtf) or that there was nothing to pack;
      then steps/s and examples/s every ``every_n_steps`` steps and at the end.
    * ``CacheMaintenanceHook``: runs the graph's cache maintenance ops
      (collection ``CACHE_MAINTENANCE``; the place HybridHash flushes will
      hook in) every ``cache_every_n_steps`` steps and at the end.
    * a broadcast of rank 0's variables except the rank-local shards
      (``ShardAwareBroadcastHook``), only when Horovod is imported,
      initialized and runs more than one process (and ``broadcast``).

    Args:
        every_n_steps: throughput log interval (None: only at the end).
        batch_size: examples per step, for graphs not built by ``model_fn``
            (the wrapped model_fn's graphs report their batch size themselves).
        cache_every_n_steps: cache maintenance interval (None: only at the end).
        broadcast: add Horovod's broadcast hook when running under Horovod.
        log_fn: where the statistics go (default: the ``hybridtf`` logger, INFO).

    Returns:
        A list of ``tf.compat.v1.train.SessionRunHook``.

    Raises:
        ValueError: an interval that is not a positive int or None.

    Example:
        >>> stats, cache = hooks(every_n_steps=100)[:2]
        >>> estimator.train(input_fn, steps=1000, hooks=[stats, cache])
        >>> stats.stats()["examples_per_sec"]
    """
    result = [StatsHook(every_n_steps, batch_size, log_fn), CacheMaintenanceHook(cache_every_n_steps)]
    if broadcast:
        hook = horovod_broadcast_hook()
        if hook is not None:
            result.append(hook)
    return result


__all__ = [
    "CACHE_MAINTENANCE",
    "CacheMaintenanceHook",
    "EstimatorReport",
    "StatsHook",
    "hooks",
    "load_ops",
    "micro_batch_gradients",
    "model_fn",
    "report_of",
]
