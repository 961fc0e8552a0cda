"""Capture of ``tf.keras.layers.Embedding`` lookups inside one model instance.

No global patching: each captured layer instance gets a class of its own, a
subclass of its class made at run time that keeps the original class name
(so configs and saved models still say ``Embedding``). Its ``call`` turns the
lookup into a LookupRequest and dispatches it through the capture context
(record / replay / direct).
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import tensorflow as tf
from tensorflow.python.framework import func_graph
from tensorflow.python.saved_model import save_context

from hybridtf._src.capture import context, outside_calls
from hybridtf._src.capture.call_reads import call_readers
from hybridtf._src.capture.context import LookupRequest
from hybridtf._src.capture.regularizers import RegularizerSpec, find_penalty, regularizer_spec
from hybridtf._src.capture.subclassing import PlainConstruction, runtime_subclass
from hybridtf._src.once import first_time


@dataclasses.dataclass(frozen=True)
class CapturedTable:
    """An embedding layer hybridtf will pack."""

    name: str
    layer: tf.keras.layers.Layer
    num_rows: int
    dim: int
    dtype: str
    regularizer: RegularizerSpec | None = None  # an L1/L2 penalty whose gradient is folded into the update


@dataclasses.dataclass(frozen=True)
class SkippedLayer:
    """An embedding layer left as it is, and why."""

    name: str
    reason: str


def unsupported_reason(layer: tf.keras.layers.Embedding) -> str | None:
    """Why ``layer`` cannot be packed, or None if it can."""
    if not layer.built or getattr(layer, "embeddings", None) is None:
        return "not built yet: call or build the model once before optimize()"
    if getattr(layer, "sparse", False):
        return "sparse=True returns tf.SparseTensor outputs; build the layer with sparse=False to pack it"
    regularizer = getattr(layer, "embeddings_regularizer", None)
    _, reason = regularizer_spec(regularizer)
    if reason is not None:
        return reason
    if regularizer is not None and find_penalty(layer, layer.embeddings) is None:
        return (
            "embeddings_regularizer: its loss is not the one Keras's add_weight registers for the table, so "
            "hybridtf cannot move it to the packed rows; keep it unpacked or regularize through add_weight"
        )
    if layer.embeddings_constraint is not None:
        return (
            "embeddings_constraint: Keras projects the table's own variable after every update, which a packed "
            "table cannot reproduce per member yet; remove the constraint to pack the table (or keep it unpacked)"
        )
    if not layer.trainable:
        return "frozen (trainable=False) tables are not packed; set trainable=True before optimize() to pack it"
    if _reaches_base_call(layer) is False:
        cls = type(layer).__name__
        return (
            f"its class {cls} overrides call() and looks the table up itself, without Embedding.call: hybridtf "
            f"packs Embedding's own lookup; call super().call(ids) in {cls}.call to pack it (or keep it unpacked)"
        )
    if layer.embeddings.dtype != tf.float32:
        return f"dtype {layer.embeddings.dtype.name} is not supported yet (float32 only); use float32 to pack it"
    return None


_REACHED: set = set()  # ids of layers whose probe (_reaches_base_call) reached Embedding.call


class _BaseCallProbe:
    """Stands in for ``Embedding.call`` while ``_reaches_base_call`` traces a subclass's ``call``."""

    def call(self, inputs, *args, **kwargs):
        _REACHED.add(id(self))
        return tf.zeros(tf.concat([tf.shape(inputs), [self.output_dim]], 0), self.compute_dtype)


