"""Fuzz cases of the Stitch* ops (StitchCombine, StitchConcat, StitchConcatMatMul and their
gradients) and UniqueSubset. See cases.py for the case model and the classes."""

from __future__ import annotations

import numpy as np

from tests.fuzz.cases import I64_MAX, _float_dtype, _id_dtype, _pick

COMBINERS = ("none", "sum", "mean", "sqrtn")


def _field(rng, combiner, rows=None):
    """(size, segments, lengths) of one field; `rows` fixes its number of output rows."""
    if combiner == "none":
        size = int(rng.integers(0, 10)) if rows is None else rows
        return size, size, []
    bags = int(rng.integers(0, 6)) if rows is None else rows
    lengths = [int(x) for x in rng.integers(0, 4, bags)]
    return sum(lengths), bags, lengths


def _layout(rng, num_unique, num_fields, rows=None):
    combiners = [_pick(rng, COMBINERS) for _ in range(num_fields)]
    sizes, segments, lengths = [], [], []
    for c in combiners:
        size, seg, lens = _field(rng, c, None if rows is None else rows)
        if num_unique == 0:  # no rows to point at: fields without positions
            size, lens = 0, [0] * len(lens)
        sizes.append(size)
        segments.append(seg)
        lengths += lens
    n = sum(sizes)
    return dict(
        combiners=combiners,
        sizes=np.array(sizes, np.int64),
        segments=np.array(segments, np.int64),
        lengths=np.array(lengths, np.int64),
        n=n,
    )


def _wrap_layout(rng, layout):
    """Turns the layout into one whose sizes or bag lengths wrap around int64 to the true total."""
    m = I64_MAX
    if rng.integers(2):  # three one-hot fields of sizes [M, M, n + 2]: the sum wraps to n
        layout["combiners"] = ["none"] * 3
        layout["sizes"] = np.array([m, m, layout["n"] + 2], np.int64)
        layout["segments"] = layout["sizes"].copy()
        layout["lengths"] = np.zeros([0], np.int64)
    else:  # one bag field with lengths [M, M, n + 2]: they wrap to its size n
        layout["combiners"] = [_pick(rng, ("sum", "mean", "sqrtn"))]
        layout["sizes"] = np.array([layout["n"]], np.int64)
        layout["segments"] = np.array([3], np.int64)
        layout["lengths"] = np.array([m, m, layout["n"] + 2], np.int64)


def _mismatch_layout(rng, layout):
    choice = int(rng.integers(3))
    if choice == 0:
        layout["sizes"] = layout["sizes"].copy()
        layout["sizes"][0] += 1
    elif choice == 1:
        layout["lengths"] = np.concatenate([layout["lengths"], [1]]).astype(np.int64)
    else:
        layout["sizes"] = layout["sizes"][:-1] if len(layout["sizes"]) > 1 else np.concatenate([layout["sizes"], [0]])


def _bad_attr_layout(rng, layout):
    choice = int(rng.integers(3))
    if choice == 0:
        layout["combiners"] = list(layout["combiners"])
        layout["combiners"][0] = _pick(rng, ("max", "", "SUM"))
    elif choice == 1:
        layout["sizes"] = layout["sizes"].copy()
        layout["sizes"][0] = -int(rng.integers(1, 2**40))
    else:
        layout["segments"] = layout["segments"].copy()
        layout["segments"][0] = _pick(rng, (-1, -(2**62), I64_MAX))
        layout["combiners"] = list(layout["combiners"])
        layout["combiners"][0] = "sum"


def _extreme_inverse(rng, inverse, num_unique, positions):
    """An out-of-range value at one of `positions` (int64/int32 limits, -1 or num_unique)."""
    info = np.iinfo(inverse.dtype)
    inverse = inverse.copy()
    inverse[_pick(rng, positions)] = _pick(rng, (info.max, info.min, -1, num_unique))
    return inverse


