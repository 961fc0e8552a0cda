"""D-interleaving (PICASSO §III-C, Eq. 2): a training step over N micro-batches, one update.

The step cuts the batch into ``N`` near-equal micro-batches (sizes differ by at
most one; the batch size may be dynamic), runs forward and backward on each,
accumulates the gradients and applies them once:

* ``interleave_from="embedding"``: the whole forward (lookup chains included)
  runs per micro-batch (Fig. 8 b): micro-batch ``i``'s dense compute and
  ``i + 1``'s lookups are independent, so TensorFlow may overlap them.
* ``interleave_from="<layer name>"`` (functional models,
  ``micro_batch_split.py``): the model is cut at that layer; the layers it
  depends on and the lookups run once on the whole batch, the rest per
  micro-batch.
* ``interleave_from="mlp"``: the lookup chains run once on the whole batch;
  the layers after them (interaction, MLP, loss) run per micro-batch on row
  slices of the lookups' outputs (Fig. 8 a), which bounds the peak memory of
  the MLP's feature maps. The micro-batches' gradients with respect to the
  lookup outputs are concatenated and sent back through the chains once. The
  slices are not stitched fields, so the dense fusions do not apply.
* ``interleave_from="mlp_fused"``: the same, but each micro-batch's lookups
  are a StitchCombine of the chain's gathered rows with its slice of the
  inverse index (``micro_batch_stitch.py``), so StitchConcat and
  StitchConcatMatMul still apply; the gradients are summed at the gathered
  rows. Faster for small MLPs; for a wide first layer the fused matmul's
  per-chunk partial sums (up to 8 x micro-batch x units) cost more memory
  than the micro-batches save (W&D, batch 65,536, MLP 1024-512-256: above
  the whole batch's peak), so it is not the default.

Each packed table still gets one update with distinct rows per step (its
micro-batch gradients are concatenated and their duplicate rows summed, so the
fused ``SparseApply*`` applies), each dense variable one update.

Exactness. Micro-batch ``i`` with ``n_i`` of the batch's ``B`` examples is
weighted ``n_i / B`` when the compiled losses are means over the batch
(Keras's default ``SUM_OVER_BATCH_SIZE``; sample weights included, since Keras
divides by the number of examples, not by the weights' sum): the step's
gradient is then the whole-batch gradient up to float summation order. With
``reduction="sum"`` losses every micro-batch is weighted 1 (gradients exact;
the "loss" metric then reports the mean of the micro-batches' sums), and keeps
``1 / N`` of the model's own losses (``step_loss``), so weight regularizers
count once per step; losses mixing sums and means over the outputs are
refused. Losses added with ``add_loss`` are weighted like the compiled loss:
exact for batch-independent terms (weight regularizers). A
``LossScaleOptimizer``'s scale is applied to each micro-batch's loss and taken
off the summed gradients. Layers whose training math
depends on the whole batch are refused (``check_model``): BatchNormalization
(batch statistics) and activity regularizers (sums over the batch).
"""

from __future__ import annotations

import tensorflow as tf
from keras.src.engine import data_adapter

from hybridtf._src.caching import fills
from hybridtf._src.capture import context
from hybridtf._src.errors import InterleavingError
from hybridtf._src.integrations.keras_horovod_classes import is_horovod_distributed
from hybridtf._src.rewrite import batch_statistics, micro_batch_split
from hybridtf._src.rewrite.micro_batch_loss import micro_batch_loss, step_loss, sums_over_batch, unscaled_gradients
from hybridtf._src.rewrite.micro_batch_stitch import MicroBatchStitch
from hybridtf._src.rewrite.runtime import lookup_all

MODES = ("embedding", "mlp", "mlp_fused")


# A model or a setting that micro-batching cannot run with the whole batch's math.
MicroBatchError = InterleavingError


def check_model(model, num_micro_batches: int, interleave_from: str) -> None:
    """Refuses what micro-batches would silently change.

    Raises:
        MicroBatchError: a BatchNormalization layer (training uses batch
            statistics), an activity regularizer (a sum over the batch), a
            DynamicEmbedding with a capacity or under Horovod, a model that overrides
            ``train_step``, or an unknown mode.
    """
    if not isinstance(interleave_from, str) or not interleave_from:
        raise MicroBatchError(
            f"interleave_from={interleave_from!r}: hybridtf micro-batches from 'embedding' (the whole forward per "
            "micro-batch), 'mlp' (lookups once on the whole batch, the layers after them per micro-batch; "
            "'mlp_fused' keeps the dense fusions) or the name of a layer of a functional model (that layer and "
            "what follows it per micro-batch)."
        )
    if interleave_from not in MODES:
        object.__setattr__(model, "_htf_split", micro_batch_split.split_model(model, interleave_from))
    if num_micro_batches == 1:
        return
    if overrides_train_step(model):
        raise MicroBatchError(
            f"{type(model).__name__} overrides train_step; hybridtf's micro-batched step replaces Keras's train_step "
            "and would skip yours. Use micro_batches=1, or micro-batch inside your own train_step."
        )
    check_layers(model)


