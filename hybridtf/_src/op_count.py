"""Op counts of a Keras training step: the counting rule behind the PICASSO Table V style report.

``count_ops`` counts the ops of the function Keras runs per training step (the
one ``model.fit`` calls), so a plain model and its ``hybridtf.keras.optimize``d
twin can be compared op for op (``hybridtf._src.report`` puts the counts next to
the plan). ``synthetic_batch`` makes a batch of the structure a model takes, for
a model that comes without data.

**The counting rule** (the same for every model):

* The graph is the Keras train function (``model.make_train_function()``),
  traced for one batch of the given structure. It is not run.
* Every node of that graph counts once, and so does every node of every
  function it calls, **once per call site** and recursively: a node whose op
  is a function of the graph's library, or that names library functions in
  attributes (``PartitionedCall``/``StatefulPartitionedCall`` ``f``, ``If``
  branches, ``While`` ``cond``/``body``, ``Case`` branches, ...), adds the
  called bodies. A ``While`` body counts once, not once per iteration; both
  branches of an ``If`` count. Library functions no node calls do not count.
* Plumbing does not count: ``PLUMBING_OPS`` (``NoOp``, ``Identity``,
  ``IdentityN``, ``Const``, ``Placeholder``, ``_Arg``, ``_Retval``) and the
  call nodes themselves (``PartitionedCall``, ``StatefulPartitionedCall`` and
  direct calls of library functions), whose bodies are counted instead.

Two counts come out: ``total`` on the graph as traced (it still holds nodes
TensorFlow prunes before running, e.g. the outputs of hybridtf's recording
pass that nothing consumes), and ``grappler_total`` on the same graph after
TensorFlow's default Grappler optimization with the step's outputs and
stateful control outputs as fetches, which is closer to the ops executed.

Example:
    >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
    >>> ops = count_ops(model, (features, labels))
    >>> ops["total"], ops["grappler_total"], ops["by_type"].most_common(3)
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

PLUMBING_OPS = frozenset({"NoOp", "Identity", "IdentityN", "Const", "Placeholder", "_Arg", "_Retval"})
"""Op types that move values around without computing: never counted."""

CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
"""Function-call ops: not counted themselves, the bodies they call are."""

COUNTING_RULE = (
    "nodes of the Keras train function's graph plus, once per call site and recursively, the bodies of the "
    "library functions they call (While bodies once, both If branches); without NoOp, Identity, IdentityN, "
    "Const, Placeholder, _Arg, _Retval and the call nodes themselves"
)


def _graph_def(fn) -> tf.compat.v1.GraphDef:
    if isinstance(fn, tf.compat.v1.GraphDef):
        return fn
    if isinstance(fn, tf.Graph):
        return fn.as_graph_def()
    graph = getattr(fn, "graph", None)
    if isinstance(graph, tf.Graph):  # a ConcreteFunction
        return graph.as_graph_def()
    raise TypeError(
        f"count_graph_ops takes a GraphDef, a tf.Graph or a ConcreteFunction, got {type(fn).__name__}; "
        "for a tf.function, pass fn.get_concrete_function(*args)."
    )


def _called_functions(node, library: Mapping) -> list[str]:
    """Names of the library functions ``node`` calls (its op, or function-valued attributes)."""
    called = [node.op] if node.op in library else []
    for value in node.attr.values():
        if value.HasField("func") and value.func.name in library:
            called.append(value.func.name)
        if value.HasField("list"):
            called.extend(f.name for f in value.list.func if f.name in library)
    return called


def count_graph_ops(fn) -> dict:
    """Counts the ops of a graph and of the functions it calls (see the module docstring for the rule).

    Args:
        fn: a ``tf.compat.v1.GraphDef``, a ``tf.Graph`` or a ``ConcreteFunction``.

    Returns:
        ``{"total": int, "by_type": Counter, "function_calls": int, "nodes": int}``: counted ops,
        counted ops per op type, function bodies expanded, and all nodes including plumbing.

    Raises:
        TypeError: ``fn`` is none of the above.

    Example:
        >>> @tf.function
        ... def f(x):
        ...     return tf.sin(x) + 1.0
        >>> count_graph_ops(f.get_concrete_function(tf.TensorSpec([2])))["by_type"]
        Counter({'AddV2': 1, 'Sin': 1})
    """
    graph_def = _graph_def(fn)
    library = {f.signature.name: f for f in graph_def.library.function}
    memo: dict[str, tuple[collections.Counter, int, int]] = {}

    def count_nodes(nodes, active: tuple[str, ...]) -> tuple[collections.Counter, int, int]:
        counts, calls, total_nodes = collections.Counter(), 0, 0
        for node in nodes:
            total_nodes += 1
            called = _called_functions(node, library)
            if node.op not in PLUMBING_OPS and node.op not in CALL_OPS and node.op not in library:
                counts[node.op] += 1
            for name in called:
                if name in active:  # TensorFlow has no recursion; never loop on a malformed library
                    continue
                if name not in memo:
                    memo[name] = count_nodes(library[name].node_def, (*active, name))
                sub_counts, sub_calls, sub_nodes = memo[name]
                counts.update(sub_counts)
                calls += 1 + sub_calls
                total_nodes += sub_nodes
        return counts, calls, total_nodes

    counts, calls, nodes = count_nodes(graph_def.node, ())
    by_type = collections.Counter(dict(sorted(counts.items())))
    return {"total": sum(by_type.values()), "by_type": by_type, "function_calls": calls, "nodes": nodes}


def grappler_graph_def(concrete_fn) -> tf.compat.v1.GraphDef:
    """The graph of ``concrete_fn`` after TensorFlow's default Grappler optimization.

    The fetches are the function's outputs and its control outputs (the stateful
    ops automatic control dependencies keep: variable updates, metric updates),
    so Grappler prunes what the function runtime would not run and keeps every
    update.
    """
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph = concrete_fn.graph
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph.as_graph_def())
    fetch = meta.collection_def["train_op"].node_list.value
    fetch.extend(t.name for t in graph.outputs)
    fetch.extend(op.name for op in graph.control_outputs)
    return tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta, graph_id=b"hybridtf_report")


def _element_spec(data):
    if isinstance(data, tf.data.Dataset):
        return data.element_spec

    def spec(value):
        if isinstance(value, tf.TypeSpec):
            return value
        if isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
            return tf.type_spec_from_value(value)
        return tf.TensorSpec.from_tensor(tf.convert_to_tensor(value))

    return tf.nest.map_structure(spec, data)


def model_input_spec(model: tf.keras.Model):
    """The ``tf.TypeSpec`` structure of ``model``'s inputs (a dict, list or single spec).

    Raises:
        ValueError: the model was never built or called, so its inputs are unknown.
    """
    inputs = getattr(model, "_nested_inputs", None)  # functional: the Input tensors as the user nested them
    if inputs is not None:
        return tf.nest.map_structure(lambda t: t.type_spec, inputs)
    saved = model.save_spec(dynamic_batch=True) if hasattr(model, "save_spec") else None
    if saved and saved[0]:
        return saved[0][0]
    raise ValueError(
        f"model {model.name!r} has never been built or called, so its inputs are unknown: call it once on a batch "
        "(or build a functional model) before reporting on it, or pass a sample batch."
    )


def _synthetic_value(spec, batch: int, rng):
    if isinstance(spec, tf.RaggedTensorSpec):
        if spec.ragged_rank != 1:
            raise ValueError(
                f"cannot synthesize a ragged input of ragged_rank {spec.ragged_rank}: pass a sample batch."
            )
        lengths = np.arange(batch) % 3  # rows of 0, 1 and 2 values
        inner = [1 if d is None else d for d in spec.shape[2:]]
        flat = _synthetic_value(tf.TensorSpec([int(lengths.sum()), *inner], spec.dtype), None, rng)
        return tf.RaggedTensor.from_row_lengths(flat, tf.constant(lengths, spec.row_splits_dtype))
    if not isinstance(spec, tf.TensorSpec):
        raise ValueError(f"cannot synthesize an input of type {type(spec).__name__}: pass a sample batch.")
    shape = [d if d is not None else (batch if i == 0 and batch else 1) for i, d in enumerate(spec.shape.as_list())]
    dtype = spec.dtype
    if dtype.is_floating:
        return tf.constant(rng.standard_normal(shape).astype(dtype.as_numpy_dtype))
    if dtype.is_integer:  # id 0 is a valid row of every table
        return tf.zeros(shape, dtype)
    if dtype == tf.bool:
        return tf.zeros(shape, tf.bool)
    if dtype == tf.string:
        return tf.fill(shape, "")
    raise ValueError(f"cannot synthesize an input of dtype {dtype.name}: pass a sample batch.")


def synthetic_batch(model: tf.keras.Model, batch_size: int = 256, seed: int = 0):
    """A batch ``(features, labels)`` of the structure ``model`` takes, for tracing its training step.

    Features follow the model's input specs: integer inputs are all 0 (a valid id of every table),
    float inputs standard normal, ragged inputs hold rows of 0, 1 and 2 values. Labels are zeros of
    the shape of the model's outputs, float32 (right for binary and mean-squared losses; for a loss
    that needs integer labels, pass your own batch).

    Args:
        model: a built or called Keras model.
        batch_size: examples in the batch.
        seed: seed of the float features.

    Returns:
        ``(features, labels)`` as tensors.

    Raises:
        ValueError: the model's inputs are unknown (never built) or of a kind this cannot make.

    Example:
        >>> features, labels = synthetic_batch(model, batch_size=8)
        >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
        >>> count_ops(model, (features, labels))["total"]  # doctest: +SKIP
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    rng = np.random.default_rng(seed)
    spec = model_input_spec(model)
    features = tf.nest.map_structure(lambda s: _synthetic_value(s, batch_size, rng), spec)
    outputs = model(features, training=False)
    labels = tf.nest.map_structure(lambda y: tf.zeros(tf.shape(y), tf.float32), outputs)
    return features, labels


