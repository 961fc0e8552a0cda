"""Finding the embedding tables a TF1-style model_fn creates, without global patching.

``hybridtf.estimator.model_fn`` runs the user's model_fn inside a
``tf.variable_creator_scope``. When a ``tf.keras.layers.Embedding`` or a
``hybridtf.layers.EmbeddingBag`` creates its ``embeddings`` weight, the
creator hands the layer a ``CapturedTable`` instead of a variable of its own:

* in the record pass, a view of a real (scratch-graph) variable of the table;
* in the real pass, a view of the table's rows inside a packed variable (no
  per-table variable exists in the real graph).

Keras ``Embedding.call`` looks its table up with ``tf.nn.embedding_lookup``;
TensorFlow's type-based dispatch (``tf.experimental.dispatch_for_api``, for
``CapturedTable`` only) routes that call to ``CapturedTable.lookup``, so the
layer itself is not changed. ``EmbeddingBag`` (hybridtf's own layer) gets a
per-instance run-time subclass whose ``_own_lookup`` does the same. Any other
use of the table as a tensor (tied weights, one-hot matmul, SparseTensor ids)
converts the view to its rows; in the record pass that marks the table as not
packable, so the real pass leaves it a plain variable. The exception is the
layer's own Keras L1/L2/L1L2 ``embeddings_regularizer``: its penalty reads the
view's rows (in the real pass a slice of the packed variable, whose gradient
TensorFlow makes dense over the table, as Keras does for the plain table).

The layer that owns a new variable is the ``self`` of the nearest
``add_weight`` frame on the Python stack (``Tables`` sets: of the nearest
``Tables.__init__`` frame). Keras builds a layer inside ``__call__`` after it
has bound ``call``, so a class swap at that point would miss the first call;
the dispatch route does not.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.saved_model import save_context
from tensorflow.python.util import dispatch

from hybridtf._src.capture.context import LookupRequest
from hybridtf._src.capture.keras_capture import to_compute_dtype
from hybridtf._src.capture.layers import EmbeddingBag
from hybridtf._src.capture.lookup_api import Tables, plain_lookup, prepare_ids
from hybridtf._src.capture.regularizers import regularizer_spec
from hybridtf._src.capture.subclassing import runtime_subclass
from hybridtf._src.distribute.world import current_world
from hybridtf._src.plan.tables import TableSpec
from hybridtf._src.rewrite.packed_storage import TableView


def _frame_locals(function: str | None, max_depth: int = 40):
    """The locals of the frames on the Python stack (nearest first) that run a function named ``function``
    (every frame's when None)."""
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return
        if function is None or frame.f_code.co_name == function:
            yield frame.f_locals
        frame = frame.f_back


def frame_owner(method: str, cls: type, max_depth: int = 40):
    """The ``self`` of the nearest frame running ``cls.<method>`` on the Python stack, or None.

    Example:
        >>> frame_owner("add_weight", tf.keras.layers.Layer)  # inside a layer's add_weight
    """
    owners = (f.get("self") for f in _frame_locals(method, max_depth))
    return next((obj for obj in owners if isinstance(obj, cls)), None)


def is_table_layer(layer) -> bool:
    """A layer whose ``embeddings`` weight the Estimator wrapper can pack."""
    return isinstance(layer, (tf.keras.layers.Embedding, EmbeddingBag))


def declared_shape(kwargs) -> tf.TensorShape:
    """The shape of the variable a creator's ``kwargs`` make: ``shape=``, else its initial value's (not a callable)."""
    shape = kwargs.get("shape")
    if shape is not None:
        return tf.TensorShape(shape)
    init = kwargs.get("initial_value")
    if isinstance(init, (tf.Tensor, np.ndarray)):
        return tf.TensorShape(init.shape)
    return tf.TensorShape(None)


def unsupported_reason(layer, kwargs) -> str | None:
    """Why the table ``layer`` is creating cannot be packed (checked before it is built), or None."""
    if getattr(layer, "sparse", False):
        return "sparse=True returns tf.SparseTensor outputs"
    regularizer = getattr(layer, "embeddings_regularizer", None)
    if regularizer is not None:
        _, reason = regularizer_spec(regularizer)
        if reason is not None:
            return reason
        if current_world().size > 1:
            return (
                "a regularized table is packed in one process only (its penalty reads the whole table, which a "
                "Horovod job shards over the ranks); drop embeddings_regularizer to pack it under Horovod"
            )
    if getattr(layer, "embeddings_constraint", None) is not None:
        return "embeddings_constraint needs the table's own variable"
    if getattr(layer, "_use_one_hot_matmul", False):
        return "use_one_hot_matmul multiplies by the whole table"
    if not layer.trainable or kwargs.get("trainable") is False:
        return "frozen (trainable=False) tables are not packed"
    dtype = tf.as_dtype(kwargs.get("dtype") or tf.float32)
    if dtype != tf.float32:
        return f"dtype {dtype.name} is not supported yet (float32 only)"
    shape = declared_shape(kwargs)
    if shape.rank != 2:
        return f"table shape {shape} is not [rows, dim]"
    return None


@dispatch.register_dispatchable_type
class CapturedTable(TableView):
    """A captured layer's ``embeddings``: one table's rows inside a variable, looked up through the pass.

    Args:
        variable: the variable holding the rows (the table's own variable in
            the record pass, the packed variable in the real pass).
        offset: first row of the table in ``variable``.
        num_rows: rows of the table.
        table: the table's name (the layer's name).
        layer: the layer that owns the table.
        checkpoint_key: the name of the plain layer's variable (its
            checkpoint key in a name-based ``tf.compat.v1.train.Saver``).
        lookup_fn: ``lookup_fn(table, ids, combiner)``: runs a lookup issued
            in the pass's graph while the pass is active (None: plain lookup).
    """

    _direct_indexing = False  # `table[i]` reads through the conversion below, which records the dense use

    def __init__(self, variable, offset, num_rows, table, layer, checkpoint_key, lookup_fn=None):
        super().__init__(variable, offset, num_rows, table)
        self.layer = layer
        self.checkpoint_key = checkpoint_key
        self.lookup_fn = lookup_fn
        self.dense_use = None  # set when the table is used as a tensor (record pass)

    @property
    def name(self) -> str:
        return f"{self.checkpoint_key}:0"

    def get_shape(self) -> tf.TensorShape:  # TF1 code (shared feature columns) checks a table's shape so
        return self.shape

    # Keras' TF1 backend initializes the variables it tracked (add_weight tracks this view) in its own session.
    @property
    def initializer(self):
        return self._variable.initializer

    def is_initialized(self, name=None):
        return self._variable.is_initialized(name=name)

    def claim_weights(self) -> None:
        """Puts the variable holding the rows where the layer listed this view among its weights.

        Optimizers given ``layer.trainable_variables`` (or a Keras model's)
        then train the packed table; layers packed together share it.
        """
        owner = getattr(self.layer, "keras_layer", None) or self.layer  # a feature column's: its DenseFeatures
        weights = getattr(owner, "_trainable_weights", None)
        if weights is None or not any(w is self for w in weights):
            return
        kept = [w for w in weights if w is not self]
        if not any(w is self._variable for w in kept):
            kept.append(self._variable)
        owner._trainable_weights = kept

    @tf.autograph.experimental.do_not_convert
    def lookup(self, ids, combiner: str = "none", aux=None):
        """Looks ``ids`` up: through the active pass, or with plain TensorFlow ops.

        Args:
            ids: dense or ragged ids (one-hot), or a rank-2 RaggedTensor (bags).
            combiner: ``"none" | "sum" | "mean" | "sqrtn"``.
            aux: tensors computed along with the ids (a feature column's empty-example mask). When the
                real pass computes the ids ahead of the forward pass, it takes these from the same copy,
                so the forward pass's own computation of them is left unused.

        Returns:
            The embeddings; ``(embeddings, aux)`` when ``aux`` is given.
        """
        self.claim_weights()
        if self.lookup_fn is not None and not save_context.in_save_context():
            served = self.lookup_fn(self, ids, combiner, tuple(aux or ()))
            if served is not None:
                out, served_aux = served
                return out if aux is None else (out, served_aux)
        out = self.plain_lookup(ids, combiner)
        return out if aux is None else (out, tuple(aux))

    def plain_lookup(self, ids, combiner: str = "none"):
        """The lookup with plain TensorFlow gathers on the rows (vocabulary checked)."""
        return plain_lookup(self._variable, self._offset, self._num_rows, self.table, ids, combiner)

    def request(self, ids, combiner: str = "none") -> LookupRequest:
        return LookupRequest(self.table, ids, combiner, owner=self.layer)


def table_spec(name: str, variable, layer, update_group: int = 0) -> TableSpec:
    """The planner's view of a captured table.

    A table whose Keras L1/L2/L1L2 regularizer adds a gradient to every row
    (dense, as in Keras) gets the optimizer layout ``model_regularized``, so
    it shares a packed variable only with other such tables and the tables
    without one keep their sparse updates (momentum and FTRL tell them apart).
    ``update_group`` (``estimator_updates.update_groups``) keeps tables that the
    plain model_fn updates with different optimizers apart as well.

    Example:
        >>> table_spec("emb_C1", variable, layer).pack_key
        (8, 'float32', 'model')
    """
    spec, _ = regularizer_spec(getattr(layer, "embeddings_regularizer", None))
    layout = "model_regularized" if spec is not None else "model"
    if update_group:
        layout += f"_u{update_group}"
    return TableSpec(name, int(variable.shape[0]), int(variable.shape[1]), "float32", layout)


def _in_weight_regularizer(value: CapturedTable) -> bool:
    """Whether the caller runs inside Keras's regularization loss of ``value`` (``_loss_for_variable(v)``)."""
    return any(f.get("v") is value for f in _frame_locals("_loss_for_variable"))


def _to_tensor(value: CapturedTable, dtype=None, name=None, as_ref=False):
    # The layer's L1/L2 penalty reads its rows (a slice of the packed variable in the real pass: TensorFlow's
    # gradient is dense over the table, as in the plain model); any other use keeps the table unpacked.
    if _in_weight_regularizer(value):
        return value.rows_as(dtype)
    listed = ("embedding_lookup_sparse_impl", "_embedding_lookup_and_transform")
    if value.dense_use is None and any(next(_frame_locals(f), None) is not None for f in listed):
        value.dense_use = (
            "it is looked up through tf.nn.embedding_lookup(_sparse) as a list of tables ([table]): exact, but "
            "unpacked; pass the table itself (tf.nn.embedding_lookup(table, ...)) to pack it"
        )
    if value.dense_use is None:
        value.dense_use = (
            "its embeddings are used as a tensor (tied weights, a one-hot or sparse matmul, an L2 term over "
            "layer.embeddings, ...): exact, but unpacked; for an L2 term use a Keras embeddings_regularizer, which "
            "packs; lookups of SparseTensor ids pack through tf.nn.(safe_)embedding_lookup_sparse or "
            "hybridtf.layers.EmbeddingBag"
        )
    value.claim_weights()  # unpacked: the owning Keras layer's weights list the table's variable, not this view
    return value.rows_as(dtype)


# Before TableView's own conversion (priority 100), which refuses reads inside a recording.
tf.register_tensor_conversion_function(CapturedTable, _to_tensor, priority=90)


@tf.experimental.dispatch_for_api(tf.nn.embedding_lookup, {"params": CapturedTable})
def _embedding_lookup(params, ids, max_norm=None, name=None):
    if max_norm is not None:
        params.dense_use = "embedding_lookup with max_norm clips rows"
        params.claim_weights()
        return tf.nn.embedding_lookup(params.read_value(), ids, max_norm=max_norm, name=name)
    base = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
    if not isinstance(base, tf.Tensor) or base.dtype not in (tf.int32, tf.int64):
        ids = tf.cast(ids, tf.int64)
    return params.lookup(ids, "none")


class EstimatorBagMixin:
    """Per-instance override of a captured ``EmbeddingBag``: its lookup goes through its ``CapturedTable``."""

    @tf.autograph.experimental.do_not_convert
    def _own_lookup(self, inputs):
        table = self.embeddings
        if not isinstance(table, CapturedTable):
            return super()._own_lookup(inputs)
        ids = prepare_ids(inputs, self.combiner, self.name, cast_floats=True)
        out = table.lookup(ids, self.combiner)
        return to_compute_dtype(out, self.compute_dtype)


def capture_bag(layer) -> None:
    """Gives an ``EmbeddingBag`` instance the run-time subclass that looks up through its ``CapturedTable``."""
    if isinstance(layer, EmbeddingBag) and not isinstance(layer, EstimatorBagMixin):
        layer.__class__ = runtime_subclass(EstimatorBagMixin, type(layer))


def settle_collections(graph: tf.Graph) -> None:
    """Puts the packed variable where the model_fn added a table view to a graph collection.

    ``shared_embedding_columns`` (and user code) add a table to a named
    collection; a view there would be written into an exported MetaGraph by
    a name no op has. Each view becomes the variable holding its rows (once).
    """
    for key in graph.get_all_collection_keys():
        items = graph.get_collection_ref(key)
        if not any(isinstance(item, CapturedTable) for item in items):
            continue
        settled = []
        for item in items:
            kept = item.packed_variable if isinstance(item, CapturedTable) else item
            if not any(kept is other for other in settled):
                settled.append(kept)
        items[:] = settled


def reserve_variable_name(name: str | None) -> str:
    """Marks the name a plain variable would get here as used; returns it (its checkpoint key).

    Example:
        >>> with tf.name_scope("emb_C1"):
        ...     reserve_variable_name("embeddings")
        'emb_C1/embeddings'
    """
    with ops.name_scope(name or "Variable", skip_on_eager=False) as scope:
        return ops.name_from_scope_name(scope)


def tables_being_built():
    """The ``hybridtf.embedding.Tables`` whose ``__init__`` is on the stack, or None."""
    return frame_owner("__init__", Tables)