def gen_stitch_combine(grad: bool):
    def gen(rng, cls):
        t, idx = _float_dtype(rng), _id_dtype(rng)
        num_unique = int(rng.integers(0 if cls == "empty" else 1, 12))
        dim = int(_pick(rng, (1, 2, 3, 4, 8, 5)))
        layout = _layout(rng, num_unique, int(rng.integers(1, 4)))
        if cls == "empty":
            layout = _layout(rng, 0, int(rng.integers(1, 3)))
        valid = True
        if cls == "wrapping_sums":
            _wrap_layout(rng, layout)
            valid = False
        n = layout.pop("n")
        inverse = rng.integers(0, max(num_unique, 1), n).astype(idx) if num_unique else np.zeros([0], idx)
        rows = rng.standard_normal((num_unique, dim)).astype(t)
        weights = None if rng.integers(2) else rng.uniform(0.1, 2.0, n).astype(t)
        if cls == "int64_extremes":
            if n:
                inverse = _extreme_inverse(rng, inverse, num_unique, range(n))
            else:
                layout["sizes"] = layout["sizes"].copy()
                layout["sizes"][0] = I64_MAX
            valid = False
        elif cls == "bad_attrs":
            _bad_attr_layout(rng, layout)
            valid = False
        elif cls in ("mismatched", "aliased"):
            valid = False
            if weights is not None and rng.integers(2):
                weights = np.concatenate([weights, [1.0]]).astype(t)
            else:
                _mismatch_layout(rng, layout)
        inputs = dict(rows=rows, inverse=inverse, weights=weights, **layout)
        if grad:
            out_rows = (
                [
                    int(s) if c == "none" else int(g)
                    for c, s, g in zip(layout["combiners"], layout["sizes"], layout["segments"])
                ]
                if valid
                else []
            )
            grads = (
                [rng.standard_normal((r, dim)).astype(t) for r in out_rows]
                if valid
                else [rng.standard_normal((1, dim)).astype(t) for _ in layout["combiners"]]
            )
            inputs["grads"] = grads
            inputs["num_unique"] = num_unique
            if cls == "bad_attrs" and rng.integers(2):
                inputs["num_unique"] = -1 if dim == 1 else _pick(rng, (-1, I64_MAX // dim + 1, 2**62))
                inputs.update(_restore_valid_layout(rng, num_unique, dim, t, idx))
        return inputs, valid

    return gen


def _restore_valid_layout(rng, num_unique, dim, t, idx):
    """A valid layout, inverse and grads (so that only num_unique is bad)."""
    layout = _layout(rng, num_unique, 1)
    n = layout.pop("n")
    c, s, g = layout["combiners"][0], int(layout["sizes"][0]), int(layout["segments"][0])
    return dict(
        inverse=rng.integers(0, max(num_unique, 1), n).astype(idx) if num_unique else np.zeros([0], idx),
        weights=None,
        grads=[rng.standard_normal((s if c == "none" else g, dim)).astype(t)],
        **layout,
    )


# ---- StitchConcat family ----------------------------------------------------------------------


def gen_stitch_concat(kind: str):
    """kind: "concat", "concat_grad", "matmul", "matmul_grad", "fm" or "fm_grad".

    The FM kinds place fields of one dim and no dense input (StitchFM's contract); their
    "mismatched" class may break that instead (a dense piece, or a group of another dim).
    """
    fm = kind.startswith("fm")

    def gen(rng, cls):
        t, idx = _float_dtype(rng), _id_dtype(rng)
        batch = 0 if cls == "empty" else int(rng.integers(1, 9))
        groups, pieces = [], []
        fm_dim = int(_pick(rng, (1, 2, 3, 4, 8, 16)))
        for g in range(int(rng.integers(1, 4))):
            num_unique = int(rng.integers(1, 12))
            dim = fm_dim if fm else int(_pick(rng, (1, 2, 3, 4, 8, 16)))
            nf = int(rng.integers(1, 4))
            layout = _layout(rng, num_unique, nf, rows=batch)
            n = layout.pop("n")
            groups.append(
                dict(
                    rows=rng.standard_normal((num_unique, dim)).astype(t),
                    inverse=rng.integers(0, num_unique, n).astype(idx),
                    **layout,
                )
            )
            pieces += [(g, f) for f in range(nf) if rng.integers(4)]
        dense = [
            rng.standard_normal((batch, int(rng.integers(1, 6)))).astype(t)
            for _ in range(0 if fm else int(rng.integers(0, 3)))
        ]
        pieces += [(-1, m) for m in range(len(dense))]
        if not pieces:
            pieces = [(0, 0)]
        pieces = [pieces[i] for i in rng.permutation(len(pieces))]
        valid = True
        attrs = {}
        gi = int(rng.integers(len(groups)))
        g0 = groups[gi]
        placed = [(g, f) for g, f in pieces if g >= 0]
        if cls == "int64_extremes":
            valid = False
            g, f = _pick(rng, placed) if placed else (0, 0)
            grp = groups[g]
            start = int(np.sum(grp["sizes"][:f]))
            positions = range(start, start + int(grp["sizes"][f]))
            if (g, f) in placed and positions:
                grp["inverse"] = _extreme_inverse(rng, grp["inverse"], grp["rows"].shape[0], positions)
            else:
                grp["sizes"] = grp["sizes"].copy()
                grp["sizes"][0] = I64_MAX
        elif cls == "wrapping_sums":
            valid = False
            g0["n"] = len(g0["inverse"])
            _wrap_layout(rng, g0)
            g0.pop("n")
            g0["combiners"] = list(g0["combiners"])
            pieces = [p for p in pieces if p[0] != gi or p[1] < len(g0["combiners"])]
            if not any(p[0] == gi for p in pieces):
                pieces.append((gi, 0))
        elif cls == "bad_attrs":
            valid = False
            choice = int(rng.integers(4))
            if choice == 0:
                _bad_attr_layout(rng, g0)
            elif choice == 1:
                attrs["piece"] = _pick(rng, [(len(groups), 0), (0, 99), (-2, 0), (-1, len(dense))])
            elif choice == 2 and kind == "concat_grad":
                attrs[_pick(rng, ("dims", "dense_widths") if dense else ("dims",))] = _pick(rng, (-1, 2**62, -(2**40)))
            else:
                attrs["group_fields_delta"] = _pick(rng, (1, -1, 2**62))
        elif cls in ("mismatched", "aliased"):
            valid = False
            choice = int(rng.integers(3))
            if fm and choice == 0:  # what StitchFM takes no more than StitchConcat: a dense piece, mixed dims
                if rng.integers(2) or not placed:
                    dense.append(rng.standard_normal((batch, fm_dim)).astype(t))
                    pieces.append((-1, 0))
                else:
                    grp = groups[placed[0][0]]
                    grp["rows"] = rng.standard_normal((grp["rows"].shape[0], fm_dim + 1)).astype(t)
                    if not any(groups[g]["rows"].shape[1] == fm_dim for g, _ in pieces if g >= 0):
                        # no placed field keeps the old dim: place one of a new group that does
                        groups.append({**grp, "rows": rng.standard_normal((grp["rows"].shape[0], fm_dim)).astype(t)})
                        pieces.append((len(groups) - 1, 0))
            elif choice == 0 and kind in ("matmul", "matmul_grad"):
                attrs["kernel_rows_delta"] = 1
            elif choice == 1 and kind in ("concat_grad", "matmul_grad", "fm_grad"):
                attrs["grad_rows_delta"] = 1
            else:
                _mismatch_layout(rng, g0)
        if kind == "concat_grad" and "grad_rows_delta" in attrs and not any(g >= 0 for g, _ in pieces):
            valid = True  # only dense pieces: their rows are the gradient's, there is no other batch to differ from
        width = sum(
            groups[g]["rows"].shape[1] if g >= 0 else dense[f].shape[1]
            for g, f in pieces
            if (g >= 0 and g < len(groups)) or (g == -1 and f < len(dense))
        )
        inputs = dict(groups=groups, dense=dense, pieces=pieces, attrs=attrs, dtype=np.dtype(t).name)
        if kind in ("matmul", "matmul_grad"):
            units = int(_pick(rng, (1, 3, 8, 16)))
            inputs["kernel"] = rng.standard_normal((width + attrs.get("kernel_rows_delta", 0), units)).astype(t)
        if kind == "concat_grad":
            broadcast = bool(rng.integers(2))
            inputs["broadcast"] = broadcast
            inputs["grad"] = rng.standard_normal(
                (batch + attrs.get("grad_rows_delta", 0), 1 if broadcast else width)
            ).astype(t)
        if kind == "matmul_grad":
            inputs["grad"] = rng.standard_normal(
                (batch + attrs.get("grad_rows_delta", 0), inputs["kernel"].shape[1])
            ).astype(t)
        if kind == "fm_grad":
            shape = (batch + attrs.get("grad_rows_delta", 0), fm_dim)
            inputs["grad"] = rng.standard_normal(shape).astype(t)
            inputs["grad_sums"] = (rng.standard_normal(shape) if rng.integers(2) else np.zeros(shape)).astype(t)
        return inputs, valid

    return gen


# ---- UniqueSubset -------------------------------------------------------------------------------


def gen_unique_subset(rng, cls):
    id_dtype, idx_dtype = _id_dtype(rng), _id_dtype(rng)
    fa = int(rng.integers(1, 5))
    offsets, rows, fields = [], [], []
    at = int(rng.integers(0, 5))
    for _ in range(fa):
        r = int(rng.integers(1, 20))
        offsets.append(at)
        rows.append(r)
        n = 0 if cls == "empty" else int(rng.integers(0, 15))
        fields.append(rng.integers(0, r, n) + at)
        at += r + int(rng.integers(0, 4))
    valid = True
    shared = cls == "mismatched" and fa >= 2 and rng.integers(2)
    if shared:  # A fields 0 and 1 look up the same member table (the op must reject it)
        offsets[1], rows[1] = offsets[0], rows[0]
        fields[1] = rng.integers(0, rows[0], max(len(fields[1]), 1)) + offsets[0]
        fields[0] = rng.integers(0, rows[0], max(len(fields[0]), 1)) + offsets[0]
    a_ids = np.concatenate(fields).astype(np.int64)
    sizes = np.array([len(f) for f in fields], np.int64)
    unique_ids, inverse = np.unique(a_ids, return_inverse=True)
    unique_ids = unique_ids.astype(id_dtype)
    inverse = inverse.reshape(-1).astype(idx_dtype)
    fb = int(rng.integers(1, fa + 1))
    source_fields = [int(x) for x in rng.permutation(fa)[:fb]]
    if shared and 0 not in source_fields:
        source_fields[0] = 0
    target, t_at = [], int(rng.integers(0, 3))
    for a in rng.permutation(source_fields):
        target.append((int(a), t_at))
        t_at += rows[int(a)] + int(rng.integers(0, 3))
    target_of = dict(target)
    target_offsets = [target_of[a] for a in source_fields]
    source_offsets = [offsets[a] for a in source_fields]
    num_rows = [rows[a] for a in source_fields]
    if shared:
        valid = False
    elif cls == "int64_extremes":
        valid = False
        if len(inverse):
            info = np.iinfo(idx_dtype)
            inverse = inverse.copy()
            inverse[int(rng.integers(len(inverse)))] = _pick(rng, (info.max, info.min, -1, len(unique_ids)))
        else:
            source_offsets[0] = I64_MAX
    elif cls == "wrapping_sums":
        valid = False
        k = int(rng.integers(fb))
        if rng.integers(2):
            source_offsets[k] = I64_MAX - int(rng.integers(0, num_rows[k]))
        elif id_dtype == np.int32:
            # B's packed rows end past the int32 ids' largest value
            target_offsets[k] = np.iinfo(np.int32).max - num_rows[k] + 1 + int(rng.integers(1, 1000))
        else:
            target_offsets[k] = I64_MAX - int(rng.integers(0, num_rows[k]))
    elif cls == "bad_attrs":
        valid = False
        k = int(rng.integers(fb))
        choice = int(rng.integers(5))
        if choice == 0:
            source_fields[k] = _pick(rng, (-1, fa, 2**40))
        elif choice == 1:
            num_rows[k] = _pick(rng, (0, -1))
        elif choice == 2:
            (source_offsets if rng.integers(2) else target_offsets)[k] = -int(rng.integers(1, 100))
        elif choice == 3 and fb >= 2:
            target_offsets[1] = target_offsets[0]  # overlapping target ranges
        else:
            num_rows = [*num_rows, 1]
    elif cls in ("mismatched", "aliased"):
        valid = False
        if len(unique_ids) >= 2 and rng.integers(2):
            unique_ids = unique_ids.copy()
            i = int(rng.integers(len(unique_ids) - 1))
            unique_ids[i], unique_ids[i + 1] = unique_ids[i + 1], unique_ids[i]
        else:
            sizes = sizes.copy()
            k = int(rng.integers(fa))
            sizes[k] = _pick(rng, (sizes[k] + 1, sizes[k] - 1, I64_MAX))
    return dict(
        unique_ids=unique_ids,
        inverse=inverse,
        field_sizes=sizes,
        source_fields=source_fields,
        source_offsets=source_offsets,
        target_offsets=target_offsets,
        num_rows=num_rows,
        a_ids=a_ids,
    ), valid
