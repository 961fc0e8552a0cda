"""HybridHash statistics in the Keras logs.

``HybridHashMetrics`` (a Keras callback) adds, for every DynamicEmbedding
layer of the model, after each training batch and epoch:
``<layer>/hit_ratio`` (distinct ids of the last step served by the hot tier),
``<layer>/hit_ratio_cumulative``, ``<layer>/size``, ``<layer>/inserts`` and
``<layer>/evictions``. The hit ratio is 0 during warm-up (nothing is hot yet).
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.caching.layer import DynamicEmbedding


def dynamic_layers(model) -> list:
    """The DynamicEmbedding layers of ``model`` (nested models included)."""
    found = []
    for layer in model.submodules if hasattr(model, "submodules") else ():
        if isinstance(layer, DynamicEmbedding) and layer.built:
            found.append(layer)
    return found


def table_logs(layer) -> dict:
    """The log entries of one DynamicEmbedding layer (eager)."""
    s = layer.stats()
    name = layer.name
    return {
        f"{name}/hit_ratio": s["last_step_hits"] / max(s["last_step_lookups"], 1),
        f"{name}/hit_ratio_cumulative": s["hits"] / max(s["lookups"], 1),
        f"{name}/size": s["size"],
        f"{name}/inserts": s["inserts"],
        f"{name}/evictions": s["evictions"],
    }


class HybridHashMetrics(tf.keras.callbacks.Callback):
    """Puts each DynamicEmbedding table's hit ratio, size, inserts and evictions in the Keras logs.

    Put it first in ``callbacks`` so that later callbacks (History, loggers)
    see the entries.

    Args:
        every_batch: also add them to the batch logs (else only epoch logs).

    Example:
        >>> history = model.fit(ds, callbacks=[htf.keras.HybridHashMetrics()])
        >>> history.history["user/hit_ratio"]
    """

    def __init__(self, every_batch: bool = True):
        super().__init__()
        self.every_batch = every_batch

    def _add(self, logs):
        if logs is None:
            return
        for layer in dynamic_layers(self.model):
            logs.update(table_logs(layer))

    def on_train_batch_end(self, batch, logs=None):
        if self.every_batch:
            self._add(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._add(logs)