def overrides_train_step(model) -> bool:
    """Whether the model's class (or a class of the user's between it and Keras) defines ``train_step``;
    hybridtf's own run-time classes (e.g. the Horovod collective watchdog's) do not count."""
    for cls in type(model).__mro__:
        step = cls.__dict__.get("train_step")
        if step is None:
            continue
        module = getattr(step, "__module__", "") or ""
        if module.startswith("hybridtf."):
            continue
        return cls is not tf.keras.Model
    return False


def _inference_only(layer) -> bool:
    """Whether every call of ``layer`` in the functional graphs it belongs to passes ``training=False``
    (it then normalizes with its moving statistics, per example). A layer called from Python code (a
    subclassed model's ``call``) has no such record and counts as training."""
    nodes = getattr(layer, "_inbound_nodes", None) or []
    return bool(nodes) and all((getattr(node, "call_kwargs", None) or {}).get("training") is False for node in nodes)


def _batch_norm_classes() -> tuple:
    """Keras's batch normalization classes (``SyncBatchNormalization`` derives from their common base only)."""
    try:
        from keras.src.layers.normalization.batch_normalization import BatchNormalizationBase
    except ImportError:  # another Keras layout
        return (tf.keras.layers.BatchNormalization,)
    return (tf.keras.layers.BatchNormalization, BatchNormalizationBase)


_BATCH_NORMS = _batch_norm_classes()


def check_layers(model) -> None:
    """Refuses layers whose training math depends on the whole batch (checked again when a step is traced: a layer
    may have been unfrozen since ``optimize``).

    Raises:
        MicroBatchError: a trainable BatchNormalization, an activity regularizer, a DynamicEmbedding with
            a capacity (eviction) or, under Horovod, any DynamicEmbedding (sharded dynamic tables).
    """
    from hybridtf._src.caching.fills import CAPACITY_MESSAGE, SHARDED_MESSAGE
    from hybridtf._src.caching.layer import DynamicEmbedding
    from hybridtf._src.distribute.world import current_world

    for layer, where in _layers_with_paths(model):
        if isinstance(layer, DynamicEmbedding) and current_world().distributed:
            raise MicroBatchError(SHARDED_MESSAGE.format(name=repr(layer.name)))
        if isinstance(layer, DynamicEmbedding) and layer._table_config.capacity:
            raise MicroBatchError(CAPACITY_MESSAGE.format(name=repr(layer.name)))
        if isinstance(layer, _BATCH_NORMS) and layer.trainable and not _inference_only(layer):
            raise MicroBatchError(
                f"layer {where} is a BatchNormalization: in training it normalizes with the statistics of "
                "the batch it sees, so micro-batches would compute different math. Use micro_batches=1, freeze the "
                "layer (trainable=False) or use a per-example normalization (LayerNormalization)."
            )
        if getattr(layer, "activity_regularizer", None) is not None:
            raise MicroBatchError(
                f"layer {where} has an activity regularizer, a sum over the batch that micro-batches would "
                "split differently. Use micro_batches=1 or remove the activity regularizer."
            )


def _layers_with_paths(model):
    """Every layer inside ``model`` (each once) with where it is: ``'outer' > 'inner' > 'layer'`` when nested, so
    a layer a library built inside its own (a Dice activation's BatchNormalization) is found by its owners' names."""
    seen = set()

    def walk(owner, path):
        for child in owner._flatten_layers(include_self=False, recursive=False):
            if id(child) in seen:
                continue
            seen.add(id(child))
            names = (*path, repr(child.name))
            yield child, " > ".join(names)
            yield from walk(child, names)

    return list(walk(model, ()))


def _batch_size(x) -> tf.Tensor:
    for t in tf.nest.flatten(x, expand_composites=False):
        if isinstance(t, tf.RaggedTensor):
            return tf.cast(t.nrows(), tf.int32)
        if isinstance(t, tf.SparseTensor):
            return tf.cast(t.dense_shape[0], tf.int32)
        if t is not None:
            return tf.shape(t)[0]
    raise MicroBatchError("micro-batching needs at least one input tensor with a batch dimension.")


