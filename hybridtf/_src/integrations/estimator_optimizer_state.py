"""Keras legacy optimizers the record pass touches are put back as they were before it.

``hybridtf.estimator.model_fn`` calls the user's model_fn twice: once in a scratch graph (the record
pass, never run) and once in the real graph. A ``tf.keras.optimizers.legacy`` optimizer made
*outside* the model_fn (a canned estimator's ``dnn_optimizer=Adagrad(0.05)``, or a module-level
optimizer a model_fn's ``minimize`` uses) keeps what the first call gave it: its ``iterations``
set to the scratch graph's global step, its hyperparameter and slot variables made in the scratch
graph. The real pass then failed ("Cannot set `iterations` to a new Variable after the Optimizer
weights have been created") or used variables of another graph, where the plain Estimator, which
calls the model_fn once per graph, trains.

``untouched(graph)`` watches the calls through which such an optimizer starts to be used
(``add_weight``, ``add_slot``, setting ``iterations``) while ``graph`` is the default graph of the
calling thread, keeps a copy of the optimizer's attributes from before the first one, and writes
that copy back on exit, so the real pass meets the optimizer as the plain model_fn would. One the
model_fn makes on its first call and keeps (a lazily made module-level optimizer) is put back as
its ``__init__`` left it. Containers (dicts, lists, sets) in the attributes are copied; the
objects in them are not.
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf
from tensorflow.python.framework import ops

_PATCHED = ("__setattr__", "add_weight", "add_slot")
_install_lock = threading.Lock()
_installed: set[str] = set()
_watches = threading.local()  # .active: list of (graph, saved) of this thread's open untouched() blocks


def _legacy_base():
    legacy = getattr(tf.keras.optimizers, "legacy", None)
    return getattr(legacy, "Optimizer", None)


def _copy(value, depth=0):
    if depth > 4:
        return value
    if type(value) is dict:
        return {k: _copy(v, depth + 1) for k, v in value.items()}
    if type(value) is list:
        return [_copy(v, depth + 1) for v in value]
    if type(value) is set:
        return set(value)
    return value


def _note(optimizer):
    graph = ops.get_default_graph()
    for watched, saved in getattr(_watches, "active", ()):
        if graph is watched and id(optimizer) not in saved:
            saved[id(optimizer)] = (optimizer, {k: _copy(v) for k, v in vars(optimizer).items()})


def _watching(original):
    setter = original.__name__ == "__setattr__"

    def method(self, *args, **kwargs):
        # first use: a weight, a slot, or its step counter set (an optimizer made in the pass has left its
        # __init__ by then, and is put back as it came out of it)
        if getattr(_watches, "active", None) and (not setter or args[0] == "iterations"):
            _note(self)
        return original(self, *args, **kwargs)

    method.__name__ = getattr(original, "__name__", "method")
    method.__doc__ = getattr(original, "__doc__", None)
    return method


def _install(base):
    """Wraps the base class's state-changing methods once per process (they call the original)."""
    with _install_lock:
        for name in _PATCHED:
            if name not in _installed and name in base.__dict__:
                setattr(base, name, _watching(base.__dict__[name]))
                _installed.add(name)


@contextlib.contextmanager
def untouched(graph):
    """While the body runs, legacy Keras optimizers changed in this thread with ``graph`` as the
    default graph are noted; on exit each gets its attributes from before its first change back."""
    base = _legacy_base()
    if base is None:
        yield
        return
    _install(base)
    saved: dict[int, tuple[object, dict]] = {}
    active = _watches.__dict__.setdefault("active", [])
    entry = (graph, saved)
    active.append(entry)
    try:
        yield
    finally:
        active[:] = [e for e in active if e is not entry]
        for optimizer, attributes in saved.values():
            optimizer.__dict__.clear()
            optimizer.__dict__.update(attributes)
