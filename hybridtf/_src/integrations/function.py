"""``hybridtf.function``: ``tf.function`` for custom training loops, with every lookup of a step packed.

Each time ``tf.function`` traces the Python function, ``_PackedStep`` runs it twice:

1. **Record pass, in a scratch graph.** A throwaway ``FuncGraph`` nested in the
   real trace, under ``context.recording()``: every captured lookup stores its
   ``LookupRequest`` (and the graph it was issued in). Nothing of this graph
   ever runs, so its side effects (``optimizer.apply_gradients``, assigns,
   metric updates, ``tf.print``, summaries) never happen. Its lookups return
   their direct (unpacked) lookup rather than zeros (``RUNS_LOOKUPS_ATTR``),
   so the step traces as it will run: gradients reach the tables (optimizers
   reject a step in which no variable has a gradient).
2. **Real pass**, under ``context.replaying``. At the *first* lookup
   (``_ServedOutputs``), the ops that compute the ids of all recorded lookups
   are copied from the scratch graph into the real one (``lift_to_graph``,
   fed by the same arguments and captures), and all lookups run at once:
   ``lookup_all`` groups them by runtime (``runtime_of``: the
   ``_htf_runtime`` of the issuing object), one packed chain per packed
   table. Running them at the first lookup, not before the function starts,
   keeps them inside the user's ``tf.GradientTape`` block.

Why not record in the real graph (as ``optimize`` does inside a model's
``call``): a training step has side effects after its lookups, and in a
``tf.function`` graph those run even when their results are unused.
"""

from __future__ import annotations

import functools
import logging

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.autograph.core import converter
from tensorflow.python.autograph.impl import api as autograph_api
from tensorflow.python.eager import record
from tensorflow.python.framework import func_graph as func_graph_module
from tensorflow.python.framework import ops
from tensorflow.python.util import object_identity

from hybridtf._src.capture import context
from hybridtf._src.capture.context import RUNS_LOOKUPS_ATTR, CaptureError, LookupRequest
from hybridtf._src.integrations import keras_record
from hybridtf._src.integrations.function_optimizers import (
    attach_optimizers,
    hook_tables_optimizers,
    note_split_optimizers,
    reachable_optimizers,
    warn_partly_looked_up,
    warn_unhooked_clipping,
)
from hybridtf._src.integrations.graph_lift import (
    GATHER_OPS,
    READ_ONLY_OPS,
    GraphNotedRequests,
    components,
    lift_ids,
    side_effect_op,
)
from hybridtf._src.rewrite.micro_batch_fn import current_segment
from hybridtf._src.rewrite.runtime import lookup_all, runtime_of

_log = logging.getLogger("hybridtf")


def _describe(request: LookupRequest, index: int) -> str:
    return f"lookup #{index} (table {request.table!r})"


def _check_liftable(request, index, tensors, scratch) -> bool:
    """Checks that ``tensors`` are computed without side effects from captured values.

    Returns:
        Whether the ops call functions (their definitions must be copied).
    """
    op, calls = side_effect_op(tensors, scratch)
    if op is None:
        return calls
    if op.type in ("Placeholder", "PlaceholderWithDefault"):
        raise CaptureError(
            f"htf.function: the ids of {_describe(request, index)} depend on placeholder {op.name!r}, which is "
            "not an input of the function; compute ids from the function's arguments."
        )
    raise CaptureError(
        f"htf.function: the ids of {_describe(request, index)} depend on op {op.name!r} ({op.type}), which "
        "has side effects (e.g. next(iterator), stateful random ops); htf.function computes all lookups of "
        "a step together and would run it twice. Pass the batch as an argument of the function, or use "
        "tf.random.stateless_* ops."
    )


_NOT_TOP_LEVEL = (
    "runs inside tf.cond, tf.while_loop or a nested tf.function (AutoGraph makes the first two from Python "
    "if/for/while over tensors, and a `for batch in dataset` loop); inside htf.function, lookups must be at the "
    "top level of the step. Make the step one batch's work and loop outside it (`for x, y in dataset: "
    "step(x, y)`), or compute the branch's lookups before the tf.cond and select their outputs in it."
)


class NotedRequests(GraphNotedRequests):
    """The recorder's request list; also notes each lookup's graph and micro-batch segment."""

    def __init__(self):
        super().__init__()
        self.segments = []

    def append(self, request):
        self.segments.append(current_segment())
        super().append(request)


