"""Registers hybridtf's Keras layers and optimizers with Keras, so that saved models holding them load.

Keras finds a saved layer or optimizer (``hybridtf>EmbeddingBag``, ``hybridtf>DynamicEmbedding``,
``hybridtf>LazyAdam``, ``hybridtf>DynamicAdam``, the example models' layers) by its registered name;
the registration is the decorator run when its module is imported. ``import hybridtf`` keeps
TensorFlow out (the planner and the NumPy ops need none), so it registers them through
``register_after_tensorflow``: at once when TensorFlow is already imported, or else right after
TensorFlow's import finishes. This module itself imports no TensorFlow until ``register`` runs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys

_MODULES = (
    "hybridtf._src.capture.layers",
    "hybridtf._src.caching.layer",
    "hybridtf._src.caching.optimizer",
    "hybridtf._src.integrations.keras_optimizers",
    "hybridtf._src.models.layers",
)


def register() -> None:
    """Imports the modules whose decorators register hybridtf's Keras objects (needs TensorFlow)."""
    for name in _MODULES:
        importlib.import_module(name)


def _register_quietly() -> None:
    try:
        register()
    except Exception as err:  # never break the user's TensorFlow import; load_model will name the class
        logging.getLogger("hybridtf").warning(
            "hybridtf could not register its Keras layers and optimizers (%s); import hybridtf.layers and "
            "hybridtf.keras before loading a saved model that holds them.",
            err,
        )


class _AfterTensorFlow(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` through the other finders and registers hybridtf's objects once it is executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one use; also keeps find_spec below from finding this finder
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_quietly()

        loader.exec_module = exec_then_register
        return spec


def register_after_tensorflow() -> None:
    """Registers hybridtf's Keras objects now if TensorFlow is imported, else once it is."""
    if "tensorflow" in sys.modules:
        _register_quietly()
    elif not any(isinstance(f, _AfterTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTensorFlow())