def _reaches_base_call(layer) -> bool | None:
    """Whether ``layer``'s own ``call`` (a subclass of Keras's Embedding that overrides it) reaches
    ``Embedding.call``: traced once in a scratch graph, with the base's ``call`` standing in. True for
    a layer that does not override it; None where it cannot be told (no recorded input shape, or the
    trace fails): then the layer is packed and a direct read of its table fails with a clear error."""
    cls = type(layer)
    if not isinstance(layer, tf.keras.layers.Embedding) or is_captured(layer) or cls.call is _BASE_CALL:
        return True
    shape = getattr(layer, "_build_input_shape", None)
    if shape is None:
        return None
    try:  # the ids' dtype where the layer has one input (a functional model), else int64
        dtype = tf.as_dtype(layer.input.dtype)
    except (AttributeError, ValueError, TypeError):
        dtype = tf.int64
    _REACHED.discard(id(layer))
    try:
        layer.__class__ = runtime_subclass(_BaseCallProbe, cls, behind=tf.keras.layers.Embedding)
        with func_graph.FuncGraph("hybridtf_probe").as_default():
            cls.call(layer, tf.compat.v1.placeholder(dtype, tf.TensorShape(shape)))
    except Exception:  # any failure only means "cannot tell"
        return None
    finally:
        layer.__class__ = cls
    reached = id(layer) in _REACHED
    _REACHED.discard(id(layer))
    return reached


def is_embedding_layer(layer) -> bool:
    """A ``tf.keras.layers.Embedding``, or a layer whose class names its capture mixin
    (``_htf_capture_mixin``, e.g. ``hybridtf.layers.EmbeddingBag``)."""
    return isinstance(layer, tf.keras.layers.Embedding) or getattr(type(layer), "_htf_capture_mixin", None) is not None


def _variable_holders(model: tf.keras.Model) -> dict:
    """``id(variable) -> names of the layers (or the model) that track it as their own weight``."""
    holders: dict = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for v in [*getattr(layer, "_trainable_weights", ()), *getattr(layer, "_non_trainable_weights", ())]:
            names = holders.setdefault(id(v), [])
            if layer.name not in names:
                names.append(layer.name)
    return holders


def _variable_readers(model: tf.keras.Model) -> dict:
    """``id(variable) -> names of the layers a functional model applies to it``: the variable is an argument
    of one of their calls, e.g. the ``TFOpLambda`` that ``tf.matmul(h, emb.embeddings)`` or
    ``tf.nn.embedding_lookup(emb.embeddings, ids)`` on Keras tensors adds to the model."""
    readers: dict = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for node in getattr(layer, "_inbound_nodes", ()):
            args = (getattr(node, "call_args", ()), getattr(node, "call_kwargs", {}))
            for v in tf.nest.flatten(args):
                if isinstance(v, tf.Variable):
                    names = readers.setdefault(id(v), [])
                    if layer.name not in names:
                        names.append(layer.name)
    return readers


_SHARED_WHY = (  # (what reads the variable, given the readers' names; what that would do)
    (
        "its table variable is also a weight of {} (tied weights, e.g. an output projection that reads the whole "
        "table)",
        "which would keep training the unpacked variable",
    ),
    (
        "the model applies {} to its table variable (e.g. tf.matmul or tf.nn.embedding_lookup on layer.embeddings: "
        "tied weights, a lookup outside the layer)",
        "which would read the unpacked variable",
    ),
    (
        "the call of {} reads its table variable (layer.embeddings) as a tensor (tied output weights, sampled "
        "softmax weights, a lookup outside the layer)",
        "which a packed table cannot serve",
    ),
)


def _shared_reason(layer, holders: dict, readers: dict, calls: dict) -> str | None:
    """Why ``layer``'s table cannot be packed because something else reads its variable (tied weights), or None.

    ``holders`` / ``readers`` / ``calls``: ``id(variable) -> layer names`` holding it as a weight, applied to it in
    a functional model, reading it in their ``call``.
    """
    table = id(getattr(layer, "embeddings", None))
    for found, (what, effect) in zip((holders, readers, calls), _SHARED_WHY):
        names = [name for name in found.get(table, ()) if name != layer.name]
        if names:
            return (
                f"{what.format(', '.join(repr(n) for n in names))}, {effect}: it stays unpacked (exact); to pack "
                "it, read the table only through this layer's lookups"
            )
    return None