def _slice(t, lo, hi):
    if t is None:
        return None
    if isinstance(t, tf.SparseTensor):
        shape = tf.concat([[tf.cast(hi - lo, tf.int64)], t.dense_shape[1:]], 0)
        start = tf.concat([[tf.cast(lo, tf.int64)], tf.zeros_like(t.dense_shape[1:])], 0)
        return tf.sparse.slice(t, start, shape)
    return t[lo:hi]


def split(structure, lo, hi):
    """Rows ``[lo, hi)`` of every tensor in ``structure`` (dense, ragged or sparse; None kept)."""
    return tf.nest.map_structure(lambda t: _slice(t, lo, hi), structure, expand_composites=False)


def loss_weights(model, sizes, batch) -> list[tf.Tensor]:
    """Weight of each micro-batch's loss: ``n_i / B`` for mean losses, 1 for ``reduction="sum"``."""
    if sums_over_batch(model):
        return [tf.constant(1.0) for _ in sizes]
    b = tf.cast(batch, tf.float32)
    return [tf.cast(n, tf.float32) / tf.maximum(b, 1.0) for n in sizes]


class _Accumulator:
    """Sums gradients over micro-batches: dense by addition, IndexedSlices by concatenation."""

    def __init__(self, n: int):
        self.parts: list[list] = [[] for _ in range(n)]

    def add(self, grads) -> None:
        for parts, g in zip(self.parts, grads):
            if g is not None:
                parts.append(g)

    def result(self) -> list:
        return [_sum_grads(parts) for parts in self.parts]


def _sum_grads(parts):
    if not parts:
        return None
    if all(isinstance(g, tf.IndexedSlices) for g in parts):
        if len(parts) == 1:
            return parts[0]
        indices = tf.concat([g.indices for g in parts], 0)
        values = tf.concat([g.values for g in parts], 0)
        return distinct_rows(tf.IndexedSlices(values, indices, parts[0].dense_shape))
    total = None
    for part in parts:
        g = tf.convert_to_tensor(part)
        total = g if total is None else total + g
    return total


def distinct_rows(grad: tf.IndexedSlices) -> tf.IndexedSlices:
    """The same gradient with each row once (duplicates summed), rows in ascending order."""
    unique, inverse = tf.unique(grad.indices)
    order = tf.argsort(unique)
    rank = tf.math.invert_permutation(order)
    values = tf.math.unsorted_segment_sum(grad.values, tf.gather(rank, inverse), tf.shape(unique)[0])
    return tf.IndexedSlices(values, tf.gather(unique, order), grad.dense_shape)


def _concat_structures(structures):
    return tf.nest.map_structure(lambda *ts: tf.concat(ts, 0), *structures)


def micro_batched_train_step(model, data, num_micro_batches: int, interleave_from: str):
    """Keras ``train_step`` over ``num_micro_batches`` micro-batches with one optimizer update.

    Args:
        model: an optimized Keras model (compiled).
        data: the step's batch as Keras passes it (``x``, ``(x, y)`` or
            ``(x, y, sample_weight)``).
        num_micro_batches: ``N >= 2``.
        interleave_from: ``"embedding"`` or ``"mlp"``.

    Returns:
        The metrics dict, computed once on the whole batch's predictions.
    """
    with fills.accumulating():  # dynamic tables: one buffer fill per micro-batch, one update (caching/fills.py)
        return _micro_batched_step(model, data, num_micro_batches, interleave_from)