def _check_top_level(requests: NotedRequests, scratch) -> None:
    """Raises if a lookup was recorded in a graph nested in the record pass (control flow, tf.function)."""
    for index, (request, graph) in enumerate(zip(requests, requests.graphs)):
        if graph is not scratch:
            raise CaptureError(f"htf.function: {_describe(request, index)} {_NOT_TOP_LEVEL}")


def _gathered_handles(outputs, chain_ops: set) -> list[object_identity.ObjectIdentitySet]:
    """For each output, the resource handles its chain (among ``chain_ops``) gathered rows from."""
    result = []
    for out in outputs:
        handles = object_identity.ObjectIdentitySet()
        stack, seen = [t.op for t in components(out)], set()
        while stack:
            op = stack.pop()
            if op in seen or op not in chain_ops:
                continue
            seen.add(op)
            if op.type in GATHER_OPS:
                handles.add(op.inputs[0])
            stack.extend(t.op for t in op.inputs)
        result.append(handles)
    return result


class _ServedOutputs:
    """The outputs the replay pass serves: computed per segment at its first lookup, then handed out in order.

    A segment is the lookups of one runtime (one optimized model, one
    ``Tables`` set) in one micro-batch of ``micro_batch_gradients`` (in the
    whole step otherwise): each gets its own packed chains, built at its first
    lookup, so inside the gradient tape that first lookup runs under (a
    teacher model called before the tape, its student inside it).
    ``Graph.version`` counts the ops created so far and ``get_operations()``
    lists them in creation order; ops created since the first lookup (chains
    excepted) are scanned for updates of the tables the lookups read.
    """

    def __init__(self, requests, scratch, real, segments=None):
        self._requests = list(requests)
        batches = list(segments) if segments is not None else [None] * len(self._requests)
        self._segments = [(batch, id(runtime_of(r))) for batch, r in zip(batches, self._requests)]
        self._scratch = scratch
        self._real = real
        self._outputs: dict[int, object] = {}
        self._handles: dict[int, object_identity.ObjectIdentitySet] = {}
        self._watched = object_identity.ObjectIdentitySet()
        self._chain_ops: set = set()
        self._first = None
        self._cursor = 0
        self._written = object_identity.ObjectIdentityDictionary()

    def __len__(self):
        return len(self._requests)

    def _compute_segment(self, graph, segment) -> None:
        indices = [i for i, s in enumerate(self._segments) if s == segment]
        if self._first is not None:
            self._scan_writes(graph)
        start = graph.version
        if self._first is None:
            self._first = start
        with tf.name_scope("hybridtf_packed_lookups"):
            outputs = lookup_all(lift_ids([self._requests[i] for i in indices], self._scratch, graph, _check_liftable))
        self._cursor = graph.version
        chain = graph.get_operations()[start : self._cursor]
        self._chain_ops.update(chain)
        new = object_identity.ObjectIdentitySet()
        for i, out, handles in zip(indices, outputs, _gathered_handles(outputs, set(chain))):
            self._outputs[i] = out
            self._handles[i] = handles
            new.update(h for h in handles if h not in self._watched)
        if new and start > self._first:  # updates made before this segment's chains, of tables first read now
            self._scan(graph.get_operations()[self._first : start], new)
        self._watched.update(new)

    def __getitem__(self, index: int):
        graph = ops.get_default_graph()
        request = self._requests[index]
        if graph is not self._real:
            raise CaptureError(f"htf.function: {_describe(request, index)} {_NOT_TOP_LEVEL}")
        if index not in self._outputs:
            self._compute_segment(graph, self._segments[index])
        self._scan_writes(graph)
        for handle in self._handles[index]:
            op = self._written.get(handle)
            if op is not None:
                raise CaptureError(
                    f"htf.function: op {op.name!r} ({op.type}) updates an embedding table before "
                    f"{_describe(request, index)} reads it, but htf.function reads all tables of a step (or of a "
                    "micro-batch) at its first lookup; run one training step per htf.function call."
                )
        out = self._outputs[index]
        if _untaped(out):
            raise CaptureError(
                f"htf.function: {_describe(request, index)} runs under a tf.GradientTape that was not recording "
                "when the model's first lookup of the step ran, but htf.function runs all lookups of a model (or "
                "Tables set) in a step at its first lookup (one fused chain per packed table): this tape would give "
                "the tables no gradient. Call the model for the first time in the step inside the tape you "
                "differentiate (and nothing before it), use "
                "htf.micro_batch_gradients for one tape per micro-batch, or use tf.function for this step (an "
                "htf.keras.optimize'd model packs its own lookups per call)."
            )
        return out

    def _scan(self, operations, watched) -> None:
        for op in operations:
            if op.type in READ_ONLY_OPS or op in self._chain_ops:
                continue
            for t in op.inputs:
                if t in watched and t not in self._written:
                    self._written[t] = op

    def _scan_writes(self, graph) -> None:
        version = graph.version
        if version == self._cursor:
            return
        self._scan(graph.get_operations()[self._cursor : version], self._watched)
        self._cursor = version


