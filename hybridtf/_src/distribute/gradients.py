"""The data-parallel half of hybrid parallelism: averaging gradients over the ranks.

Each rank's loss is the mean over its own batch, so the gradient of the
global batch (what one process computes) is the average of the ranks'
gradients:

* dense (replicated) variables: allreduce with ``Average``;
* replicated packed tables (an ``IndexedSlices`` gradient): Horovod's sparse
  allreduce (allgather of rows, values divided by the size);
* shards (model-parallel): the owner has already received every rank's
  gradient rows through the alltoall's backward (summed per row), so they are
  only divided by the size — the same scaling Horovod applies to a
  ``DistributedOptimizer``'s registered local variables;
* the distinct-rows buffers of dynamic tables sharded by id
  (``dynamic_exchange``): like shards, their owners receive every rank's
  rows, so they are only divided by the size.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.distribute.dynamic_exchange import is_rank_local
from hybridtf._src.distribute.world import World, current_world


def reduce_gradients(grads_and_vars, sharded_ids: set, world: World) -> list:
    """Averages ``grads_and_vars`` over the ranks of ``world`` (see the module docstring).

    Args:
        grads_and_vars: ``(gradient, variable)`` pairs of this rank.
        sharded_ids: ``id()`` of the shard variables (model-parallel).
        world: the job.

    Returns:
        The pairs with averaged gradients, in the same order.
    """
    hvd = world.hvd
    out = list(grads_and_vars)
    sharded_ids = set(sharded_ids) | {id(v) for _, v in out if is_rank_local(v)}
    dense = [i for i, (g, v) in enumerate(out) if g is not None and id(v) not in sharded_ids]
    tensors = [i for i in dense if not isinstance(out[i][0], tf.IndexedSlices)]
    if tensors:
        reduced = hvd.grouped_allreduce([out[i][0] for i in tensors], op=hvd.Average, name="hybridtf_dense_grads")
        for i, g in zip(tensors, reduced):
            out[i] = (g, out[i][1])
    for i in dense:
        g, v = out[i]
        if isinstance(g, tf.IndexedSlices):
            out[i] = (hvd.allreduce(g, op=hvd.Average, name=f"hybridtf_sparse_grad_{i}"), v)
    scale = 1.0 / world.size
    for i, (g, v) in enumerate(out):
        if g is not None and id(v) in sharded_ids:
            if isinstance(g, tf.IndexedSlices):
                scaled = tf.IndexedSlices(g.values * tf.constant(scale, g.values.dtype), g.indices, g.dense_shape)
            else:
                scaled = g * tf.constant(scale, g.dtype)
            out[i] = (scaled, v)
    return out


_REDUCED_WALK = 16  # ops walked back from a gradient (a clip or a scale after the average stays within)


_AVERAGING = ("HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather", "HorovodGroupedAllgather")


def already_averaged(grads_and_vars, sharded_ids: set) -> bool:
    """Whether the step averaged these gradients over the ranks itself (a traced step only).

    A custom step averages with ``hybridtf.horovod.DistributedGradientTape`` (or Horovod's own tape)
    or ``average_gradients``: a replicated variable's gradient then comes out of a Horovod allreduce
    (or, for sparse rows, allgather), maybe through the step's own ops (a clip, a scale). The
    optimizer must not average it again (the shards' gradients would be divided by the size twice).
    The shards' own gradients (``sharded_ids``) come out of the lookups' alltoall in any step: looked
    at only when there is no other gradient (``_shards_scaled``).
    """
    dense = [(g, v) for g, v in grads_and_vars if g is not None and not _is_shard(v, sharded_ids)]
    if not dense:  # tables only (a matrix factorization): a tape's average shows as the shards' scaling
        return _shards_scaled(grads_and_vars, sharded_ids)
    return any(_averages(op) for g, _ in dense for op in _ops_behind(g, _REDUCED_WALK))


def _averages(op) -> bool:
    """Whether ``op`` is a Horovod allreduce / allgather, or a ``tf.cond`` holding one (as Horovod's tape builds)."""
    return op.type in _AVERAGING or (op.type in ("If", "StatelessIf") and _branches_average(op))


def _is_shard(variable, sharded_ids: set) -> bool:
    return id(variable) in sharded_ids or is_rank_local(variable)


def _ops_behind(gradient, limit: int, follow=lambda op: True):
    """The ops that produced ``gradient``, walked back from it (at most ``limit``), into the inputs of the ops
    ``follow`` accepts; none for an eager gradient (nothing to read)."""
    tensor = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
    if not hasattr(tensor, "op"):
        return
    seen, stack = set(), [tensor.op]
    while stack and len(seen) < limit:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        yield op
        if follow(op):
            stack.extend(t.op for t in op.inputs)


_SHARD_WALK = 4  # a tape's allgather or allreduce of a shard's gradient is its producer, maybe behind a division


def check_shards_not_reduced(grads_and_vars, sharded_ids: set) -> None:
    """Refuses a traced step whose tape allreduced (or allgathered) a shard's gradient as if it were global.

    A shard's rows are rank-local: its gradient already holds every rank's rows for them (the lookups' alltoall)
    and must only be divided by the number of ranks. Horovod's own ``DistributedGradientTape`` reduces every
    source not registered with ``register_local_source``: the tables then train on other numbers than the plain
    model's, with no error (found by a probe). Only a traced step's gradients show it.

    Raises:
        ValueError: naming the variable and the fix.
    """
    for g, v in grads_and_vars:
        if g is None or not _is_shard(v, sharded_ids):
            continue
        for op in _ops_behind(g, _SHARD_WALK, _not_horovod):
            if _averages(op):
                raise ValueError(
                    f"the gradient of {v.name}, this rank's shard of embedding tables, went through a Horovod "
                    f"{op.type}: the step's tape reduced it over the ranks as if its rows were global, and the "
                    "tables would train unlike the plain model. Its rows are rank-local: use "
                    "htf.horovod.DistributedGradientTape(tape, model) instead of hvd.DistributedGradientTape(tape), "
                    "or register them on Horovod's tape: for v in htf.horovod.local_variables(model): "
                    "tape.register_local_source(v)."
                )


def _shards_scaled(grads_and_vars, sharded_ids: set) -> bool:
    """Whether the shards' gradients were divided by the number of ranks (a traced step only).

    Horovod's tape divides its registered local sources' gradients by the size (``hybridtf.horovod.
    DistributedGradientTape`` is one), and ``average_gradients`` multiplies them by ``1 / size``: in a step
    with no dense gradient that is the only sign that the step averaged. A shard's gradient otherwise ends in
    the lookups' backward ops.
    """
    size = current_world().size
    for g, v in grads_and_vars:
        if g is None or not _is_shard(v, sharded_ids):
            continue
        for op in _ops_behind(g, _SHARD_WALK, _scaling):
            if op.type == "RealDiv" and _constant_is(op.inputs[1], size):
                return True
            if op.type == "Mul" and any(_constant_is(t, 1.0 / size) for t in op.inputs):
                return True
    return False


def _not_horovod(op) -> bool:
    return not op.type.startswith("Horovod")  # the lookups' alltoall ends a shard gradient's walk


def _scaling(op) -> bool:
    return op.type in ("Identity", "RealDiv", "Mul", "Cast")


def _constant_is(tensor, value: float) -> bool:
    if tensor.op.type != "Const":
        return False
    found = tf.get_static_value(tensor)
    return found is not None and found.size == 1 and abs(float(found.reshape(())) - value) <= 1e-6 * abs(value)


def _branches_average(op) -> bool:
    from tensorflow.python.ops import cond_v2

    return any(inner.type in _AVERAGING for branch in cond_v2.get_func_graphs(op) for inner in branch.get_operations())


def check_horovod_reduction(what: str, op=None, scale_local_gradients=True) -> None:
    """Refuses a Horovod reduction the shards cannot follow: anything but ``op=hvd.Average`` with
    ``scale_local_gradients=True``.

    Horovod scales the gradients of registered local variables (the shards) by ``1 / size`` whenever
    ``scale_local_gradients`` is true, whatever ``op`` reduces the dense ones: with ``op=hvd.Sum`` (or
    Adasum) the dense gradients would be summed and the tables' averaged, and with
    ``scale_local_gradients=False`` the tables' summed and the dense ones averaged, unlike the plain model.

    Args:
        what: the caller, named in the error (``"hvd.DistributedOptimizer"``).
        op: the reduction op (``hvd.Average``, ``hvd.Sum``, ``hvd.Adasum``), or None when unknown.
        scale_local_gradients: Horovod's argument of that name.

    Raises:
        ValueError: naming the argument and the fix.
    """
    import horovod.tensorflow as hvd

    problems = []
    if op is not None and op != hvd.Average:
        name = {hvd.Sum: "hvd.Sum", hvd.Adasum: "hvd.Adasum"}.get(op, repr(op))
        problems.append(f"op={name}")
    if scale_local_gradients is not True:
        problems.append(f"scale_local_gradients={scale_local_gradients!r}")
    if problems:
        raise ValueError(
            f"{what} with {' and '.join(problems)}: hybridtf's embedding shards are Horovod local variables, whose "
            "gradients Horovod divides by the number of ranks whatever op reduces the dense gradients, so the tables "
            "and the dense layers would be reduced differently and train unlike the plain model. Use op=hvd.Average "
            "(the default) and scale_local_gradients=True; for a sum over the ranks, multiply the loss by hvd.size()."
        )


def horovod_reduction_of(distributed_optimizer):
    """``(op, scale_local_gradients)`` of a ``hvd.DistributedOptimizer`` (Keras or TF1); op None when unknown.

    Horovod keeps ``op`` only in the closure of the optimizer's allreduce function (wrapped in a
    ``tf.function`` in eager mode).
    """
    fn = getattr(distributed_optimizer, "_allreduce_grads", None)
    fn = getattr(fn, "python_function", fn)
    code, closure = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    op = None
    if code is not None and closure is not None:
        cells = dict(zip(code.co_freevars, closure))
        if "op" in cells:
            op = cells["op"].cell_contents
    return op, getattr(distributed_optimizer, "scale_local_gradients", True)