def _lists_as_tuples(spec):
    """``spec`` with every list (a multi-input model's inputs, a multi-output model's labels) as a tuple."""
    if isinstance(spec, list):
        return tuple(_lists_as_tuples(s) for s in spec)
    if isinstance(spec, dict):
        return {k: _lists_as_tuples(s) for k, s in spec.items()}
    if isinstance(spec, tuple) and not hasattr(spec, "_fields"):
        return tuple(_lists_as_tuples(s) for s in spec)
    return spec


def train_function_concrete(model: tf.keras.Model, data):
    """The ConcreteFunction of ``model``'s Keras train function for batches shaped like ``data``.

    Traces ``model.make_train_function()`` on an iterator of the batch spec
    (nothing runs, no data is read) and restores ``model.train_function``
    afterwards. Tracing builds the optimizer's slots and the compiled metrics,
    as the first ``fit`` step would.

    Args:
        model: a compiled Keras model.
        data: one batch as ``fit`` gets it (``(x, y)`` or ``(x, y, sample_weight)``,
            tensors or numpy arrays), its ``tf.TypeSpec`` structure, or a
            ``tf.data.Dataset`` of such batches (only its ``element_spec`` is used).

    Raises:
        ValueError: the model is not compiled.
    """
    if not getattr(model, "_is_compiled", False) or getattr(model, "optimizer", None) is None:
        raise ValueError("count_ops needs a compiled model: call model.compile(optimizer=..., loss=...) first.")
    spec = _lists_as_tuples(_element_spec(data))  # tf.data takes a list as one value, not as a structure
    empty = tf.data.Dataset.from_generator(lambda: iter(()), output_signature=spec)
    previous = model.train_function
    try:
        train_fn = model.make_train_function(force=True)
        return train_fn.get_concrete_function(iter(empty))
    finally:
        model.train_function = previous