def _untaped(out) -> bool:
    """Whether a gradient tape records now but does not record ``out`` (its chain was built outside that tape)."""
    if not record.could_possibly_record() or pywrap_tfe.TFE_Py_TapeSetIsStopped():
        return False
    flat = [
        t
        for t in tf.nest.flatten(out, expand_composites=True)
        if isinstance(t, tf.Tensor) and (t.dtype.is_floating or t.dtype.is_complex)
    ]
    return bool(flat) and not pywrap_tfe.TFE_Py_TapeSetShouldRecordBackprop(flat)


def _referenced(python_function, args, kwargs) -> list:
    """The objects a step reaches directly: its arguments, closure cells and the globals it names."""
    found = [*args, *kwargs.values()]
    fn = getattr(python_function, "__func__", python_function)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    code, module = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    found += [module[name] for name in (code.co_names if code is not None else ()) if name in module]
    return found


def _referenced_layers(python_function, referenced: list) -> list:
    """The Keras layers (models included) a step reaches directly, and those held by the object of a bound method."""
    found = list(referenced)
    owner = getattr(python_function, "__self__", None)
    if owner is not None:
        found += [owner, *vars(owner).values()] if hasattr(owner, "__dict__") else [owner]
    return [obj for obj in found if isinstance(obj, tf.keras.layers.Layer)]


class _PackedStep:
    """The Python function tf.function traces: record pass (scratch graph), then real pass (replay)."""

    def __init__(self, python_function, autograph_options):
        self._python_function = python_function
        self._options = converter.ConversionOptions(
            recursive=True, optional_features=autograph_options, user_requested=True
        )

    def _run(self, args, kwargs):
        # AutoGraph-converts the user's function when tf.function's autograph is on
        # (converted_call runs it unconverted when AutoGraph is disabled).
        return autograph_api.converted_call(self._python_function, args, kwargs, options=self._options)

    def __call__(self, *args, **kwargs):
        objects = _referenced(self._python_function, args, kwargs)  # once per trace: it reads globals and cells
        attach_optimizers(objects)
        real = ops.get_default_graph()
        if tf.executing_eagerly() or not isinstance(real, func_graph_module.FuncGraph):
            return self._run(args, kwargs)  # tf.config.run_functions_eagerly(True): lookups run one by one
        scratch = func_graph_module.FuncGraph("hybridtf_record_pass")
        layers = _referenced_layers(self._python_function, objects)
        # the record pass calls the step's layers once more: their seeded Dropout must not move on
        with scratch.as_default(), keras_record.keeping_seeds(*layers), context.recording() as rec:
            rec.requests = NotedRequests()
            setattr(rec, RUNS_LOOKUPS_ATTR, True)
            self._run(args, kwargs)
        if not rec.requests:
            return self._run(args, kwargs)
        note_split_optimizers(objects)
        optimizers = reachable_optimizers(self._python_function, objects, _referenced)
        hook_tables_optimizers(rec.requests, optimizers)
        if not any(getattr(o, "_htf_plain_trainable", None) is not None for o in objects):
            warn_unhooked_clipping(rec.requests, optimizers)  # an optimized model's compile hooks and warns
        warn_partly_looked_up(rec.requests, [*objects, *optimizers])
        _check_top_level(rec.requests, scratch)
        with context.replaying(rec.requests, []) as rep:
            rep.outputs = _ServedOutputs(rec.requests, scratch, real, rec.requests.segments)
            return self._run(args, kwargs)


