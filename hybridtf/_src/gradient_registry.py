"""Custom gradients that do not keep their graph alive after it is gone.

In a graph (a ``tf.function`` trace, an Estimator's graph) ``tf.custom_gradient``
registers its gradient function in TensorFlow's process-wide gradient registry
under a new name, and never removes it. That function holds the graph's
tensors, so every traced step that ever used one stays in memory with its
model's variables: a loop that builds, trains and drops optimized models (a
hyperparameter search) grew by the size of each model's tables and slots
(found by a probe: about 260 MB per model of 10 tables of 200k x 16 under
Adagrad; the plain model's memory stays flat).

``graph_owned_gradients()`` wraps code that may call ``tf.custom_gradient``
(hybridtf's own, and Keras's gradient aggregation, which is one when every
gradient is dense): each gradient function it registers is held by the
outermost graph being built, and the registry holds only a weak reference to
it. The gradient works as before for as long as its graph lives; then its
registry entry is removed.
"""

from __future__ import annotations

import contextlib
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops, registry

_OWNED = "_htf_gradient_functions"  # attribute of the graph holding its gradient functions


def _outermost(graph):
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


class _WeakGradient:
    """A registry entry that calls its gradient function while the graph holding it lives."""

    def __init__(self, function, name: str):
        self._ref = weakref.ref(function)
        self._name = name

    def __call__(self, *args, **kwargs):
        function = self._ref()
        if function is None:
            raise RuntimeError(
                f"the custom gradient {self._name} belongs to a graph that was deleted: its gradient cannot be "
                "computed any more (build the gradient while the graph is alive)."
            )
        return function(*args, **kwargs)


@contextlib.contextmanager
def graph_owned_gradients():
    """Within it, the gradient functions ``tf.custom_gradient`` registers are owned by the graph being built."""
    entries = ops._gradient_registry._registry
    before = set(entries)
    try:
        yield
    finally:
        if not tf.executing_eagerly():
            new = [name for name in list(entries) if name not in before]
            if new:
                graph = _outermost(ops.get_default_graph())
                owned = getattr(graph, _OWNED, None)
                if owned is None:
                    owned = []
                    setattr(graph, _OWNED, owned)
                for name in new:
                    entry = entries[name]
                    function = entry[registry._TYPE_TAG]
                    if isinstance(function, _WeakGradient):
                        continue
                    owned.append(function)
                    entry[registry._TYPE_TAG] = _WeakGradient(function, name)
                    weakref.finalize(function, entries.pop, name, None)  # gone with its graph
