"""D-interleaving from a named layer of a functional Keras model: the model cut in two.

``interleave_from="<layer name>"`` splits the model's layer graph into a
*head* that runs once on the whole batch and a *tail* that runs per
micro-batch:

* head = the layer's node and all its ancestors, plus every packed embedding
  lookup and its ancestors (lookups always run as whole-batch packed chains);
  it is closed under ancestors, so the cut is valid;
* the *frontier* = the head's tensors (and model inputs) that tail layers
  read; ``head: inputs -> frontier`` and ``tail: frontier -> outputs`` are two
  functional models sharing the original layers (and weights).

The step computes the frontier once under an outer tape (lookups packed, as
``optimize`` does), runs the tail per micro-batch on slices of it, and sends
the concatenated frontier gradients back through the head once. A variable
used on both sides gets both contributions (the chain rule with the frontier
as the cut).
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.capture import context
from hybridtf._src.capture.keras_capture import is_captured
from hybridtf._src.errors import InterleavingError
from hybridtf._src.rewrite import batch_statistics
from hybridtf._src.rewrite.micro_batch_loss import micro_batch_loss, step_loss
from hybridtf._src.rewrite.runtime import lookup_all

# The model cannot be cut at the named layer.
SplitError = InterleavingError


def _nodes(model):
    return [node for nodes in model._nodes_by_depth.values() for node in nodes]


def _producer(tensor):
    layer, node_index, _ = tensor._keras_history
    return layer._inbound_nodes[node_index]


def _ancestors(node, into: set) -> None:
    todo = [node]
    while todo:
        current = todo.pop()
        if id(current) in into:
            continue
        into.add(id(current))
        todo.extend(current.parent_nodes)


def split_model(model, layer_name: str):
    """``(head, tail)`` functional models: the whole-batch part before ``layer_name``, the per-micro-batch rest.

    Raises:
        SplitError: not a functional model, an unknown layer, or a cut that
            leaves nothing per micro-batch.
    """
    if not getattr(model, "_is_graph_network", False):
        raise SplitError(
            f"interleave_from={layer_name!r} needs a functional Keras model (its layer graph is cut at that layer); "
            f"{type(model).__name__} is subclassed. Use interleave_from='embedding' or 'mlp'."
        )
    nodes = _nodes(model)
    targets = [n for n in nodes if n.layer.name == layer_name]
    if not targets:
        names = sorted({n.layer.name for n in nodes})
        raise SplitError(
            f"interleave_from={layer_name!r} is neither a mode ('embedding', 'mlp', 'mlp_fused') nor the name of a "
            f"layer of the model; its layers are {names}."
        )
    head: set[int] = set()
    for node in targets + [n for n in nodes if is_captured(n.layer)]:
        _ancestors(node, head)
    tail_nodes = [n for n in nodes if id(n) not in head]
    frontier, seen = [], set()
    for node in tail_nodes:
        for t in tf.nest.flatten(node.keras_inputs):
            if id(_producer(t)) in head and id(t) not in seen:
                seen.add(id(t))
                frontier.append(t)
    outputs = tf.nest.flatten(model.outputs)
    if not tail_nodes or any(id(_producer(t)) in head for t in outputs):
        raise SplitError(
            f"interleave_from={layer_name!r}: an output of the model is computed before that layer (or by it), so "
            "nothing would run per micro-batch. Name a layer after the embedding lookups, before the outputs."
        )
    try:
        head_model = tf.keras.Model(model.input, frontier, name=f"{model.name}_head")
        tail_model = tf.keras.Model(frontier, model.output, name=f"{model.name}_tail")
    except ValueError as e:  # Keras: a tensor of the tail cannot be reached from the cut (an input, a lookup)
        raise SplitError(
            f"interleave_from={layer_name!r}: the layers after it also read tensors from before the embedding "
            "lookups (an Input, or an embedding layer itself), so the model cannot be cut there. Name a layer "
            f"whose output every later layer depends on, after the lookups (Keras: {' '.join(str(e).split())[:300]})."
        ) from None
    return head_model, tail_model


def _whole_batch_frontier(head, x):
    """The head on the whole batch, its lookups computed by the packed chains."""
    from hybridtf._src.integrations import keras_record

    requests = keras_record.step_requests(head, head.call, x, {"training": False}, {"training": True})
    with context.replaying(requests, lookup_all(requests)):
        return tf.nest.flatten(head(x, training=True))


def from_layer_step(model, x, y, sample_weight, bounds, weights, variables, split_fn):
    """Gradients of the step and the whole batch's predictions, micro-batching from the cut."""
    head, tail = model._htf_split
    with tf.GradientTape() as head_tape:
        frontier = _whole_batch_frontier(head, x)
    grads = [[] for _ in variables]
    d_frontier = [[] for _ in frontier]
    preds = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        xi, yi, swi = split_fn((x, y, sample_weight), lo, hi)
        f_i = [f[lo:hi] for f in frontier]
        with (
            batch_statistics.noted(f"model {model.name!r}", i == 0, batch_statistics.rows_of(f_i)),
            tf.GradientTape() as tape,
        ):
            tape.watch(f_i)
            pred = tail(f_i, training=True)
            loss = micro_batch_loss(model, xi, yi, pred, swi)
            scaled = step_loss(model, loss, weights[i], len(bounds) - 1)
        model._validate_target_and_loss(yi, loss)
        g = tape.gradient(scaled, list(variables) + f_i)
        for parts, gv in zip(grads, g[: len(variables)]):
            if gv is not None:
                parts.append(gv)
        for parts, gf, f in zip(d_frontier, g[len(variables) :], f_i):
            parts.append(tf.zeros_like(f) if gf is None else tf.convert_to_tensor(gf))
        preds.append(pred)
    d_full = [tf.concat(parts, 0) for parts in d_frontier]
    head_grads = head_tape.gradient(frontier, list(variables), output_gradients=d_full)
    for parts, gv in zip(grads, head_grads):
        if gv is not None:
            parts.append(gv)
    return grads, preds