def function(
    func=None,
    input_signature=None,
    autograph=True,
    jit_compile=None,
    reduce_retracing=False,
    experimental_implements=None,
    experimental_autograph_options=None,
    experimental_attributes=None,
    experimental_relax_shapes=None,
    experimental_compile=None,
    experimental_follow_type_hints=None,
):
    """A drop-in for ``tf.function`` that runs all embedding lookups of the step packed.

    Same signature and options as ``tf.function``; use it as ``@htf.function``
    or ``@htf.function(input_signature=...)`` on a custom training step. The
    lookups the step makes through hybridtf (``hybridtf.embedding.Tables``,
    layers of an optimized model called directly) are computed together at
    the step's first lookup, one fused chain per packed table. Lookups inside
    an optimized Keras model's ``call`` are packed by the model itself. A
    function without lookups traces exactly as with ``tf.function``.

    The Python function runs twice per trace: a record pass in a throwaway
    graph (whose side effects never run) and the real pass. Hence:

    * a lookup's ids must be computed from the function's arguments (and
      captured values) without side effects: not from ``next(iterator)``
      inside the function or stateful random ops (they would be drawn twice).
      Pass the batch as an argument; use ``tf.random.stateless_*`` ops;
    * lookups must be at the top level of the step, not inside ``tf.cond``,
      ``tf.while_loop`` or a nested ``tf.function`` (AutoGraph turns Python
      ``if``/``for`` over tensors into the first two);
    * a table must not be updated in the function before one of its lookups
      (e.g. two optimizer steps unrolled in one call): the tables are read
      at the first lookup;
    * the step's first lookup must run inside the ``tf.GradientTape`` that
      differentiates the lookups (not a model call before the tape, nor one
      tape per micro-step: use ``htf.micro_batch_gradients``);
    * Python side effects run twice per trace (as on a retrace), and
      ``tf.Variable``s must be created outside the function or by Keras
      layers and optimizers (which create theirs once).

    Violations of the first four raise ``CaptureError`` naming the lookup.
    ``jit_compile=True`` is dropped with a warning (hybridtf's ops have no
    XLA kernels).
    Ids that depend on another lookup's output are fine (they are computed
    with an extra, unpacked lookup).

    Args:
        func: the function to compile (omit to use as a decorator with options).
        input_signature, autograph, jit_compile, reduce_retracing,
        experimental_implements, experimental_autograph_options,
        experimental_attributes, experimental_relax_shapes,
        experimental_compile, experimental_follow_type_hints: as for
            ``tf.function``.

    Returns:
        A ``tf.function`` (``PolymorphicFunction``), or a decorator.

    Example:
        >>> tables = htf.embedding.Tables([htf.embedding.TableConfig("user", 1000, 8)])
        >>> opt = tf.keras.optimizers.Adagrad(0.1)
        >>> @htf.function
        ... def train_step(ids, labels):
        ...     with tf.GradientTape() as tape:
        ...         emb = tables.lookup("user", ids)
        ...         loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, 1) - labels))
        ...     grads = tape.gradient(loss, tables.trainable_variables)
        ...     opt.apply_gradients(zip(grads, tables.trainable_variables))
        ...     return loss
    """
    options = dict(
        input_signature=input_signature,
        autograph=autograph,
        jit_compile=jit_compile,
        reduce_retracing=reduce_retracing,
        experimental_implements=experimental_implements,
        experimental_autograph_options=experimental_autograph_options,
        experimental_attributes=experimental_attributes,
        experimental_relax_shapes=experimental_relax_shapes,
        experimental_compile=experimental_compile,
        experimental_follow_type_hints=experimental_follow_type_hints,
    )
    if func is None:
        return functools.partial(function, **options)
    if not callable(func):
        raise TypeError(f"htf.function takes a callable, got {type(func).__name__}.")
    if options["jit_compile"] or options["experimental_compile"]:
        _log.warning(
            "htf.function(%s, jit_compile=True): hybridtf's packed embedding ops (custom TensorFlow kernels) cannot "
            "be compiled by XLA, so the step runs without XLA (same math). Pass jit_compile=False to silence this.",
            getattr(func, "__name__", type(func).__name__),
        )
        options["jit_compile"] = options["experimental_compile"] = None
    step = _PackedStep(func, experimental_autograph_options)

    @functools.wraps(func)
    def traced(*args, **kwargs):
        return step(*args, **kwargs)

    autograph_api.autograph_artifact(traced)  # tf.function's AutoGraph leaves it alone; it converts ``func``
    defaults = {"autograph": True, "reduce_retracing": False}
    # Only what the caller set, so that deprecated options warn exactly as with tf.function.
    given = {k: v for k, v in options.items() if v is not defaults.get(k)}
    return tf.function(traced, **given)
