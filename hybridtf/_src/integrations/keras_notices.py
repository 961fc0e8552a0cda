"""What ``optimize`` and an optimized model's ``compile`` tell the user: warnings and refusals with the fix.

* ``warn_skipped``: one warning naming every embedding table left unpacked, with the reason and the fix;
* ``feature_column_layers``: ``DenseFeatures`` layers with embedding columns (named as skipped);
* ``warn_nothing_found``: a model without any embedding layer (raw-variable tables are not seen);
* ``refuse_frozen_packed_layers``: a packed layer frozen after ``optimize`` cannot be frozen alone (checked at
  ``compile`` and when the model is called under a gradient tape: a custom loop);
* ``refuse_layers_of_another_model``: ``optimize`` of a model holding layers another optimized model packed;
* ``run_without_xla``: ``jit_compile=True`` falls back to the plain steps (the packed ops have no XLA kernels);
* ``refuse_distribution_strategy``: a model built or compiled under a multi-replica ``tf.distribute`` strategy;
* ``refuse_legacy_hdf5``: legacy ``.h5`` saves and loads (also a ``ModelCheckpoint`` to one, when ``fit`` starts).
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

from hybridtf._src.capture.keras_capture import SkippedLayer, is_captured
from hybridtf._src.capture.outside_calls import SHARED_LAYERS_FIX
from hybridtf._src.distribute.world import mirroring_strategy, strategy_fix
from hybridtf._src.errors import HybridTFError

_log = logging.getLogger("hybridtf")


def warn_skipped(skipped: list[SkippedLayer], packed: int) -> None:
    """One warning naming every embedding table left unpacked, with the reason and the fix."""
    if not skipped:
        return
    lines = "\n".join(f"  - {s.name}: {s.reason}" for s in skipped)
    _log.warning(
        "hybridtf.keras.optimize packed %d embedding table(s) and left %d unpacked (each keeps its own lookup and "
        "update: plain Keras for an Embedding, its own HybridHash store for a DynamicEmbedding; "
        "model.hybridtf_skipped lists them):\n%s",
        packed,
        len(skipped),
        lines,
    )


def feature_column_layers(model) -> list[SkippedLayer]:
    """``DenseFeatures`` layers of ``model`` whose feature columns hold embedding tables (never packed)."""
    found = []
    for layer in model._flatten_layers(include_self=False):
        columns = getattr(layer, "_feature_columns", None)
        if columns is None or "DenseFeatures" not in type(layer).__name__:
            continue
        tables = [c.name for c in columns if "embedding" in type(c).__name__.lower()]
        if tables:
            found.append(
                SkippedLayer(
                    layer.name,
                    f"feature columns {tables} are looked up by the DenseFeatures layer, which hybridtf does not "
                    "pack; feed their ids to tf.keras.layers.Embedding layers instead to pack them",
                )
            )
    return found


def warn_nothing_found(model) -> None:
    """``model`` has no embedding layer hybridtf knows: say so (and why raw-variable tables are not seen)."""
    _log.warning(
        "hybridtf.keras.optimize found no embedding layer in model %r (tf.keras.layers.Embedding, "
        "hybridtf.layers.EmbeddingBag or DynamicEmbedding): nothing is packed and the model runs as written. "
        "Tables held as raw variables (add_weight + tf.nn.embedding_lookup) are not seen: create them as "
        "tf.keras.layers.Embedding layers to pack them.",
        model.name,
    )


def refuse_frozen_packed_layers(model) -> None:
    """Raises when a packed layer was frozen (``trainable=False``) after ``optimize``: it shares a variable.

    Raises:
        ValueError: naming the layers and the fix.
    """
    if not model.trainable:  # the whole model frozen: nothing trains, as in Keras
        return
    from hybridtf._src.rewrite.packed_dynamic import is_packed_member

    frozen = [
        layer.name
        for layer in model._flatten_layers(include_self=False)
        if (is_captured(layer) or is_packed_member(layer)) and not layer.trainable
    ]
    if frozen:
        raise ValueError(
            f"embedding layer(s) {frozen} were packed while trainable and frozen afterwards (trainable=False): "
            "their rows share a packed variable (or HybridHash store) with other tables, so hybridtf cannot freeze "
            "them alone. Set "
            "trainable=False before htf.keras.optimize() (a frozen table stays unpacked): build the plain model "
            "again, freeze the layers, optimize it and load the weights (model.save_weights / load_weights)."
        )


class SharedPackedLayersError(HybridTFError, ValueError):
    """``optimize`` of a model that holds embedding layers another optimized model already packed."""


def refuse_layers_of_another_model(model) -> None:
    """Raises when ``model`` holds embedding layers packed by ``optimize`` of another model.

    Packing them again would move their tables into ``model``'s variables: the other model would keep
    predicting with them but could no longer train them, and ``model``'s ``get_weights`` / ``save_weights``
    would miss them (found by a probe: both silently).

    Raises:
        SharedPackedLayersError: naming the layers and the fix.
    """
    packed = [
        layer.name
        for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "_htf_runtime", None) is not None
    ]
    if packed:
        raise SharedPackedLayersError(
            f"hybridtf.keras.optimize: model {model.name!r} holds embedding layer(s) {sorted(set(packed))} that "
            "hybridtf.keras.optimize of another model already packed (the layer objects are shared). Packing them "
            "again would leave the other model unable to train them and this one unable to save them. "
            + SHARED_LAYERS_FIX
        )


def run_without_xla(model) -> None:
    """After ``compile``: ``jit_compile=True`` is turned off with a warning (no XLA kernels for hybridtf's ops)."""
    if not model.jit_compile:
        return
    _log.warning(
        "hybridtf: model %r was compiled with jit_compile=True, but its packed embedding ops (custom TensorFlow "
        "kernels) cannot be compiled by XLA; its train/test/predict steps run without XLA (same math). Pass "
        "jit_compile=False to silence this.",
        model.name,
    )
    model.jit_compile = False


def refuse_world_change(model) -> None:
    """Raises when ``model`` was optimized in one process (before ``hvd.init()``) and trains in a Horovod job.

    Its packed tables were laid out for one process: not sharded over the ranks, and no rank averages
    their gradients, so each rank would train its own copy (or, with ``hvd.DistributedOptimizer``,
    fail in the fused update on the rows Horovod gathered from every rank).
    """
    from hybridtf._src.distribute.world import current_world

    world, built = current_world(), model._htf_runtime.storage.world
    if world.distributed and not built.distributed:
        raise ValueError(
            f"hybridtf.keras.optimize ran on model {model.name!r} before hvd.init(): its packed tables are laid out "
            f"for one process, not for the {world.size} Horovod ranks, so each rank would train its own copy. Call "
            "hvd.init() before building and optimizing the model; to continue a one-process model, save_weights "
            "there and load them into the model optimized after hvd.init()."
        )


def refuse_distribution_strategy(model, when: str) -> None:
    """Raises when ``model`` is optimized or compiled under a ``tf.distribute`` strategy that mirrors variables.

    Packed tables are one variable per process, updated by hybridtf's own fused ops, and the model-parallel
    exchange is Horovod's: a ``MirroredStrategy`` (or multi-worker / parameter-server / TPU strategy) would
    mirror the packed variables and replicate the step, which hybridtf does not implement. The default
    strategy and ``OneDeviceStrategy`` (one replica, plain variables) are fine.

    Raises:
        ValueError: naming the strategy and the fix.
    """
    strategy = mirroring_strategy()
    mirrored = [v.name for v in model.weights if isinstance(v, tf.distribute.DistributedValues)]
    if strategy is None and not mirrored:
        return
    what = type(strategy).__name__ if strategy is not None else "a tf.distribute strategy"
    raise ValueError(
        f"hybridtf.keras.optimize: model {model.name!r} is {when} under {what}"
        + (f" (its variables {mirrored[:3]} are distributed variables)" if mirrored else "")
        + ", "
        + strategy_fix("Build, optimize and compile the model")
    )


def refuse_legacy_hdf5(filepath, save_format) -> None:
    """Legacy HDF5 (``.h5``) reads each layer's ``tf.Variable`` list, where packed tables are not.

    Keras would write a file without the tables (and load one leaving them
    untouched), so it is refused; every other format keeps the plain layout.
    """
    if isinstance(filepath, (str, os.PathLike)):
        path = os.fspath(filepath)
        if path.endswith((".keras", ".weights.h5")):
            return
        legacy = path.endswith((".h5", ".hdf5"))
    else:
        legacy = True  # an open h5py.File
    if legacy or str(save_format).lower() in ("h5", "hdf5"):
        raise NotImplementedError(
            "an optimized model cannot use the legacy HDF5 format ('.h5'): it reads each layer's tf.Variable "
            "list, and hybridtf's packed tables are not in it. Use the TensorFlow format "
            "(model.save_weights('ckpt'), model.save('dir'), tf.train.Checkpoint) or the Keras v3 format "
            "('model.keras', 'model.weights.h5'); all keep the plain model's per-table layout."
        )