def _micro_batched_step(model, data, num_micro_batches: int, interleave_from: str):
    x, y, sample_weight = data_adapter.unpack_x_y_sample_weight(data)
    n = num_micro_batches
    batch = _batch_size(x)
    bounds = [(i * batch) // n for i in range(n + 1)]
    sizes = [bounds[i + 1] - bounds[i] for i in range(n)]
    weights = loss_weights(model, sizes, batch)
    variables = model.trainable_variables
    if interleave_from in ("mlp", "mlp_fused"):
        grads, y_pred = _from_mlp(
            model, x, y, sample_weight, bounds, weights, variables, interleave_from == "mlp_fused"
        )
    elif interleave_from != "embedding":  # a layer name: the model cut at that layer
        parts, preds = micro_batch_split.from_layer_step(model, x, y, sample_weight, bounds, weights, variables, split)
        grads, y_pred = [_sum_grads(p) for p in parts], _concat_structures(preds)
    else:
        acc = _Accumulator(len(variables))
        preds = []
        for i in range(n):
            xi, yi, swi = split((x, y, sample_weight), bounds[i], bounds[i + 1])
            with (
                batch_statistics.noted(f"model {model.name!r}", i == 0, batch_statistics.rows_of(xi)),
                tf.GradientTape() as tape,
            ):
                pred = model(xi, training=True)
                loss = micro_batch_loss(model, xi, yi, pred, swi)
                scaled = step_loss(model, loss, weights[i], n)
            model._validate_target_and_loss(yi, loss)
            acc.add(tape.gradient(scaled, variables))
            preds.append(pred)
        grads, y_pred = acc.result(), _concat_structures(preds)
    grads = unscaled_gradients(model, grads)
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    optimizer = model.optimizer
    if is_horovod_distributed(optimizer):  # it averages in minimize's gradient step, which this step replaces
        reduced = optimizer._allreduce([g for g, _ in pairs], [v for _, v in pairs])
        pairs = list(zip(reduced, [v for _, v in pairs]))
    optimizer.apply_gradients(pairs)
    return model.compute_metrics(x, y, y_pred, sample_weight)


def _leaf(output):
    """The tensor a lookup output's gradient is taken at: a ragged output's flat values, else the output."""
    return output.flat_values if isinstance(output, tf.RaggedTensor) else output


def _from_mlp(model, x, y, sample_weight, bounds, weights, variables, fused):
    requests = model._htf_whole_batch_requests(x)
    # the packed static variables and the packed dynamic stores' step buffers: looked up once, here
    tables = model._htf_table_variable_ids | {id(g.rows_buffer) for g in model._htf_dynamic.groups}
    table_vars = [v for v in variables if id(v) in tables]
    dense_vars = [v for v in variables if id(v) not in tables]
    from hybridtf._src.rewrite.packed_dynamic import training_lookups

    with tf.GradientTape() as lookup_tape, training_lookups():  # dynamic stores: find-or-insert, fill the buffer
        outputs = lookup_all(requests)
    # Lookups that come from a StitchCombine get one per micro-batch (the fusions still apply; the
    # gradient is taken at the chain's gathered rows); others are sliced (gradient at the outputs).
    stitch = MicroBatchStitch(outputs, bounds[-1], enabled=fused)
    sliced = [i for i in range(len(outputs)) if i not in set(stitch.restitched)]
    acc = _Accumulator(len(dense_vars))
    d_rows: list = [None] * len(stitch.rows)
    out_grads: list[list] = [[] for _ in sliced]
    preds = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        xi, yi, swi = split((x, y, sample_weight), lo, hi)
        with (
            batch_statistics.noted(f"model {model.name!r}", i == 0, batch_statistics.rows_of(xi)),
            tf.GradientTape() as tape,
        ):
            tape.watch(stitch.rows)
            out_i = stitch.micro_batch(lo, hi)
            sliced_i = [_leaf(out_i[j]) for j in sliced]  # a ragged output (Embedding on ragged ids): its values
            tape.watch(sliced_i)
            with context.replaying(requests, out_i):
                pred = model(xi, training=True)
            loss = micro_batch_loss(model, xi, yi, pred, swi)
            scaled = step_loss(model, loss, weights[i], len(bounds) - 1)
        model._validate_target_and_loss(yi, loss)
        g = tape.gradient(scaled, dense_vars + stitch.rows + sliced_i)
        acc.add(g[: len(dense_vars)])
        for k, (got, r) in enumerate(zip(g[len(dense_vars) : len(dense_vars) + len(stitch.rows)], stitch.rows)):
            part = tf.zeros_like(r) if got is None else tf.convert_to_tensor(got)
            d_rows[k] = part if d_rows[k] is None else d_rows[k] + part
        for parts, gi, oi in zip(out_grads, g[len(dense_vars) + len(stitch.rows) :], sliced_i):
            parts.append(tf.zeros_like(oi) if gi is None else tf.convert_to_tensor(gi))
        preds.append(pred)
    targets = stitch.rows + [_leaf(outputs[j]) for j in sliced]  # micro-batches' values concatenate to these
    sent = d_rows + [tf.concat(parts, 0) for parts in out_grads]
    table_grads = lookup_tape.gradient(targets, table_vars, output_gradients=sent) if targets else []
    dense_grads = acc.result()
    by_id = {id(v): g for v, g in zip(dense_vars, dense_grads)}
    by_id.update({id(v): g for v, g in zip(table_vars, table_grads)})
    return [by_id.get(id(v)) for v in variables], _concat_structures(preds)
