"""D-interleaving for custom training steps: ``hybridtf.micro_batch_gradients``.

Keras models get micro-batched steps from ``optimize(micro_batches=...)``
(``micro_batch.py``). A ``hybridtf.function`` custom loop or an Estimator
``hybridtf.estimator.model_fn`` writes its own step, so it calls this function
where it would open a ``tf.GradientTape``::

    loss, grads = htf.micro_batch_gradients(loss_fn, (features, labels), variables, micro_batches=4)
    optimizer.apply_gradients(zip(grads, variables))

The batch (any nest of dense, ragged or sparse tensors sharing the batch
dimension) is cut into ``N`` near-equal micro-batches, as in the Keras step:

* ``interleave_from="embedding"``: ``loss_fn(micro_batch)`` runs per
  micro-batch, lookups included. Each micro-batch's lookups are a *segment*
  (``current_segment``): ``hybridtf.function`` and ``hybridtf.estimator``
  compute one packed chain per packed table and segment, at the segment's
  first lookup, so micro-batch ``i + 1``'s lookups and exchange do not wait
  for micro-batch ``i``'s dense compute (Fig. 8 b).
* ``interleave_from="mlp"``: ``features_fn(batch)`` runs once on the whole
  batch (the lookups, one chain per packed table); ``loss_fn(features_i,
  micro_batch_i)`` runs per micro-batch on row slices of its outputs, and the
  concatenated gradients of those outputs go back through ``features_fn``'s
  part once (Fig. 8 a).

Each micro-batch's gradients are summed: dense gradients by addition, sparse
ones (``IndexedSlices``) by concatenation with duplicate rows summed, so a
table still gets one update with distinct rows per step. A dynamic table's
lookups append their distinct rows to its buffer, and its update sums them
per distinct id (``caching/fills.py``; not under Horovod). Exactness: with
``reduction="mean"`` (``loss_fn`` returns the mean over its micro-batch)
micro-batch ``i`` of ``n_i`` rows is weighted ``n_i / B``, which gives the
whole-batch mean's gradient; with ``"sum"`` every micro-batch is weighted 1.
Math that depends on the whole batch (batch statistics, a loss that is not a
sum or mean of per-example terms) cannot be checked inside ``loss_fn``: it is
the caller's to avoid (see the user guide).
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import tensorflow as tf

from hybridtf._src import thread_state
from hybridtf._src.caching import fills
from hybridtf._src.errors import InterleavingError
from hybridtf._src.plan.interleaving import is_count
from hybridtf._src.rewrite import batch_statistics
from hybridtf._src.rewrite.micro_batch import _Accumulator, _sum_grads, split

MODES = ("embedding", "mlp")
REDUCTIONS = ("mean", "sum")

_state = threading.local()
_labels = itertools.count(1)


def current_segment():
    """The micro-batch segment lookups issued now belong to (None outside ``micro_batch_gradients``)."""
    return getattr(_state, "segment", None)


@contextlib.contextmanager
def _segment():
    with thread_state.setting(_state, "segment", next(_labels)):
        yield


def _batch_size(inputs) -> tf.Tensor:
    """The batch dimension shared by every tensor of ``inputs``; checks static sizes agree."""
    flat = [t for t in tf.nest.flatten(inputs, expand_composites=False) if t is not None]
    if not flat:
        raise InterleavingError("micro_batch_gradients: `inputs` holds no tensor to cut into micro-batches.")
    static, sizes = set(), []
    for path_index, t in enumerate(flat):
        if isinstance(t, tf.RaggedTensor):
            sizes.append(tf.cast(t.nrows(), tf.int32))
            continue
        if isinstance(t, tf.SparseTensor):
            if t.shape.rank is not None and t.shape.rank < 1:
                raise InterleavingError(f"micro_batch_gradients: input #{path_index} is a sparse scalar.")
            sizes.append(tf.cast(t.dense_shape[0], tf.int32))
            if t.shape.rank and t.shape[0] is not None:
                static.add(int(t.shape[0]))
            continue
        dense = tf.convert_to_tensor(t)
        if dense.shape.rank == 0:
            raise InterleavingError(
                f"micro_batch_gradients: input #{path_index} (in tf.nest.flatten order) is a scalar, which has no "
                "batch dimension to cut; pass per-step constants to loss_fn by closure, not in `inputs`."
            )
        if dense.shape.rank is not None and dense.shape[0] is not None:
            static.add(int(dense.shape[0]))
        sizes.append(tf.shape(dense)[0])
    if len(static) > 1:
        raise InterleavingError(
            f"micro_batch_gradients: the inputs' batch dimensions differ ({sorted(static)}); every tensor of "
            "`inputs` must have the batch as its first dimension."
        )
    return sizes[0]


def _check_loss(loss, where: str) -> tf.Tensor:
    loss = tf.convert_to_tensor(loss)
    if loss.shape.rank != 0:
        raise InterleavingError(
            f"micro_batch_gradients: {where} returned a tensor of shape {loss.shape}, not a scalar loss; reduce it "
            "(a mean over the micro-batch with reduction='mean', a sum with reduction='sum')."
        )
    if not loss.dtype.is_floating:
        raise InterleavingError(f"micro_batch_gradients: {where} returned a {loss.dtype.name} loss, not a float.")
    return loss


def _same_variables(first, now, i: int) -> None:
    if [id(v) for v in first] != [id(v) for v in now]:
        raise InterleavingError(
            f"micro_batch_gradients: micro-batch {i} used other trainable variables than micro-batch 0 (e.g. "
            "layers created inside loss_fn); create the layers and tables once, outside loss_fn, and call them "
            "inside."
        )


def micro_batch_gradients(
    loss_fn,
    inputs,
    variables=None,
    *,
    micro_batches: int,
    interleave_from: str = "embedding",
    features_fn=None,
    reduction: str = "mean",
):
    """The whole batch's loss and gradients, computed over ``micro_batches`` micro-batches.

    Call it inside ``hybridtf.function`` or a ``hybridtf.estimator.model_fn``
    (or any graph or eager code) instead of a ``tf.GradientTape`` block; apply
    the gradients once.

    Args:
        loss_fn: ``loss_fn(micro_batch)`` ("embedding") or
            ``loss_fn(features, micro_batch)`` ("mlp"); returns a scalar float
            loss over its micro-batch. It must not create variables.
        inputs: the step's batch: a nest of tensors (dense, ragged, sparse)
            whose first dimension is the batch.
        variables: the trainable variables to differentiate (None: those the
            first micro-batch uses, in the order the tape watched them).
        micro_batches: ``N >= 1`` (1: one whole-batch step).
        interleave_from: ``"embedding"`` (everything per micro-batch) or
            ``"mlp"`` (``features_fn`` once, ``loss_fn`` per micro-batch).
        features_fn: ``features_fn(inputs)`` -> a nest of tensors with the batch
            first (the lookups and what needs the whole batch); "mlp" only.
        reduction: ``"mean"`` (``loss_fn`` is a mean over its micro-batch) or
            ``"sum"``.

    Returns:
        ``(loss, grads)``: the whole batch's loss (the weighted sum of the
        micro-batches' losses) and one gradient per variable (None where
        there is none; ``IndexedSlices`` with distinct rows for tables).
        Without ``variables``: ``(loss, grads, variables)``.

    Raises:
        hybridtf.errors.InterleavingError: a bad setting, an input without a
            batch dimension, a non-scalar loss, or a ``loss_fn`` that creates
            variables per call.

    Example:
        >>> w = tf.Variable([[0.5], [-0.25]])
        >>> loss_fn = lambda x: tf.reduce_mean(tf.square(tf.matmul(x, w)))
        >>> x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
        >>> loss, grads = micro_batch_gradients(loss_fn, x, [w], micro_batches=2)
        >>> tf.keras.optimizers.SGD(0.1).apply_gradients(zip(grads, [w]))  # doctest: +SKIP
    """
    if not is_count(micro_batches):
        raise InterleavingError(f"micro_batch_gradients: micro_batches must be an int >= 1, got {micro_batches!r}.")
    micro_batches = int(micro_batches)  # a NumPy integer too
    if interleave_from not in MODES:
        raise InterleavingError(
            f"micro_batch_gradients: interleave_from={interleave_from!r}; use 'embedding' (loss_fn per micro-batch) "
            "or 'mlp' (features_fn on the whole batch, loss_fn per micro-batch on slices of its outputs)."
        )
    if (interleave_from == "mlp") != (features_fn is not None):
        raise InterleavingError(
            "micro_batch_gradients: interleave_from='mlp' needs features_fn (the part that runs once on the whole "
            "batch) and 'embedding' takes none; got "
            f"interleave_from={interleave_from!r} with features_fn={'set' if features_fn else 'None'}."
        )
    if reduction not in REDUCTIONS:
        raise InterleavingError(f"micro_batch_gradients: reduction must be 'mean' or 'sum', got {reduction!r}.")
    given = variables is not None
    variables = list(variables) if given else None
    n = micro_batches
    batch = _batch_size(inputs)
    static = tf.get_static_value(batch)
    if static is not None and static < n:
        raise InterleavingError(
            f"micro_batch_gradients: a batch of {static} rows cannot make {n} micro-batches; use micro_batches <= "
            "the batch size."
        )
    bounds = [(i * batch) // n for i in range(n + 1)]
    if reduction == "sum":
        weights = [tf.constant(1.0)] * n
    else:
        weights = [
            tf.cast(bounds[i + 1] - bounds[i], tf.float32) / tf.cast(tf.maximum(batch, 1), tf.float32) for i in range(n)
        ]
    with fills.accumulating():  # dynamic tables: one buffer fill per micro-batch (caching/fills.py)
        if interleave_from == "mlp":
            loss, grads, variables = _from_features(loss_fn, features_fn, inputs, variables, bounds, weights)
        else:
            loss, grads, variables = _per_micro_batch(loss_fn, inputs, variables, bounds, weights)
    return (loss, grads) if given else (loss, grads, variables)


def _weighted(loss, weight):
    # an empty micro-batch (a batch shorter than micro_batches) has weight 0 and a mean of nothing (NaN): 0
    return tf.math.multiply_no_nan(loss, tf.cast(weight, loss.dtype))


def _per_micro_batch(loss_fn, inputs, variables, bounds, weights):
    total, acc, first = None, None, None
    given = variables is not None
    for i in range(len(bounds) - 1):
        part = split(inputs, bounds[i], bounds[i + 1])
        with (
            _segment(),
            batch_statistics.noted(
                "micro_batch_gradients' loss_fn", i == 0 and len(bounds) > 2, batch_statistics.rows_of(part)
            ),
            tf.GradientTape(watch_accessed_variables=not given) as tape,
        ):
            if given:
                tape.watch(variables)
            loss = _check_loss(loss_fn(part), "loss_fn")
            scaled = _weighted(loss, weights[i])
        if variables is None:
            variables = [v for v in tape.watched_variables() if v.trainable]
        if first is None:
            first = [v for v in tape.watched_variables() if v.trainable]
        else:
            _same_variables(first, [v for v in tape.watched_variables() if v.trainable], i)
        if acc is None:
            acc = _Accumulator(len(variables))
        acc.add(tape.gradient(scaled, variables))
        total = scaled if total is None else total + scaled
    return total, acc.result(), variables


def _from_features(loss_fn, features_fn, inputs, variables, bounds, weights):
    given = variables is not None
    with tf.GradientTape(watch_accessed_variables=not given) as outer:
        if given:
            outer.watch(variables)
        out = features_fn(inputs)
        features = tf.nest.flatten(out, expand_composites=False)
    for f in features:
        if not isinstance(f, tf.Tensor) or f.shape.rank in (None, 0):
            raise InterleavingError(
                "micro_batch_gradients: features_fn must return dense tensors with the batch as their first "
                f"dimension (they are sliced per micro-batch); got {f!r}."
            )
    head_vars = [v for v in outer.watched_variables() if v.trainable]
    total, parts, d_features, first = None, None, [[] for _ in features], None
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        part = split(inputs, lo, hi)
        f_i = [f[lo:hi] for f in features]
        with (
            _segment(),
            batch_statistics.noted(
                "micro_batch_gradients' loss_fn", i == 0 and len(bounds) > 2, batch_statistics.rows_of(f_i)
            ),
            tf.GradientTape(watch_accessed_variables=not given) as tape,  # lookups in loss_fn: own chains
        ):
            tape.watch(f_i)
            if given:
                tape.watch(variables)
            loss = _check_loss(loss_fn(tf.nest.pack_sequence_as(out, f_i), part), "loss_fn")
            scaled = _weighted(loss, weights[i])
        tail_vars = [v for v in tape.watched_variables() if v.trainable]
        if first is None:
            first = tail_vars
            if variables is None:
                seen = {id(v) for v in head_vars}
                variables = head_vars + [v for v in tail_vars if id(v) not in seen]
            parts = [[] for _ in variables]
        else:
            _same_variables(first, tail_vars, i)
        g = tape.gradient(scaled, variables + f_i)
        for acc, gv in zip(parts, g[: len(variables)]):
            if gv is not None:
                acc.append(gv)
        for acc, gf, f in zip(d_features, g[len(variables) :], f_i):
            acc.append(tf.zeros_like(f) if gf is None else tf.convert_to_tensor(gf))
        total = scaled if total is None else total + scaled
    d_full = [tf.concat(p, 0) for p in d_features]
    head_grads = outer.gradient(features, variables, output_gradients=d_full)
    for acc, gv in zip(parts, head_grads):
        if gv is not None:
            acc.append(gv)
    return total, [_sum_grads(p) for p in parts], variables
