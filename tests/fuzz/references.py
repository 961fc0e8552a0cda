"""NumPy references of the custom ops for the fuzz suite, written from the ops' documented contracts.

float64 throughout (float32 results are compared with a relative tolerance), except the sparse
optimizer updates, which follow the kernels' float32 operation order.
"""

from __future__ import annotations

import numpy as np

from tests.reference import unique_partition_reference

__all__ = [
    "combine_grad_reference",
    "combine_reference",
    "concat_grad_reference",
    "concat_reference",
    "matmul_grad_reference",
    "pack_ids_reference",
    "sparse_apply_reference",
    "unique_partition_reference",
    "unique_subset_reference",
]


def _bags(sizes, segments, lengths, combiners):
    """Per field: a list of (begin, end) position ranges, one per output row."""
    out, pos, cursor = [], 0, 0
    for f, c in enumerate(combiners):
        if c == "none":
            out.append([(pos + r, pos + r + 1) for r in range(int(sizes[f]))])
        else:
            rows = []
            at = pos
            for b in range(int(segments[f])):
                length = int(lengths[cursor + b])
                rows.append((at, at + length))
                at += length
            cursor += int(segments[f])
            out.append(rows)
        pos += int(sizes[f])
    return out


def _denominator(combiner, w):
    if combiner in ("none", "sum"):
        return 1.0
    if combiner == "mean":
        return float(np.sum(w))
    return float(np.sqrt(np.sum(w * w)))


def combine_reference(rows, inverse, sizes, segments, lengths, weights, combiners):
    """StitchCombine: one [rows_f, dim] float64 array per field."""
    rows = np.asarray(rows, np.float64)
    inv = np.asarray(inverse, np.int64)
    w_all = None if weights is None or len(weights) == 0 else np.asarray(weights, np.float64)
    outs = []
    for f, bags in enumerate(_bags(sizes, segments, lengths, combiners)):
        out = np.zeros((len(bags), rows.shape[1]))
        for r, (b, e) in enumerate(bags):
            if e == b:
                continue
            w = np.ones(e - b) if w_all is None or combiners[f] == "none" else w_all[b:e]
            denom = _denominator(combiners[f], w)
            if denom == 0:
                continue
            out[r] = (w[:, None] * rows[inv[b:e]]).sum(0) / denom
        outs.append(out)
    return outs


def combine_grad_reference(grads, inverse, sizes, segments, lengths, weights, combiners, num_unique):
    """StitchCombineGrad: d_rows[num_unique, dim] (float64)."""
    inv = np.asarray(inverse, np.int64)
    dim = np.asarray(grads[0]).shape[1]
    w_all = None if weights is None or len(weights) == 0 else np.asarray(weights, np.float64)
    d = np.zeros((num_unique, dim))
    for f, bags in enumerate(_bags(sizes, segments, lengths, combiners)):
        g = np.asarray(grads[f], np.float64)
        for r, (b, e) in enumerate(bags):
            if e == b:
                continue
            w = np.ones(e - b) if w_all is None or combiners[f] == "none" else w_all[b:e]
            denom = _denominator(combiners[f], w)
            if denom == 0:
                continue
            for i in range(b, e):
                d[inv[i]] += g[r] / denom * w[i - b]
    return d


def _piece_values(groups, dense, pieces):
    """The [batch, width_k] block of every piece (group fields combined without weights)."""
    outs = [
        combine_reference(g["rows"], g["inverse"], g["sizes"], g["segments"], g["lengths"], None, g["combiners"])
        for g in groups
    ]
    return [outs[g][f] if g >= 0 else np.asarray(dense[f], np.float64) for g, f in pieces]


def concat_reference(groups, dense, pieces):
    """StitchConcat: [batch, width]."""
    blocks = _piece_values(groups, dense, pieces)
    return np.concatenate(blocks, axis=1)


