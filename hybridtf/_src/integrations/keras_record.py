"""The record pass of an optimized Keras model: which lookups its forward pass makes.

``lookups_from_inputs`` traces the model's forward pass once in a scratch
graph with the capture context recording, and maps every lookup's ids back
onto the real inputs, so the recording leaves nothing in the real graph (the
usual CTR case: ids are model inputs). ``discarding_losses`` drops the losses
layers add during such a recording-only pass. Used by ``keras_model`` (the
model's ``call``), by micro-batching and by the traffic estimate.
"""

from __future__ import annotations

import contextlib
import dataclasses

import tensorflow as tf

from hybridtf._src.capture import context


@contextlib.contextmanager
def discarding_losses(model):
    """Drops the losses layers add while the forward pass is only being recorded."""
    layers = list(model._flatten_layers(include_self=True, recursive=True))
    before = [len(layer._losses) for layer in layers]
    try:
        yield
    finally:
        for layer, n in zip(layers, before):
            del layer._losses[n:]


def _source(tensor):
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor


def lookups_from_inputs(model, base_call, inputs, kwargs):
    """Records the lookups in a scratch graph; maps their ids onto the real inputs.

    Returns the requests with ids taken from ``inputs`` when every lookup's ids
    are (through Identity ops) components of the model inputs — the usual case,
    which leaves no trace of the recording in the real graph — else None.
    """
    if tf.executing_eagerly():
        return None
    flat_real = tf.nest.flatten(inputs, expand_composites=True)
    if not flat_real or not all(isinstance(t, tf.Tensor) for t in flat_real):
        return None
    specs = tf.nest.map_structure(tf.type_spec_from_value, inputs)
    found = {}

    def record(scratch_inputs):
        flat = [_source(t) for t in tf.nest.flatten(scratch_inputs, expand_composites=True)]
        with discarding_losses(model), context.recording() as rec:
            base_call(scratch_inputs, **kwargs)
        mapped = []
        for req in rec.requests:
            positions = []
            for comp in tf.nest.flatten(req.ids, expand_composites=True):
                src = _source(comp)
                hits = [i for i, t in enumerate(flat) if t is src]
                if not hits:
                    return tf.constant(0)
                positions.append(hits[0])
            mapped.append((req, tf.type_spec_from_value(req.ids), positions))
        found["mapped"] = mapped
        return tf.constant(0)

    try:
        tf.function(record, autograph=False).get_concrete_function(specs)
    except (TypeError, ValueError):
        return None
    if "mapped" not in found:
        return None
    requests = []
    for req, spec, positions in found["mapped"]:
        ids = tf.nest.pack_sequence_as(spec, [flat_real[i] for i in positions], expand_composites=True)
        requests.append(dataclasses.replace(req, ids=ids))
    return requests
