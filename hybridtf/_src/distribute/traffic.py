"""Bytes each rank sends per training step under hybrid parallelism, measured on a sample batch.

The optimized model's lookups are recorded on a global sample batch, which
is split into ``num_ranks`` equal row ranges (what each rank would train on).
For every packed table and rank, the packed ids are deduplicated and
assigned to their owners with the table's ``ShardLayout`` — the same
UniquePartition a real step runs — and the exchange is counted:

* alltoall, per rank: its unique ids going to other owners (int64), the rows
  it serves to other ranks (forward), and its gradient rows going back to
  their owners (backward); ids a rank owns itself are not sent;
* allreduce, per rank: the ring allreduce of the dense gradients
  (``2 (n - 1) / n`` of their bytes), the allgather of replicated tables'
  sparse gradients, and the per-step agreement on invalid ids.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hybridtf._src.capture import context
from hybridtf._src.capture.ids import sparse_bags
from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.distribute.layout import ShardLayout
from hybridtf._src.errors import PlanKeyError

_ID_BYTES = 8


def _rows(ids, lo, hi) -> np.ndarray:
    if isinstance(ids, tf.SparseTensor):
        ids = sparse_bags(ids)
    part = ids[lo:hi]
    if isinstance(part, tf.RaggedTensor):
        part = part.flat_values
    return np.asarray(part).ravel().astype(np.int64)


def _owners(unique: np.ndarray, layout: ShardLayout) -> np.ndarray:
    if layout.strategy == "mod":
        return unique % layout.size
    return np.searchsorted(layout.bounds, unique, side="right") - 1


def _recorded_requests(model, features):
    from hybridtf._src.integrations.keras_model import _HybridModelMixin
    from hybridtf._src.integrations.keras_record import discarding_losses

    features = tf.nest.map_structure(  # NumPy arrays as the model's call would get them from Keras
        lambda x: x if isinstance(x, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)) else tf.convert_to_tensor(x),
        features,
    )
    call = super(_HybridModelMixin, model).call if isinstance(model, _HybridModelMixin) else model.call
    kwargs = {"training": False} if getattr(model, "_expects_training_arg", True) else {}  # as Keras calls it
    with discarding_losses(model), context.recording() as rec:
        call(features, **kwargs)
    return rec.requests


def estimate_traffic(model, features, num_ranks: int) -> dict:
    """Per-rank bytes sent per step by alltoall and by allreduce, for ``model`` trained on ``num_ranks`` ranks.

    Args:
        model: a model returned by ``hybridtf.keras.optimize``.
        features: one global batch of the model's inputs (eager tensors/arrays);
            its batch size must be divisible by ``num_ranks``.
        num_ranks: the number of ranks to estimate for (>= 2).

    Returns:
        A dict: ``num_ranks``, ``batch_per_rank``, ``per_rank`` (a list of
        ``{"rank", "alltoall_bytes", "allreduce_bytes"}``),
        ``dense_gradient_bytes`` and ``tables`` (per packed table: placement
        and the unique ids of each rank's batch).

    Raises:
        ValueError: ``num_ranks < 2`` or a batch size not divisible by it.

    Example:
        >>> t = estimate_traffic(model, features, 2)
        >>> t["per_rank"][0]["alltoall_bytes"] > 0
        True
    """
    if num_ranks < 2:
        raise ValueError(f"num_ranks must be >= 2 to estimate hybrid-parallel traffic, got {num_ranks}.")
    runtime = getattr(model, "_htf_runtime", None)  # None: nothing static packed (dynamic stores only)
    plan = model.hybridtf_plan
    requests = _recorded_requests(model, features)
    if not requests:
        raise ValueError("the model issued no packed lookups on this batch.")
    batch = int(tf.nest.flatten(requests[0].ids, expand_composites=False)[0].shape[0])
    if batch % num_ranks:
        raise ValueError(f"the sample batch has {batch} rows, not divisible by num_ranks={num_ranks}.")
    per = batch // num_ranks
    sent_a2a = np.zeros(num_ranks, np.int64)
    sent_ar = np.zeros(num_ranks, np.int64)
    tables = {}
    by_packed: dict[str, list] = {}
    dynamic: dict[str, list] = {}  # HybridHash store -> its lookups (sharded by id, not by row)
    stores = {m: g.name for g in getattr(model, "hybridtf_dynamic_plan", None) or () for m in g.members}
    for req in requests:
        try:
            name, offset = plan.location(req.table)
        except PlanKeyError:  # a DynamicEmbedding: no rows in the static plan
            dynamic.setdefault(stores.get(req.table, req.table), []).append(req)
            continue
        by_packed.setdefault(name, []).append((req, offset))
    for pt in plan.packed_tables:
        reqs = by_packed.get(pt.name)
        if not reqs:
            continue
        row_bytes = pt.dim * np.dtype(pt.dtype).itemsize
        placement = plan.placement(pt.name, num_ranks)
        layout = ShardLayout(pt.num_rows, num_ranks, plan.shard_strategy)
        uniques = []
        asks = np.zeros([num_ranks, num_ranks], np.int64)  # asks[r, o]: unique ids of rank r owned by o
        for r in range(num_ranks):
            packed = np.concatenate([_rows(req.ids, r * per, (r + 1) * per) + offset for req, offset in reqs])
            unique = np.unique(packed)
            uniques.append(int(unique.size))
            asks[r] = np.bincount(_owners(unique, layout), minlength=num_ranks)
        for r in range(num_ranks):
            if placement == "sharded":
                to_others = int(asks[r].sum() - asks[r, r])
                served = int(asks[:, r].sum() - asks[r, r])
                sent_a2a[r] += to_others * (_ID_BYTES + row_bytes) + served * row_bytes
            else:  # replicated: sparse gradient allgathered to every other rank
                sent_ar[r] += (num_ranks - 1) * uniques[r] * (_ID_BYTES + row_bytes)
        tables[pt.name] = {"placement": placement, "unique_ids_per_rank": uniques}
    for store, reqs in dynamic.items():
        # (id, member, count) triples go to each id's owner (dynamic_exchange.owner_of), rows come back, and
        # backward the gradient rows go to the owners again.
        row_bytes = int(getattr(reqs[0].owner, "output_dim", 0)) * 4
        member = {t: i for i, t in enumerate(dict.fromkeys(q.table for q in reqs))}
        uniques = []
        for r in range(num_ranks):
            parts = []
            for q in reqs:
                ids = _rows(q.ids, r * per, (r + 1) * per)
                parts.append(np.stack([ids, np.full_like(ids, member[q.table])], 1))
            pairs = np.unique(np.concatenate(parts), axis=0)  # distinct (id, member) pairs
            uniques.append(len(pairs))
            owners = dynamic_exchange.owner_of_numpy(pairs[:, 0], num_ranks) if len(pairs) else np.zeros(0, int)
            to_others = int(np.sum(owners != r))
            sent_a2a[r] += to_others * (3 * _ID_BYTES + row_bytes)
            for o in range(num_ranks):
                if o != r:
                    sent_a2a[o] += int(np.sum(owners == o)) * row_bytes  # the owner serves the rows
        tables[store] = {"placement": "sharded by id (dynamic)", "unique_ids_per_rank": uniques}
    table_vars = {id(v) for v in runtime.storage.packed.values()} if runtime is not None else set()
    dense = sum(
        int(np.prod(v.shape)) * v.dtype.size
        for v in model.trainable_variables
        # a DynamicEmbedding's distinct-rows buffer ([None, dim]) is its table's, exchanged above
        if id(v) not in table_vars and getattr(v, "_htf_dynamic_embedding", None) is None
    )
    ring = round(2 * (num_ranks - 1) / num_ranks * dense)
    sent_ar += ring + round(2 * (num_ranks - 1) / num_ranks * len(requests) * _ID_BYTES)
    return {
        "num_ranks": num_ranks,
        "batch_per_rank": per,
        "per_rank": [
            {"rank": r, "alltoall_bytes": int(sent_a2a[r]), "allreduce_bytes": int(sent_ar[r])}
            for r in range(num_ranks)
        ],
        "dense_gradient_bytes": int(dense),
        "tables": tables,
    }