def concat_grad_reference(grad, groups, dense_widths, pieces, num_unique, dims, broadcast):
    """StitchConcatGrad: (d_rows per group, d_dense per dense input)."""
    grad = np.asarray(grad, np.float64)
    batch = grad.shape[0]
    widths = [dims[g] if g >= 0 else dense_widths[f] for g, f in pieces]
    if broadcast:
        grad = np.repeat(grad, sum(widths), axis=1)
    d_rows = [np.zeros((num_unique[g], dims[g])) for g in range(len(groups))]
    d_dense = [None] * len(dense_widths)
    col = 0
    for (g, f), w in zip(pieces, widths):
        block = grad[:, col : col + w]
        col += w
        if g < 0:
            d_dense[f] = block.copy()
            continue
        grp = groups[g]
        bags = _bags(grp["sizes"], grp["segments"], grp["lengths"], grp["combiners"])[f]
        inv = np.asarray(grp["inverse"], np.int64)
        assert len(bags) == batch
        for r, (b, e) in enumerate(bags):
            if e == b:
                continue
            denom = _denominator(grp["combiners"][f], np.ones(e - b))
            for i in range(b, e):
                d_rows[g][inv[i]] += block[r] / denom
    return d_rows, d_dense


def matmul_grad_reference(grad, kernel, groups, dense, pieces):
    """StitchConcatMatMulGrad: (d_rows per group, d_dense per dense, d_kernel)."""
    grad = np.asarray(grad, np.float64)
    kernel = np.asarray(kernel, np.float64)
    x = concat_reference(groups, dense, pieces)
    d_concat = grad @ kernel.T
    dims = [np.asarray(g["rows"]).shape[1] for g in groups]
    dense_widths = [np.asarray(d).shape[1] for d in dense]
    num_unique = [np.asarray(g["rows"]).shape[0] for g in groups]
    d_rows, d_dense = concat_grad_reference(d_concat, groups, dense_widths, pieces, num_unique, dims, False)
    return d_rows, d_dense, x.T @ grad


def pack_ids_reference(ids, row_offsets, num_rows, on_invalid):
    """PackIds: (packed, field_sizes, invalid_counts)."""
    packed, sizes, invalid = [], [], []
    for a, off, rows in zip(ids, row_offsets, num_rows):
        flat = np.asarray(a, np.int64).reshape(-1)
        bad = (flat < 0) | (flat >= rows)
        packed.append(np.where(bad, 0, flat) + off)
        sizes.append(flat.size)
        invalid.append(int(bad.sum()))
    return np.concatenate(packed).astype(np.int64), np.array(sizes, np.int64), np.array(invalid, np.int64)


def sparse_apply_reference(kind, var, slots, scalars, grad, indices, lazy=False):
    """The fused update's new (var, *slots), float32 in the kernels' operation order."""
    f32 = np.float32
    var = np.array(var, f32)
    slots = [np.array(s, f32) for s in slots]
    grad = np.asarray(grad, f32)
    idx = np.asarray(indices, np.int64)
    s = [f32(x) for x in scalars]
    if kind == "sgd":
        var[idx] = var[idx] + (-grad) * s[0]
        return var, *slots
    if kind == "adagrad":
        acc = slots[0]
        acc[idx] = acc[idx] + grad * grad
        var[idx] = var[idx] + ((-s[0]) * grad) / np.sqrt(acc[idx] + s[1])
        return var, acc
    m, v = slots
    alpha, c1, c2, eps = s
    if lazy:
        mi = (m[idx] + (-m[idx]) * c1) + grad * c1
        vi = (v[idx] + (-v[idx]) * c2) + (grad * grad) * c2
        m[idx], v[idx] = mi, vi
        var[idx] = var[idx] - (mi * alpha) / (np.sqrt(vi) + eps)
        return var, m, v
    m = m + (-m) * c1
    v = v + (-v) * c2
    m[idx] = m[idx] + grad * c1
    v[idx] = v[idx] + (grad * grad) * c2
    var = var - (m * alpha) / (np.sqrt(v) + eps)
    return var, m, v


def unique_subset_reference(a_ids, field_sizes, source_fields, source_offsets, target_offsets):
    """UniqueSubset from A's packed ids: B's (unique_ids, [count], inverse, field_sizes)."""
    a_ids = np.asarray(a_ids, np.int64)
    starts = np.concatenate([[0], np.cumsum(field_sizes)]).astype(np.int64)
    parts = [
        a_ids[starts[a] : starts[a + 1]] - src + dst
        for a, src, dst in zip(source_fields, source_offsets, target_offsets)
    ]
    b_ids = np.concatenate(parts) if parts else np.zeros([0], np.int64)
    uniq, inverse = np.unique(b_ids, return_inverse=True)
    sizes = np.array([p.size for p in parts], np.int64)
    return uniq, np.array([uniq.size], np.int32), inverse.reshape(-1), sizes