def find_embeddings(model: tf.keras.Model) -> tuple[list[CapturedTable], list[SkippedLayer]]:
    """Every ``tf.keras.layers.Embedding`` in ``model`` (recursively), split into packable and skipped."""
    captured, skipped, names = [], [], set()
    layer_names = {layer.name for layer in model._flatten_layers(include_self=True, recursive=True)}
    holders, readers = _variable_holders(model), _variable_readers(model)
    unsupported = {}  # id(layer) -> (layer, why it cannot be packed, or None), in layer order
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if is_embedding_layer(layer) and id(layer) not in unsupported:
            unsupported[id(layer)] = (layer, unsupported_reason(layer))
    calls = call_readers(model, [layer for layer, reason in unsupported.values() if reason is None])
    for layer, unsupported_why in unsupported.values():
        reason = unsupported_why or _shared_reason(layer, holders, readers, calls)
        name = layer.name
        if reason is None and name in names:  # e.g. towers built by one function, in sub-models
            name = _unique_table_name(model, layer, names | layer_names)
        if reason is not None:
            skipped.append(SkippedLayer(name, reason))
            continue
        names.add(name)
        rows, dim = layer.embeddings.shape.as_list()
        spec, _ = regularizer_spec(getattr(layer, "embeddings_regularizer", None))
        captured.append(CapturedTable(name, layer, rows, dim, layer.embeddings.dtype.name, spec))
    return captured, skipped


def qualified_layer_name(model: tf.keras.Model, layer, parents: dict | None = None) -> str:
    """``<sub-model>.<layer>``: the name of ``layer`` inside the (sub-)model that holds it directly.

    ``parents``: ``layer_parents(model)``, computed once by a caller naming many layers.
    """
    if parents is None:
        parents = layer_parents(model)
    return f"{parents.get(id(layer), model.name)}.{layer.name}"


def layer_parents(model: tf.keras.Model) -> dict:
    """``id(layer) -> name`` of the first (sub-)model, in layer order, whose ``layers`` holds it."""
    parents = {}
    for sub in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(sub, tf.keras.Model):
            for inner in sub.layers:
                parents.setdefault(id(inner), sub.name)
    return parents


def _unique_table_name(model: tf.keras.Model, layer, taken: set) -> str:
    """A table name for ``layer`` when another embedding layer has its name: ``<sub-model>.<layer>``.

    Keras only keeps names unique within one model; layers of nested sub-models may repeat them.
    """
    qualified = qualified_layer_name(model, layer)
    name, k = qualified, 1
    while name in taken:
        name, k = f"{qualified}_{k}", k + 1
    return name


def to_compute_dtype(out, dtype):
    """A lookup's float32 rows in the layer's compute dtype (a mixed-precision policy's float16 or
    bfloat16), cast after the lookup as Keras's Embedding does; unchanged when they agree."""
    if out.dtype == dtype:
        return out
    if isinstance(out, tf.RaggedTensor):
        return out.with_flat_values(tf.cast(out.flat_values, dtype))
    return tf.cast(out, dtype)


# Modules whose reads of a layer's variables are the framework's own (not a user's split by layer).
_FRAMEWORK_MODULES = ("keras", "tf_keras", "tensorflow", "hybridtf")


def _warn_user_read_of_variables(layer) -> None:
    """Warns once per optimized model when user code reads a packed layer's ``trainable_variables``.

    They no longer hold the table (its rows live in the shared packed variable), so code that
    splits the variables by layer (one optimizer per group of layers, a penalty on some layers'
    weights) would silently leave the table out; ``htf.keras.layer_variables`` gives the right list.
    """
    caller = sys._getframe(2).f_globals.get("__name__", "")
    runtime = getattr(layer, "_htf_runtime", None)
    if caller.split(".")[0] in _FRAMEWORK_MODULES or runtime is None:
        return
    if not first_time(runtime, "_htf_warned_variable_read"):
        return
    try:
        packed = runtime.storage.plan.location(layer._htf_table)[0]
    except (AttributeError, KeyError):  # a property never raises for a message
        packed = "the packed table"
    logging.getLogger("hybridtf").warning(
        "hybridtf: layer %r is packed; its table's rows live in the shared variable %r, so "
        "layer.trainable_variables does not list them. To train some layers with their own optimizer (or "
        "to use their weights otherwise), collect the variables with htf.keras.layer_variables(model, layers).",
        layer.name,
        packed,
    )


