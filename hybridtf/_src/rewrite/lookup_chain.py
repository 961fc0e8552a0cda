"""The packed lookup chain that replaces N lookups of one packed table.

    ids of N fields --PackIds--> packed ids --UniquePartition--> unique ids, inverse
        --GatherRows(packed variable)--> rows --StitchCombine--> N outputs

Backward, TensorFlow's gradient of the gather gives one IndexedSlices per
packed table whose indices are already distinct (one row per unique id), and
StitchCombineGrad sums every field's output gradients into those rows in one
op; the optimizer then applies one sparse update per packed table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import tensorflow as tf

from hybridtf._src.capture.context import LookupRequest
from hybridtf._src.capture.ids import sparse_bags
from hybridtf._src.run import gradient_arrivals
from hybridtf._src.run.gather_rows import gather_variable_rows
from hybridtf._src.run.pack_ids import pack_ids
from hybridtf._src.run.stitch_combine import stitch_combine
from hybridtf._src.run.unique_partition import unique_partition
from hybridtf._src.run.unique_subset import unique_subset


def _bag_parts(ids):
    """(flat ids, row lengths) of a rank-2 RaggedTensor or SparseTensor."""
    if isinstance(ids, tf.SparseTensor):
        ids = sparse_bags(ids)
    if ids.ragged_rank != 1 or ids.shape.rank != 2:
        raise ValueError(f"multi-hot ids must be a rank-2 RaggedTensor/SparseTensor [batch, None], got {ids.shape}.")
    return ids.flat_values, ids.row_lengths()


@dataclasses.dataclass
class PackedRequests:
    """The lookups of one packed table with their ids packed (the first stage of the chain)."""

    packed: tf.Tensor | None  # int64 ids in the packed table's row space (None: derived from another chain)
    sizes: tf.Tensor  # int64 [fields], ids per field
    invalid: tf.Tensor | None  # int64 [fields] out-of-vocabulary counts (on_invalid="count")
    combiners: list
    shapes: list  # per request: the ids (one-hot) to restore the output shape, or None (bags)
    field_segments: tf.Tensor | None
    segment_lengths: tf.Tensor | None
    vocabularies: list  # (table, num_rows) per request


def _request_parts(requests: Sequence[LookupRequest]):
    """Per request: flat ids (the positions), output shape source, combiner, and the bags' lengths."""
    flat, shapes, combiners, bag_lengths, segments = [], [], [], [], []
    for req in requests:
        combiners.append(req.combiner)
        if req.combiner == "none":
            is_ragged = isinstance(req.ids, tf.RaggedTensor)
            flat.append(req.ids.flat_values if is_ragged else req.ids)
            shapes.append(req.ids)
            segments.append(None)  # filled with the field's size
        else:
            values, row_lengths = _bag_parts(req.ids)
            flat.append(values)
            shapes.append(None)
            bag_lengths.append(row_lengths)
            segments.append(tf.size(row_lengths, out_type=tf.int64))
    return flat, shapes, combiners, bag_lengths, segments


def _prepared(packed, sizes, invalid, members, requests, shapes, combiners, bag_lengths, segments) -> PackedRequests:
    if bag_lengths:
        field_segments = tf.stack([sizes[i] if s is None else s for i, s in enumerate(segments)])
        seg_lengths = tf.concat(bag_lengths, axis=0) if len(bag_lengths) > 1 else bag_lengths[0]
    else:
        field_segments, seg_lengths = None, None
    return PackedRequests(
        packed,
        sizes,
        invalid,
        combiners,
        shapes,
        field_segments,
        seg_lengths,
        [(r.table, members[r.table][1]) for r in requests],
    )


def _check_members(members, requests) -> None:
    for req in requests:
        if req.table not in members:
            raise KeyError(f"table {req.table!r} is not a member of this packed table ({', '.join(members)}).")


def pack_requests(
    members: Mapping[str, tuple[int, int]], requests: Sequence[LookupRequest], on_invalid: str = "error"
) -> PackedRequests:
    """PackIds of ``requests`` (all of one packed table whose members are ``members``)."""
    _check_members(members, requests)
    flat, shapes, combiners, bag_lengths, segments = _request_parts(requests)
    out = pack_ids(
        flat,
        [members[r.table][0] for r in requests],
        [members[r.table][1] for r in requests],
        [r.table for r in requests],
        on_invalid=on_invalid,
    )
    invalid = out[2] if on_invalid == "count" else None
    return _prepared(out[0], out[1], invalid, members, requests, shapes, combiners, bag_lengths, segments)


def positions_key(ids):
    """What identifies a request's positions (its flat ids): the same key means the same ids, in the same order."""
    if isinstance(ids, tf.RaggedTensor):
        return ("flat", ids.flat_values.ref())
    if isinstance(ids, tf.SparseTensor):
        return ("sparse", ids.values.ref(), ids.indices.ref())
    if isinstance(ids, tf.Tensor):
        return ("flat", ids.ref())
    return None


