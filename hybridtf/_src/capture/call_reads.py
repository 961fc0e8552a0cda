"""Tables read as a whole inside a layer's ``call``: found when ``optimize`` runs, so they stay unpacked.

A custom layer (or a subclassed model) that holds an embedding layer may use its
table variable as a tensor in ``call`` instead of calling the layer: tied output
weights (``tf.matmul(h, self.item.embeddings, transpose_b=True)``),
``tf.nn.sampled_softmax_loss(weights=self.item.embeddings, ...)``, its own
``tf.nn.embedding_lookup``. A packed table serves lookups through its layer
only, so such a table must stay unpacked. A functional model's graph of layers
shows the reads it makes through ``TFOpLambda`` layers
(``keras_capture._variable_readers``); reads inside a ``call`` it does not.

``call_readers`` calls, once, every layer that holds embedding layers (and a
subclassed model), through Keras's ``__call__`` in inference mode, in a scratch
graph that never runs, from the input signature Keras recorded at the layer's
first call; the losses layers added in their last eager call are kept. A
tape watches the variables the call accesses and is paused inside the embedding
layers' own calls: a table variable it saw is read directly. Variable creation
aborts the trace. A call that cannot be traced (no recorded signature, the trace
fails) is not judged here: a direct read of a packed table then fails at the
first training step with an error that names the fix (``exclude=``).
"""

from __future__ import annotations

import contextlib

import tensorflow as tf
from tensorflow.python.framework import func_graph

from hybridtf._src.capture.subclassing import runtime_subclass

_TAPES: list = []  # the tape of the probe that runs now


class _OwnCallUnwatched:
    """An embedding layer's own ``call`` (its lookup) while a probe runs: its variable accesses are not watched."""

    def call(self, *args, **kwargs):
        with contextlib.ExitStack() as paused:
            for tape in _TAPES:
                paused.enter_context(tape.stop_recording())
            return super().call(*args, **kwargs)


class _NoVariables(Exception):
    """A probed call tried to create a variable: the probe stops (it must change nothing)."""


def _refuse_variables(next_creator, **kwargs):
    raise _NoVariables()


def _placeholder(spec):
    if isinstance(spec, tf.TensorSpec):
        return tf.compat.v1.placeholder(spec.dtype, spec.shape)
    if isinstance(spec, tf.TypeSpec):  # ragged / sparse inputs: one placeholder per component
        components = tf.nest.map_structure(_placeholder, spec._component_specs)
        return spec._from_components(components)
    return spec


def _accessed(layer) -> list | None:
    """The variables ``layer.call`` accesses outside embedding layers' calls, or None where it cannot be told."""
    spec = layer._get_save_spec(dynamic_batch=True, inputs_only=False)
    if spec is None:
        return None
    args, kwargs = spec
    graph = func_graph.FuncGraph("hybridtf_call_reads")
    try:
        with graph.as_default(), tf.variable_creator_scope(_refuse_variables):
            args, kwargs = tf.nest.map_structure(_placeholder, (list(args), dict(kwargs)))
            kwargs.setdefault("training", False)  # Keras passes it on only to a call that takes it
            with tf.GradientTape(watch_accessed_variables=True) as tape:
                _TAPES.append(tape)
                try:
                    layer(*args, **kwargs)  # through Keras's __call__: its call context (add_loss in call)
                finally:
                    _TAPES.pop()
    except Exception:  # any failure only means "cannot tell"
        return None
    return list(tape.watched_variables())


def call_readers(model: tf.keras.Model, embedding_layers: list) -> dict:
    """``id(variable) -> names of the layers whose call reads it directly`` for the tables of ``embedding_layers``.

    Probes the non-functional layers of ``model`` (the model itself included) that hold one of them.
    """
    tables = {id(layer): layer for layer in embedding_layers if getattr(layer, "embeddings", None) is not None}
    if not tables:
        return {}
    variables = {id(layer.embeddings) for layer in tables.values()}
    holders = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if id(layer) in tables or getattr(layer, "_is_graph_network", False):
            continue  # a functional (sub-)model's call walks its layers: each is probed on its own
        if any(id(inner) in tables for inner in layer._flatten_layers(include_self=False, recursive=True)):
            holders.append(layer)
    if not holders:
        return {}
    classes = {id(layer): type(layer) for layer in tables.values()}
    # the losses a layer added in its last eager call (model.losses): a traced call clears and refills them
    eager_losses = [
        (layer, list(getattr(layer._thread_local, "_eager_losses", ())))
        for layer in model._flatten_layers(include_self=True, recursive=True)
        if hasattr(layer, "_thread_local")
    ]
    readers: dict = {}
    try:
        for layer in tables.values():
            layer.__class__ = runtime_subclass(_OwnCallUnwatched, type(layer))
        for holder in holders:
            for variable in _accessed(holder) or ():
                if id(variable) in variables:
                    names = readers.setdefault(id(variable), [])
                    if holder.name not in names:
                        names.append(holder.name)
    finally:
        for layer in tables.values():
            layer.__class__ = classes[id(layer)]
        for layer, losses in eager_losses:  # the traced calls' losses (scratch-graph tensors) belong to no step
            layer._thread_local._eager_losses = losses
    return readers