class PackedLayerWeights(list):
    """A packed layer's ``weights``: a plain list (without the table), whose missing index names the fix."""

    def __init__(self, items=(), layer_name: str | None = None):
        super().__init__(items)
        self._layer_name = layer_name

    def __getitem__(self, index):
        try:
            return super().__getitem__(index)
        except IndexError:
            name = getattr(self, "_layer_name", None)
            raise IndexError(
                f"layer {name!r} is packed by hybridtf.keras.optimize: its table's rows live in a packed variable, "
                f"so layer.weights does not list it. Look the table up by calling the layer, read its values with "
                f"layer.get_weights(), or keep it unpacked for code that reads the whole table: "
                f"htf.keras.optimize(model, exclude=[{name!r}])."
            ) from None


def _dense_ids_of_sparse(ids: tf.SparseTensor) -> tf.Tensor:
    """The dense ids whose lookup equals Keras ``Embedding``'s of a ``tf.SparseTensor`` (``sparse=False``).

    Keras looks each position up as a bag of at most one id (``safe_embedding_lookup_sparse`` with
    ``default_id=0``, the ids expanded by one axis): ids < 0 are pruned, and a position without an id
    (missing or pruned) gets row 0, in the output and in the gradient. A mean of one row is the row
    itself, so the dense lookup of the ids with those positions set to 0 is the same, value and gradient.
    """
    return tf.maximum(tf.sparse.to_dense(tf.sparse.reorder(ids)), 0)  # to_dense fills with 0


