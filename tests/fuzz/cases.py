"""Fuzz cases: per op, valid and adversarial inputs, each knowing whether the op must accept it.

A case is plain data (NumPy arrays, ints, strings), generated deterministically from
(seed, op, index), so a parent process can regenerate any case a worker crashed on and save it as a
reproducer. Every case states ``valid``: a valid case must give the reference output, an invalid one
a clean error (InvalidArgument / ValueError / TypeError). Classes (the same names for every op where
they apply):

* ``valid``: well-formed random inputs (random sizes, dtypes, shapes);
* ``int64_extremes``: ids / indices / offsets at or near the int64 (int32) limits;
* ``wrapping_sums``: sizes, lengths or offsets whose sum or product wraps around int64;
* ``bad_attrs``: negative, huge or inconsistent attributes;
* ``aliased``: the same variable passed twice (sparse updates only);
* ``empty``: empty tensors (usually valid);
* ``mismatched``: lengths, ranks or counts that do not agree.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min
I32_MAX = np.iinfo(np.int32).max

CLASSES = ("valid", "int64_extremes", "wrapping_sums", "bad_attrs", "aliased", "empty", "mismatched")


@dataclasses.dataclass
class Case:
    op: str
    cls: str
    valid: bool
    inputs: dict


def rng_for(seed: int, op: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(op.encode()), index])


def _pick(rng, values):
    return values[int(rng.integers(len(values)))]


def _id_dtype(rng):
    return _pick(rng, (np.int32, np.int64))


def _float_dtype(rng):
    return _pick(rng, (np.float32, np.float64))


# ---- UniquePartition ---------------------------------------------------------------------------


def gen_unique_partition(rng, cls):
    dtype = _id_dtype(rng)
    info = np.iinfo(dtype)
    p = int(rng.integers(1, 9))
    strategy = _pick(rng, ("mod", "range"))
    n = int(rng.integers(0, 64))
    sort_ids = bool(rng.integers(2))
    out_idx = _pick(rng, (np.int32, np.int64))
    rows = int(rng.integers(1, 200))
    bounds = None
    valid = True
    if strategy == "range":
        bounds = np.concatenate([[0], np.sort(rng.integers(0, rows + 1, p - 1)), [rows]]).astype(np.int64)
        ids = rng.integers(0, rows, n).astype(dtype)
    else:
        ids = rng.integers(-rows, rows, n).astype(dtype)
    if cls == "int64_extremes":
        extremes = np.array([info.min, info.max, info.min + 1, info.max - 1, 0, -1], dtype)
        ids = np.concatenate([ids, rng.choice(extremes, int(rng.integers(1, 6)))]).astype(dtype)
        if strategy == "range":
            if rng.integers(2):
                bounds = np.array([0] * p + [int(info.max)], np.int64)  # every id in [0, max) is valid
            valid = bool(np.all((ids >= 0) & (ids < bounds[-1])))
    elif cls == "wrapping_sums":
        strategy = "range"
        huge = int(info.max)
        bounds = np.array([0] + [huge] * (p - 1) + [huge], np.int64)
        if rng.integers(2):  # a bound past the ids' dtype, or a wrapped (negative) last bound
            bounds[-1] = _pick(rng, (I64_MIN, -5, huge + 1 if dtype == np.int32 else I64_MIN))
            valid = False
        else:
            valid = bool(np.all((ids >= 0) & (ids < bounds[-1])))
    elif cls == "bad_attrs":
        valid = False
        choice = int(rng.integers(3))
        if choice == 0:
            p = _pick(rng, (0, -1, 4097, 2**31, 2**40))
            bounds = None if strategy == "mod" else np.zeros([1], np.int64)
        elif choice == 1:
            strategy = "range"
            bounds = np.concatenate([[0], -rng.integers(1, 10, p)]).astype(np.int64)  # decreasing
        else:
            strategy = "range"
            bounds = np.concatenate([[int(rng.integers(1, 5))], np.full(p, rows)]).astype(np.int64)  # first != 0
    elif cls == "empty":
        ids = np.zeros([0], dtype)
    elif cls == "mismatched":
        valid = False
        if rng.integers(2) or strategy == "mod":
            ids = ids.reshape(1, -1) if rng.integers(2) else np.zeros([2, 2], dtype)
        else:
            bounds = bounds[: int(rng.integers(0, len(bounds)))]
    elif cls == "valid" and strategy == "range" and n:
        pass
    return dict(ids=ids, num_partitions=p, strategy=strategy, bounds=bounds, out_idx=out_idx, sort_ids=sort_ids), valid


# ---- PackIds -----------------------------------------------------------------------------------


def gen_pack_ids(rng, cls):
    nf = int(rng.integers(1, 5))
    ids, offsets, rows_list = [], [], []
    offset = 0
    for _ in range(nf):
        rows = int(rng.integers(1, 50))
        shape = _pick(rng, ((int(rng.integers(0, 20)),), (int(rng.integers(0, 5)), int(rng.integers(0, 4)))))
        ids.append(rng.integers(0, rows, shape).astype(_id_dtype(rng)))
        offsets.append(offset)
        rows_list.append(rows)
        offset += rows
    on_invalid = _pick(rng, ("error", "count"))
    valid = True
    if cls == "int64_extremes":
        f = int(rng.integers(nf))
        info = np.iinfo(ids[f].dtype)
        if rng.integers(2):  # an id at the dtype's limits: out of the vocabulary
            flat = np.concatenate([ids[f].reshape(-1), [_pick(rng, (info.min, info.max, -1))]]).astype(ids[f].dtype)
            ids[f] = flat
            valid = on_invalid == "count"
        else:  # the largest packed row offsets that still fit
            offsets[f] = I64_MAX - rows_list[f] - int(rng.integers(0, 2))
    elif cls == "wrapping_sums":
        f = int(rng.integers(nf))
        offsets[f] = I64_MAX - int(rng.integers(0, rows_list[f]))
        valid = False
    elif cls == "bad_attrs":
        valid = False
        f = int(rng.integers(nf))
        choice = int(rng.integers(3))
        if choice == 0:
            offsets[f] = -int(rng.integers(1, 2**40))
        elif choice == 1:
            rows_list[f] = -int(rng.integers(1, 10))
        else:
            on_invalid = "ignore"
    elif cls == "empty":
        ids = [np.zeros([0], _id_dtype(rng)) for _ in range(nf)]
        if rng.integers(2):
            rows_list = [0] * nf
    elif cls == "mismatched":
        valid = False
        if rng.integers(2):
            offsets = [*offsets, 0]
        else:
            f = int(rng.integers(nf))
            ids[f] = ids[f].astype(_pick(rng, (np.float64, np.float32, np.int16, np.uint8)))
    names = [f"t{f}" for f in range(nf)]
    return dict(ids=ids, row_offsets=offsets, num_rows=rows_list, table_names=names, on_invalid=on_invalid), valid


# ---- BagSplits ---------------------------------------------------------------------------------


def gen_bag_splits(rng, cls):
    """A SparseTensor's (values, row indices, dense_shape[0]) or a RaggedTensor's (values, row splits)."""
    kind = _pick(rng, ("row_ids", "row_splits"))
    nrows = int(rng.integers(0, 8))
    n = int(rng.integers(0, 20)) if nrows and cls != "empty" else 0
    values = rng.integers(-5, 50, n).astype(_id_dtype(rng))
    rows = np.sort(rng.integers(0, max(nrows, 1), n)).astype(np.int64)
    splits = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=nrows))]).astype(np.int64)
    valid = cls in ("valid", "empty")
    if cls == "int64_extremes":
        if kind == "row_splits":
            splits = np.array([0, _pick(rng, (I64_MAX, I64_MIN, -1)), n], np.int64)
        elif n:  # a row index at the int64 limits, or just outside [0, nrows)
            rows[int(rng.integers(n))] = _pick(rng, (I64_MIN, I64_MAX, -1, nrows))
        else:
            nrows = _pick(rng, (I64_MIN, -1, I64_MAX, 2**62))
    elif cls == "mismatched":
        choice = int(rng.integers(4))
        if choice == 0:  # values and rows disagree
            rows = np.concatenate([rows, [max(nrows - 1, 0)]]) if rng.integers(2) or not n else rows[:-1]
            splits = np.concatenate([splits[:-1], [n + 1]])
        elif choice == 1:  # out of order / decreasing, or not starting at 0
            rows = np.concatenate([[1, 0], rows]) if nrows >= 2 else np.concatenate([rows, [nrows]])
            values = np.concatenate([values, values[:0], np.zeros(len(rows) - n, values.dtype)])
            splits = np.array([0, n + 1, n], np.int64) if rng.integers(2) else np.concatenate([[1], splits[1:]])
        elif choice == 2:
            values = values.astype(_pick(rng, (np.float32, np.int16)))
        else:
            rows, splits = rows.reshape(1, -1), splits.reshape(1, -1)
    return dict(values=values, rows=rows if kind == "row_ids" else splits, nrows=nrows, kind=kind), valid


# ---- GatherRows --------------------------------------------------------------------------------


def gen_gather_rows(rng, cls):
    rows, dim = int(rng.integers(1, 30)), int(rng.integers(1, 9))
    dtype = _float_dtype(rng)
    table = rng.standard_normal((rows, dim)).astype(dtype)
    idx_dtype = _id_dtype(rng)
    indices = rng.integers(0, rows, int(rng.integers(0, 40))).astype(idx_dtype)
    valid = True
    if cls == "int64_extremes":
        info = np.iinfo(idx_dtype)
        indices = np.concatenate([indices, [_pick(rng, (info.min, info.max, -1, rows))]]).astype(idx_dtype)
        valid = False
    elif cls == "empty":
        indices = np.zeros([0], idx_dtype)
        if rng.integers(2):
            table = np.zeros((0, dim), dtype)
    elif cls in ("mismatched", "bad_attrs", "wrapping_sums"):
        valid = False
        choice = int(rng.integers(3))
        if choice == 0:
            indices = indices.reshape(1, -1)
        elif choice == 1:
            table = table.reshape(-1)  # a vector table
        else:
            indices = indices.astype(np.float32)
    return dict(table=table, indices=indices), valid


# ---- SparseApply* ------------------------------------------------------------------------------

SPARSE_KINDS = {
    "SparseApplySgd": ("sgd", 0, 1),
    "SparseApplyAdagrad": ("adagrad", 1, 2),
    "SparseApplyAdam": ("adam", 2, 4),
}


def gen_sparse_apply(op):
    kind, num_slots, num_scalars = SPARSE_KINDS[op]

    def gen(rng, cls):
        rows, dim = int(rng.integers(1, 30)), int(rng.integers(1, 9))
        var = rng.standard_normal((rows, dim)).astype(np.float32)
        slots = [np.abs(rng.standard_normal((rows, dim))).astype(np.float32) for _ in range(num_slots)]
        n = int(rng.integers(0, rows + 1))
        idx_dtype = _id_dtype(rng)
        indices = rng.permutation(rows)[:n].astype(idx_dtype)
        grad = rng.standard_normal((n, dim)).astype(np.float32)
        scalars = [float(rng.uniform(0.001, 0.5)) for _ in range(num_scalars)]
        if kind == "adagrad":
            scalars[1] = 1e-7
        lazy = bool(rng.integers(2)) if kind == "adam" else False
        alias = None
        valid = True
        if cls == "int64_extremes":
            info = np.iinfo(idx_dtype)
            indices = np.concatenate([indices, [_pick(rng, (info.min, info.max, -1, rows))]]).astype(idx_dtype)
            grad = np.concatenate([grad, np.ones((1, dim), np.float32)])
            valid = False
        elif cls == "aliased":
            if num_slots:
                alias = _pick(rng, [(0, s + 1) for s in range(num_slots)] + ([(1, 2)] if num_slots == 2 else []))
                valid = False
        elif cls == "empty":
            indices = np.zeros([0], idx_dtype)
            grad = np.zeros((0, dim), np.float32)
        elif cls in ("mismatched", "bad_attrs", "wrapping_sums"):
            valid = False
            choice = int(rng.integers(4))
            if choice == 0:
                grad = np.ones((n + 1, dim), np.float32)
            elif choice == 1:
                grad = np.ones((n, dim + 1), np.float32)
            elif choice == 2 and num_slots:
                slots[0] = np.zeros((rows + 1, dim), np.float32)
            elif n >= 1:
                indices = np.concatenate([indices, indices[:1]])  # a duplicate index
                grad = np.concatenate([grad, grad[:1]])
            else:
                indices = indices.reshape(1, 0)
        return dict(
            kind=kind, var=var, slots=slots, scalars=scalars, grad=grad, indices=indices, lazy=lazy, alias=alias
        ), valid

    return gen


# ---- RegularizationPenalty ---------------------------------------------------------------------


def gen_regularization_penalty(rng, cls):
    rows, dim = int(rng.integers(0, 40)), int(rng.integers(1, 9))
    var = rng.standard_normal((rows, dim)).astype(np.float32)
    cuts = np.sort(rng.integers(0, rows + 1, 2 * int(rng.integers(0, 5))))
    ranges = cuts.reshape(-1, 2).astype(np.int64)
    l1 = rng.choice([0.0, 1e-5, 0.01, 0.5], len(ranges)).astype(np.float32)
    l2 = rng.choice([0.0, 1e-5, 0.01, 0.5], len(ranges)).astype(np.float32)
    valid = True
    if cls in {"int64_extremes", "wrapping_sums"}:
        k = int(rng.integers(len(ranges) + 1))
        bad = _pick(rng, ((I64_MIN, 1), (0, I64_MAX), (-1, 1), (I64_MAX - 1, I64_MAX), (0, rows + 1)))
        ranges = np.concatenate([ranges[:k], np.array([bad], np.int64), ranges[k:]]).astype(np.int64)
        l1, l2 = (np.insert(x, k, 0.1).astype(np.float32) for x in (l1, l2))
        valid = False
    elif cls == "bad_attrs":
        valid = len(ranges) == 0
        if len(ranges):
            (l1 if rng.integers(2) else l2)[int(rng.integers(len(ranges)))] = _pick(rng, (-0.5, np.nan, np.inf))
    elif cls == "empty":
        ranges = np.zeros((0, 2), np.int64) if rng.integers(2) else np.zeros((1, 2), np.int64)
        l1, l2 = np.full(len(ranges), 0.1, np.float32), np.full(len(ranges), 0.2, np.float32)
        if rng.integers(2):
            var = np.zeros((0, dim), np.float32)
    elif cls == "mismatched":
        valid = False
        choice = int(rng.integers(4))
        if choice == 0:
            l1 = np.append(l1, np.float32(0.1))
        elif choice == 1:
            ranges = np.zeros((len(ranges), 3), np.int64)
        elif choice == 2:
            var = var.reshape(-1)  # a vector table
        else:
            var = var.astype(np.float64)
    return dict(var=var, ranges=ranges, l1=l1, l2=l2), valid