@dataclasses.dataclass
class UniqueSource:
    """How a packed table's chain reuses another one's UniquePartition (``unique_subset``).

    Attributes:
        source: name of the packed table whose chain computes the unique ids.
        fields: per request of this table, the index of the source request with the same ids.
    """

    source: str
    fields: list[int]


def derived_requests(
    members: Mapping[str, tuple[int, int]],
    requests: Sequence[LookupRequest],
    source_members: Mapping[str, tuple[int, int]],
    source_requests: Sequence[LookupRequest],
    source_prepared: PackedRequests,
    source_unique,
    fields: Sequence[int],
):
    """(PackedRequests, unique result) of ``requests`` from the chain of the table they share ids with.

    Equal to ``pack_requests`` + ``unique_partition(..., 1, sort_ids=True)``
    of ``requests``, bit for bit, without reading the ids again: the source's
    ids were validated against the same vocabularies.
    """
    _check_members(members, requests)
    _, shapes, combiners, bag_lengths, segments = _request_parts(requests)
    unique, sizes = unique_subset(
        source_unique,
        source_prepared.sizes,
        list(fields),
        [source_members[source_requests[a].table][0] for a in fields],
        [members[r.table][0] for r in requests],
        [members[r.table][1] for r in requests],
    )
    return _prepared(None, sizes, None, members, requests, shapes, combiners, bag_lengths, segments), unique


def stitch_outputs(prepared: PackedRequests, rows: tf.Tensor, inverse: tf.Tensor, dim: int) -> list[tf.Tensor]:
    """StitchCombine of the unique ids' ``rows`` into one output per request (the last stage).

    A one-hot request whose ids have rank >= 2 with at most one unknown dimension (Keras's
    ``[B, 1]`` inputs) gets its output in its final shape from the kernel (``id_shapes``),
    not through a reshape per request.
    """
    id_shapes = [_kernel_shape(ids) for ids in prepared.shapes]
    gradient_arrivals.register_fields(rows, [table for table, _ in prepared.vocabularies])
    outs = stitch_combine(
        rows,
        inverse,
        prepared.sizes,
        prepared.combiners,
        field_segments=prepared.field_segments,
        segment_lengths=prepared.segment_lengths,
        id_shapes=id_shapes,
    )
    return [
        out if shape is not None else _reshape(out, ids, dim)
        for out, ids, shape in zip(outs, prepared.shapes, id_shapes)
    ]


def _kernel_shape(ids):
    """The shape StitchCombine gives a one-hot request's output (its ids' static shape), or None."""
    if not isinstance(ids, tf.Tensor) or ids.shape.rank is None or ids.shape.rank < 2:
        return None
    if sum(d is None for d in ids.shape.as_list()) > 1:
        return None
    return ids.shape


def packed_lookup(
    variable: tf.Variable,
    members: Mapping[str, tuple[int, int]],
    requests: Sequence[LookupRequest],
    name: str | None = None,
) -> list[tf.Tensor]:
    """Runs ``requests`` against one packed table (all rows in ``variable``) with one fused chain.

    Args:
        variable: the packed table, ``[rows, dim]``.
        members: table name -> ``(row_offset, num_rows)`` inside ``variable``.
        requests: the lookups; each names a member table.
        name: optional name scope.

    Returns:
        One output per request: ``ids.shape + [dim]`` for one-hot ids (a
        RaggedTensor for ragged ids, like a Keras Embedding), ``[batch, dim]``
        for multi-hot bags.
    """
    if not requests:
        return []
    with tf.name_scope(name or "packed_lookup"):
        prepared = pack_requests(members, requests)
        return gather_and_stitch(variable, prepared, own_unique(prepared))


def own_unique(prepared: PackedRequests):
    """The one-process UniquePartition of packed ids: ascending rows, so gathers and updates are sequential."""
    return unique_partition(prepared.packed, 1, sort_ids=True)


def gather_and_stitch(variable, prepared: PackedRequests, unique) -> list[tf.Tensor]:
    """Gathers the unique ids' rows of ``variable`` and stitches them into one output per request."""
    rows = gather_variable_rows(variable, unique.unique_ids)
    return stitch_outputs(prepared, rows, unique.inverse, variable.shape[-1])


def _reshape(out, ids, dim):
    if isinstance(ids, tf.RaggedTensor):  # one-hot lookup of ragged ids keeps the ragged shape
        return ids.with_flat_values(out)
    if ids is None:
        return out
    if ids.shape.rank == 1:
        if not tf.executing_eagerly():
            out.set_shape(ids.shape.concatenate([dim]))  # keep the static batch size (free)
        return out
    # Rank unknown until run time (e.g. a dataset without static shapes): the dynamic reshape below.
    static = ids.shape.as_list() if ids.shape.rank is not None else [None]
    if None not in static:
        return tf.reshape(out, [*static, dim])
    return tf.reshape(out, tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], axis=0))