class _HybridEmbeddingMixin(PlainConstruction):
    """Per-instance overrides of a captured Embedding layer."""

    @property
    def weights(self):
        return PackedLayerWeights(super().weights, self.name)

    @property
    def trainable_variables(self):
        _warn_user_read_of_variables(self)
        return self.trainable_weights

    def count_params(self):
        # ``summary()``'s Param # per layer: the table's rows live in the packed variable, which the layer
        # does not list among its weights; counted here as the plain layer counts its own table.
        own = super().count_params() if self.built else 0
        view = getattr(self, "embeddings", None)
        shape = getattr(view, "shape", None) if getattr(view, "packed_variable", None) is not None else None
        return own + (int(shape.num_elements()) if shape is not None and shape.is_fully_defined() else 0)

    @tf.autograph.experimental.do_not_convert
    def call(self, inputs):
        ids = inputs
        base = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
        if base.dtype not in (tf.int32, tf.int64):
            ids = tf.cast(ids, tf.int32)
        if isinstance(ids, tf.SparseTensor):
            ids = _dense_ids_of_sparse(ids)
        if save_context.in_save_context():
            # SavedModel export (``model.save``, ``tf.saved_model.save``) traces
            # every layer in a function of its own: no record/replay across
            # layers, and plain TensorFlow ops, so the export needs no hybridtf.
            return self._htf_export_lookup(ids)
        request = LookupRequest(self._htf_table, ids, "none", owner=self)
        out = context.dispatch(request, lambda: self._htf_placeholder(ids), lambda: self._htf_direct(request))
        return to_compute_dtype(out, self.compute_dtype)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        packed = getattr(getattr(self, "embeddings", None), "_variable", None)
        if save_type == "savedmodel" and packed is not None and not _in_keras_saved_model():
            # The export's lookup reads the packed variable: a child of the layer itself, so a SavedModel of
            # any model holding the layer (a sub-model or a tower, not only the optimized one) restores it.
            # (Keras's own SavedModel format revives layers as plain Keras layers from their weights.)
            children = dict(children)
            children["hybridtf_packed_variable"] = packed
        return children

    def _htf_export_lookup(self, ids):
        if isinstance(ids, tf.RaggedTensor):
            out = ids.with_flat_values(self.embeddings.gather(ids.flat_values))
        else:
            out = self.embeddings.gather(ids)
        return to_compute_dtype(out, self.compute_dtype)

    def _htf_placeholder(self, ids):
        from hybridtf._src.capture.context import record_pass_runs_lookups

        if record_pass_runs_lookups():  # hybridtf.function's record pass: its graph never runs
            return self._htf_direct(LookupRequest(self._htf_table, ids, "none", owner=self))
        dim = self.output_dim
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(tf.zeros(tf.stack([tf.size(ids.flat_values), dim]), self.compute_dtype))
        return tf.zeros(tf.concat([tf.shape(ids), [dim]], axis=0), self.compute_dtype)

    def _htf_direct(self, request):
        # Outside the optimized model's call (a model built from this layer, the layer on its own): a training
        # call there would not train the table unless the step takes the packed variable's gradient.
        if context.active() is None:  # not hybridtf.function's record pass, which runs its lookups directly
            outside_calls.check_training_call(self, self.embeddings.packed_variable)
        return self._htf_runtime.lookup([request])[0]

    def _htf_own_weights(self) -> list:
        # The plain layer's order: ``embeddings`` is created first in build().
        return [self.embeddings, *self._trainable_weights, *self._non_trainable_weights]

    def get_weights(self):
        """The plain layer's weights as NumPy arrays (the table's rows first), as Keras gives them."""
        return [v.numpy() for v in self._htf_own_weights()]

    def set_weights(self, weights):
        """Sets the table's rows (and any other weight of the layer) in the plain layer's order and shapes."""
        own = self._htf_own_weights()
        if len(weights) != len(own):
            raise ValueError(
                f"layer {self.name!r} has {len(own)} weight(s) ({[v.name for v in own]}), got {len(weights)} values"
            )
        for v, w in zip(own, weights):
            v.assign(w)

    def save_own_variables(self, store):
        """Keras v3 format (``.keras``): the plain layer's variables, in its order and shapes."""
        for i, v in enumerate(self._htf_own_weights()):
            store[f"{i}"] = v.numpy()

    def load_own_variables(self, store):
        """Keras v3 format: sets this table's rows (and any other weight) from the plain layout."""
        self._update_trackables()
        weights = self._htf_own_weights()
        if len(store.keys()) != len(weights):
            raise ValueError(
                f"Layer '{self.name}' expected {len(weights)} variables, but received {len(store.keys())} variables "
                f"during loading. Expected: {[v.name for v in weights]}"
            )
        for i, v in enumerate(weights):
            v.assign(store[f"{i}"])


def _lookup_base(cls: type) -> type | None:
    """The class whose ``call`` does the lookup hybridtf replaces: Keras's Embedding, or the class that names
    its capture mixin (``EmbeddingBag``)."""
    return next((c for c in cls.__mro__ if c is tf.keras.layers.Embedding or "_htf_capture_mixin" in vars(c)), None)


_BASE_CALL = tf.keras.layers.Embedding.call


def _in_keras_saved_model() -> bool:
    """Whether Keras's ``model.save(..., save_format="tf")`` is saving (not a plain ``tf.saved_model.save``)."""
    try:
        from keras.src.saving.legacy.saved_model import utils as keras_saved_model
    except ImportError:  # another Keras layout: its format then gets the child too
        return False
    return keras_saved_model.in_tf_saved_model_scope()


def hybrid_class(cls: type) -> type:
    """The run-time subclass of ``cls`` used for captured instances (same name).

    A user's subclass that overrides ``call`` (scaling the rows, remapping ids,
    an extra ``training`` argument) keeps it: the capture mixin then replaces
    only the base layer's ``call``, so the user's ``super().call(ids)`` is the
    packed lookup and everything around it runs as written.
    """
    mixin = getattr(cls, "_htf_capture_mixin", None) or _HybridEmbeddingMixin
    base = _lookup_base(cls)
    if base is None or cls.call is base.call:
        return runtime_subclass(mixin, cls)
    return runtime_subclass(mixin, cls, behind=base)


def is_captured(layer) -> bool:
    return isinstance(layer, _HybridEmbeddingMixin)