def count_ops(model: tf.keras.Model, data=None, *, grappler: bool = True) -> dict:
    """Counts the ops of ``model``'s training step (see the module docstring for the exact rule).

    Args:
        model: a compiled Keras model, plain or optimized by ``hybridtf.keras.optimize``.
        data: one batch as ``fit`` gets it (``(x, y)`` or ``(x, y, sample_weight)``), its spec
            structure, or a ``tf.data.Dataset`` of batches (only its ``element_spec`` is used);
            None: a ``synthetic_batch`` of the model's inputs.
        grappler: also count after Grappler's default optimization.

    Returns:
        A dict: ``total`` and ``by_type`` (a ``collections.Counter``) for the graph as traced;
        ``function_calls`` (nested function bodies counted) and ``nodes`` (all nodes, plumbing
        included); ``grappler_total`` / ``grappler_by_type`` after Grappler, None when
        ``grappler=False`` or when Grappler failed (``grappler_error`` says why); ``rule``.

    Raises:
        ValueError: the model is not compiled.

    Example:
        >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
        >>> ops = count_ops(model, (features, labels))
        >>> ops["total"], ops["by_type"].most_common(3)
    """
    if data is None:
        data = synthetic_batch(model)
    concrete = train_function_concrete(model, data)
    result = count_graph_ops(concrete)
    result.update(grappler_total=None, grappler_by_type=None, grappler_error=None, rule=COUNTING_RULE)
    if grappler:
        try:
            optimized = count_graph_ops(grappler_graph_def(concrete))
        except Exception as err:  # Grappler is best effort: report why, keep the plain count
            result["grappler_error"] = f"{type(err).__name__}: {err}"
        else:
            result["grappler_total"] = optimized["total"]
            result["grappler_by_type"] = optimized["by_type"]
    return result
