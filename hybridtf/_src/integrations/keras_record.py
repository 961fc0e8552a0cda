"""The record pass of an optimized Keras model: which lookups its forward pass makes.

``lookups_from_inputs`` traces the model's forward pass once in a scratch
graph with the capture context recording, and maps every lookup's ids back
onto the real inputs, so the recording leaves nothing in the real graph (the
usual CTR case: ids are model inputs, possibly through the id-preserving ops a
Keras functional model adds to conform its inputs: ``Cast``, ``ExpandDims``,
``Reshape``, ``Squeeze`` with constant arguments, which are replayed on the
real input). ``discarding_losses`` drops the losses
layers add during such a recording-only pass. ``step_requests`` is what a
model's ``call`` uses: the scratch recording, else (ids computed inside the
model) a recording in the real graph in inference mode, so the pass updates no
layer state (BatchNormalization's moving statistics) and leaves only dead ops.
Used by ``keras_model`` and ``packed_dynamic`` (the model's ``call``), by
micro-batching and by the traffic estimate. ``with_declared_shapes`` gives a
functional model's inputs the static shapes its ``Input`` layers declare (a
generator's batches arrive as ``[None, None]``), which the fusions need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import tensorflow as tf
from tensorflow.python.framework import func_graph as func_graph_module
from tensorflow.python.framework import ops

from hybridtf._src.capture import context
from hybridtf._src.integrations import graph_lift
from hybridtf._src.once import first_time

_log = logging.getLogger("hybridtf")


@contextlib.contextmanager
def discarding_losses(model):
    """Drops the losses layers add while the forward pass is only being recorded.

    Both kinds: symbolic ones (``_losses``) and those added inside a ``tf.function`` step
    (``_eager_losses``: activity regularizers, ``add_loss`` in ``call``), which would otherwise
    reach the step's loss from the scratch graph.
    """
    layers = list(model._flatten_layers(include_self=True, recursive=True))
    before = [(len(layer._losses), len(layer._eager_losses)) for layer in layers]
    try:
        yield
    finally:
        for layer, (n, m) in zip(layers, before):
            del layer._losses[n:]
            del layer._eager_losses[m:]


@contextlib.contextmanager
def inference_mode(model, inputs):
    """Keras's call context in inference mode around a recording-only pass of ``model``'s raw ``call``.

    ``Functional.call`` does not pass ``training`` on to its layers: they take it from the call
    context, which inside ``fit`` says training. A recording pass in training mode would update
    BatchNormalization's moving statistics (stateful, never pruned) from the recorded forward.
    """
    from keras.src.engine import base_layer_utils

    with base_layer_utils.call_context().enter(
        layer=model, inputs=inputs, build_graph=not tf.executing_eagerly(), training=False
    ):
        yield


def step_requests(model, base_call, inputs, kwargs, step_kwargs=None):
    """The lookups of ``model``'s forward pass on ``inputs`` (``kwargs``: the call's, training off).

    The scratch recording of ``lookups_from_inputs`` when ids are model inputs; else (ids computed
    inside the model, e.g. by ``StringLookup`` / ``Hashing`` / ``Discretization`` layers) a recording
    in a scratch graph nested in the step, in the step's own mode (``step_kwargs``: the call's own),
    whose id computations are copied into the step (``recorded_in_step_mode``); else (eager steps,
    lookups under control flow, ids through ops with side effects) a recording in the real graph in
    inference mode (its ops are dead once the lookups are replayed).
    """
    requests = lookups_from_inputs(model, base_call, inputs, kwargs)
    if requests is None and step_kwargs is not None:
        requests = recorded_in_step_mode(model, base_call, inputs, step_kwargs)
    if requests is None:  # record inline
        with discarding_losses(model), inference_mode(model, inputs), context.recording() as rec:
            base_call(inputs, **kwargs)
        requests = rec.requests
    return requests


@contextlib.contextmanager
def keeping_seeds(*models):
    """Restores the layers' legacy seed counters after a recording-only pass of ``models`` (Keras layers).

    A seeded Keras ``Dropout`` (``RandomGenerator.make_legacy_seed``) moves its seed on each call; a
    pass that is only recorded must leave the real call the seed the plain model's call gets.
    """
    generators = []
    for layer in {id(x): x for m in models for x in m._flatten_layers(include_self=True, recursive=True)}.values():
        generator = getattr(layer, "_random_generator", None)
        if generator is not None and isinstance(getattr(generator, "_seed", None), int):
            generators.append((generator, generator._seed))
    try:
        yield
    finally:
        for generator, seed in generators:
            generator._seed = seed


def _training(kwargs) -> bool:
    """Whether an eager call with ``kwargs`` trains (its ``training`` argument, else Keras's call context)."""
    training = kwargs.get("training")
    if training is None:
        from keras.src.engine import base_layer_utils

        training = base_layer_utils.call_context().training
    return bool(training)  # an eager call: a Python bool or int, or an eager tensor


def recorded_in_step_mode(model, base_call, inputs, kwargs):
    """The forward pass's lookups recorded in a scratch graph in the step's mode, their ids copied into the step.

    Ids the model computes from its inputs are then those of the training step itself: a layer
    that acts differently in training (BatchNormalization's batch statistics before a
    ``Discretization``) gives the lookups the ids the plain model's step uses, and nothing of the
    recording runs (a counter the forward pass updates counts once). None when the copy cannot be
    made: outside a ``tf.function`` graph, lookups under control flow, or ids through an op with
    side effects (logged once per model; the inline inference-mode recording is used). Ids drawn
    through random ops (augmentation such as id dropout) are refused: a packed step computes every
    id before the forward pass, and would draw them apart from the plain model's.

    Raises:
        CaptureError: the ids of a lookup depend on a random op.
    """
    real = ops.get_default_graph()
    if tf.executing_eagerly() or not isinstance(real, func_graph_module.FuncGraph):
        eager_training = tf.executing_eagerly() and _training(kwargs)
        if eager_training and first_time(model, "_htf_eager_ids_noted"):
            _log.warning(
                "hybridtf: model %r is called eagerly in training mode (run_eagerly=True, or an eager call with "
                "training=True, a training step or not): its lookups are recorded in an extra inference-mode pass. "
                "Exact when the ids are model inputs; ids the model computes itself "
                "(StringLookup, Hashing, your own layer) that depend on the training flag would differ from the "
                "plain model's, and stateful ops on their way run again. Run the steps as a graph (the default) "
                "for the exact step.",
                model.name,
            )
        return None
    scratch = func_graph_module.FuncGraph("hybridtf_keras_record")
    with scratch.as_default(), discarding_losses(model), keeping_seeds(model), context.recording() as rec:
        rec.requests = graph_lift.GraphNotedRequests()
        setattr(rec, context.RUNS_LOOKUPS_ATTR, True)
        base_call(inputs, **kwargs)
    requests = rec.requests
    if not requests or any(graph is not scratch for graph in requests.graphs):
        return None
    for request in requests:
        parts = tf.nest.flatten(request.ids, expand_composites=True)
        parts = [t for t in parts if getattr(t, "graph", None) is scratch]
        op, _ = graph_lift.side_effect_op(parts, scratch)
        if op is None:
            continue
        if graph_lift.is_random_op(op):
            raise context.CaptureError(
                f"hybridtf: the ids of embedding table {request.table!r} are drawn through random op {op.name!r} "
                f"({op.type}) inside the model (e.g. id dropout or noise before a Discretization): an optimized "
                "model computes the ids of all its lookups before the forward pass, so they would be drawn apart "
                "from the plain model's. Apply the augmentation in the input pipeline (tf.data), or keep the table "
                f"unpacked: htf.keras.optimize(model, exclude=[{request.table!r}])."
            )
        if first_time(model, "_htf_side_effect_noted"):
            _log.warning(
                "hybridtf: the ids of embedding table %r are computed inside the model through op %r (%s), which has "
                "side effects: the optimized model records its lookups in an extra inference-mode pass, where this op "
                "runs again (exact only if it is pure and does not depend on the training flag). Compute these ids "
                "in the input pipeline to avoid it.",
                request.table,
                op.name,
                op.type,
            )
        return None
    return graph_lift.lift_ids(list(requests), scratch, real)


def _source(tensor):
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor


# Ops a Keras functional model puts between its inputs and a layer (conforming the input's rank and
# dtype, e.g. DeepCTR's Input(shape=(1,), dtype="int32") fed [B] int64 ids): replayable on the real input
# when their other inputs are constants.
_REPLAYABLE = ("Cast", "ExpandDims", "Reshape", "Squeeze")


def _replay_step(op):
    """``(op type, argument)`` that recreates ``op`` on another input, or None when it is not replayable."""
    if op.type == "Cast":
        return ("Cast", op.get_attr("DstT"))
    if op.type == "Squeeze":
        return ("Squeeze", tuple(op.get_attr("squeeze_dims")))
    if op.type in ("ExpandDims", "Reshape"):
        value = tf.get_static_value(op.inputs[1])
        if value is None or value.ndim > 1:
            return None
        return (op.type, tuple(value.tolist()) if value.ndim else int(value))
    return None


def _replay(tensor, steps):
    """``steps`` (innermost first) applied to ``tensor``: the ops the model applied to its input."""
    for kind, arg in steps:
        if kind == "Cast":
            tensor = tf.cast(tensor, arg)
        elif kind == "Squeeze":
            tensor = tf.squeeze(tensor, axis=list(arg) or None)
        elif kind == "ExpandDims":
            tensor = tf.expand_dims(tensor, arg)
        else:
            tensor = tf.reshape(tensor, list(arg))
    return tensor


def _trace_to_input(tensor, flat):
    """``(input position, replay steps)`` when ``tensor`` is an input of ``flat`` through replayable ops."""
    steps = []
    src = _source(tensor)
    while True:
        hits = [i for i, t in enumerate(flat) if t is src]
        if hits:
            return hits[0], steps[::-1]
        step = _replay_step(src.op) if src.op.type in _REPLAYABLE else None
        if step is None:
            return None
        steps.append(step)
        src = _source(src.op.inputs[0])


def lookups_from_inputs(model, base_call, inputs, kwargs):
    """Records the lookups in a scratch graph; maps their ids onto the real inputs.

    Returns the requests with ids taken from ``inputs`` when every lookup's ids
    are (through Identity ops and the replayable ``_REPLAYABLE`` ops with constant
    arguments) components of the model inputs — the usual case,
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
        with discarding_losses(model), inference_mode(model, scratch_inputs), context.recording() as rec:
            base_call(scratch_inputs, **kwargs)
        mapped = []
        for req in rec.requests:
            positions = []
            for comp in tf.nest.flatten(req.ids, expand_composites=True):
                found_at = _trace_to_input(comp, flat)
                if found_at is None:
                    return tf.constant(0)
                positions.append(found_at)
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
    replayed = {}  # (input position, steps) -> one tensor: lookups of the same ids share it (positions_key)
    for req, spec, positions in found["mapped"]:
        comps = []
        for i, steps in positions:
            key = (i, tuple(steps))
            if key not in replayed:
                replayed[key] = _replay(flat_real[i], steps)
            comps.append(replayed[key])
        ids = tf.nest.pack_sequence_as(spec, comps, expand_composites=True)
        requests.append(dataclasses.replace(req, ids=ids))
    return requests


def with_declared_shapes(model, inputs):
    """``inputs`` with the static shapes the functional ``model``'s ``Input`` layers declare.

    A batch from a Python generator, a ``keras.utils.Sequence`` or ``Dataset.from_generator``
    without shapes reaches the step as ``[None, None]`` even where the model declares
    ``Input(shape=(1,))``; Keras's functional call does not merge the declared shape in, so every
    concatenation and first dense layer downstream has unknown widths, which the fused ops need
    (``dataflow_fusion``). Each input whose static shape is compatible with, and less defined
    than, its ``Input``'s (same rank; the batch dimension aside) gets a ``tf.ensure_shape`` to the merged
    shape: the declared shape Keras itself enforces on statically shaped inputs (``input_spec``), checked at run time
    (a batch that contradicts it fails with an ``InvalidArgumentError`` naming the input).
    Subclassed models (no declared inputs) and eager calls are left alone.
    """
    if tf.executing_eagerly() or not getattr(model, "_is_graph_network", False):
        return inputs
    ensured = {}
    for tensor, ref in _paired_with_inputs(model, inputs):
        if not isinstance(tensor, tf.Tensor) or tensor.shape.rank is None or tensor.shape.rank != ref.shape.rank:
            continue
        if tensor.shape.rank < 2 or not tensor.shape[1:].is_compatible_with(ref.shape[1:]):
            continue  # Keras's own input check reports it
        # the batch dimension is left as it is, as Keras's input check leaves it (Input(batch_size=32) still
        # takes a last partial batch)
        merged = tensor.shape[:1].concatenate(tensor.shape[1:].merge_with(ref.shape[1:]))
        if merged.as_list() == tensor.shape.as_list():
            continue
        name = ref._keras_history.layer.name if hasattr(ref, "_keras_history") else "input"
        ensured[id(tensor)] = tf.ensure_shape(tensor, merged, name=f"hybridtf_declared_shape_{name}")
    if not ensured:
        return inputs
    return tf.nest.map_structure(lambda t: ensured.get(id(t), t), inputs)


def _paired_with_inputs(model, inputs) -> list:
    """``(tensor, Keras Input)`` pairs of a functional model's call (as ``Functional`` pairs them: a dict by the
    ``Input`` names, else by structure); empty when they do not all pair up (Keras reports that itself)."""
    refs = list(getattr(model, "inputs", None) or [])
    nested = getattr(model, "_nested_inputs", None)
    if isinstance(inputs, dict) and getattr(model, "_enable_dict_to_input_mapping", False):
        ref_inputs = nested if tf.nest.is_nested(nested) else [nested]
        if isinstance(ref_inputs, dict):
            names = sorted(ref_inputs)
        else:
            names = [getattr(getattr(r, "_keras_history", None), "layer", None) for r in ref_inputs]
            names = [getattr(layer, "name", None) for layer in names]
        if len(names) != len(refs) or any(n not in inputs for n in names):
            return []
        return list(zip([inputs[n] for n in names], refs))
    try:
        tf.nest.assert_same_structure(nested, inputs, check_types=False)
    except (TypeError, ValueError):
        return []
    flat = tf.nest.flatten(inputs)
    return list(zip(flat, refs)) if len(flat) == len(refs) else []
