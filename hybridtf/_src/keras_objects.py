"""Registers hybridtf's Keras layers and optimizers with Keras, so that saved models holding them load.

Keras finds a saved layer or optimizer (``hybridtf>EmbeddingBag``, ``hybridtf>DynamicEmbedding``,
``hybridtf>LazyAdam``, ``hybridtf>DynamicAdam``, the example models' layers) by its registered name;
the registration is the decorator run when its module is imported. ``import hybridtf`` keeps
TensorFlow out (the planner and the NumPy ops need none), so it registers them through
``register_after_tensorflow``: at once when TensorFlow is already imported, or else right after
the import of TensorFlow (or of the stand-alone ``keras`` package) finishes. Then it also loads the
op library, so that a SavedModel holding hybridtf's ops (a ``Tables`` set's dynamic tables) loads
after ``import hybridtf``. This module itself imports no TensorFlow until ``register`` runs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
import threading

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
    try:  # a SavedModel holding hybridtf's ops (a Tables set's HybridHash store) then loads after `import hybridtf`
        from hybridtf._src.run.loader import load_ops

        load_ops()
    except Exception as err:  # an unbuilt library is reported where an op is first used
        logging.getLogger("hybridtf").debug("hybridtf's op library not loaded at TensorFlow's import: %s", err)


# The imports after which Keras can be used: TensorFlow's, and the stand-alone ``keras`` package's (which
# imports TensorFlow while it is itself half initialized). hybridtf's own modules are watched too: one that
# imports TensorFlow at its top (``htf.ops`` as the first use) is half initialized when TensorFlow's import
# ends, and the registration imports modules that import from it.
_WATCHED = ("tensorflow", "keras")


def _watched(fullname: str) -> bool:
    return fullname in _WATCHED or fullname.startswith("hybridtf.")


class _AfterTensorFlow(importlib.abc.MetaPathFinder):
    """Registers hybridtf's objects once the outermost import of TensorFlow, ``keras`` or a hybridtf module that
    imports TensorFlow has finished.

    It finds those modules through the other finders and wraps their loaders' ``exec_module``; the
    registration runs when no watched module is executing any more (``import keras`` executes
    TensorFlow inside it: registering in between would touch a half-initialized ``keras`` and break
    ``tf.keras``). A spec found but never executed (``importlib.util.find_spec("tensorflow")``, an
    availability check) leaves the finder in place; so does a failed import.
    """

    def __init__(self):
        self._finding = threading.local()
        self._lock = threading.Lock()
        self._executing = 0

    def find_spec(self, fullname, path, target=None):
        if not _watched(fullname) or getattr(self._finding, "active", False):
            return None
        self._finding.active = True  # the lookup below goes through sys.meta_path, this finder included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.active = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module):
            with self._lock:
                self._executing += 1
            try:
                exec_module(module)
            finally:
                with self._lock:
                    self._executing -= 1
                    outermost = self._executing == 0
            if outermost and "tensorflow" in sys.modules:
                self._done()

        loader.exec_module = exec_then_register
        return spec

    def _done(self) -> None:
        with self._lock:
            if self not in sys.meta_path:
                return
            sys.meta_path.remove(self)
        _register_quietly()


def register_after_tensorflow() -> None:
    """Registers hybridtf's Keras objects now if TensorFlow is imported, else once it is."""
    if "tensorflow" in sys.modules:
        _register_quietly()
    elif not any(isinstance(f, _AfterTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTensorFlow())
