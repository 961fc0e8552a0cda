"""hybridtf: packed, fused, hybrid-parallel embedding training for TensorFlow.

Public modules (imported on first use, so that e.g. the TF-free planner does
not pull in TensorFlow):
    hybridtf.ops:    fused TensorFlow ops (``unique_partition``, ``stitch_combine``).
    hybridtf.native: the same algorithms on NumPy arrays (pybind11), no graph.
    hybridtf.keras:  ``optimize`` a Keras model to train with packed embeddings.
    hybridtf.layers: Keras layers (``EmbeddingBag``: multi-hot ids, sum/mean/sqrtn).
    hybridtf.embedding: functional tables and lookups (``Tables``, ``TableConfig``, ``lookup``).
    hybridtf.function: ``tf.function`` for custom loops, every lookup of a step packed.
    hybridtf.micro_batch_gradients: a custom step's gradients over N micro-batches (D-interleaving).
    hybridtf.horovod: hybrid parallel training under ``horovodrun`` (shards, local variables).
    hybridtf.estimator: wrap a tf.estimator model_fn (packed lookups, plain checkpoints) and SessionRunHooks.
    hybridtf.data:   tensorflow-io Parquet input (dense, one-hot, multi-hot), text-to-Parquet converters.
    hybridtf.models: example CTR models (Wide & Deep, DeepFM, DLRM, DIN) and synthetic data to try them on.

hybridtf's Keras layers and optimizers are registered with Keras as soon as TensorFlow is imported
(before or after hybridtf), so saved models holding them load after ``import hybridtf``.
"""

import importlib

__version__ = "0.2.0"
"""The package version; pyproject.toml reads it from here (the one place it is written)."""
_SUBMODULES = (
    "data",
    "embedding",
    "errors",
    "estimator",
    "horovod",
    "keras",
    "layers",
    "models",
    "native",
    "ops",
    "plan",
    "report",
)
__all__ = [
    "__version__",
    "data",
    "embedding",
    "errors",
    "estimator",
    "function",
    "horovod",
    "keras",
    "layers",
    "micro_batch_gradients",
    "models",
    "native",
    "ops",
    "plan",
    "report",
]


def __getattr__(name):
    if name in _SUBMODULES:
        module = importlib.import_module(f"hybridtf.{name}")
        globals()[name] = module
        return module
    if name == "function":
        from hybridtf._src.integrations.function import function

        globals()[name] = function
        return function
    if name == "micro_batch_gradients":
        from hybridtf._src.rewrite.micro_batch_fn import micro_batch_gradients

        globals()[name] = micro_batch_gradients
        return micro_batch_gradients
    raise AttributeError(f"module 'hybridtf' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES) | {"function", "micro_batch_gradients"})


def _register_keras_objects():
    from hybridtf._src.keras_objects import register_after_tensorflow

    register_after_tensorflow()


_register_keras_objects()  # saved models holding hybridtf's layers and optimizers load after `import hybridtf`
