"""Raw / wrapper / native runs and references of the Stitch* fuzz cases (see paths.py)."""

from __future__ import annotations

import numpy as np

from tests.fuzz import references as ref
from tests.fuzz.paths import NotApplicable, _np, _ops, _tf


def _combine_args(tf, c):
    t = tf.as_dtype(c["rows"].dtype)
    weights = tf.zeros([0], t) if c["weights"] is None else tf.constant(c["weights"])
    return (
        tf.constant(c["inverse"]),
        tf.constant(c["sizes"]),
        tf.constant(c["segments"]),
        tf.constant(c["lengths"]),
        weights,
    )


def _combine_kwargs(c):
    return {"field_segments": c["segments"], "segment_lengths": c["lengths"], "weights": c["weights"]}


def run_stitch_combine(c, path):
    if path == "native":
        import hybridtf as htf

        return htf.native.stitch_combine(
            c["rows"],
            c["inverse"],
            c["sizes"],
            c["combiners"],
            **_combine_kwargs(c),
        )
    tf = _tf()
    if path == "raw":
        out = _ops().hybrid_tf_stitch_combine(
            tf.constant(c["rows"]), *_combine_args(tf, c), num_fields=len(c["combiners"]), combiners=c["combiners"]
        )
    else:
        import hybridtf as htf

        out = htf.ops.stitch_combine(
            c["rows"],
            c["inverse"],
            c["sizes"],
            c["combiners"],
            **_combine_kwargs(c),
        )
    return [_np(x) for x in out]


def ref_stitch_combine(c):
    return ref.combine_reference(
        c["rows"], c["inverse"], c["sizes"], c["segments"], c["lengths"], c["weights"], c["combiners"]
    )


def run_stitch_combine_grad(c, path):
    if path == "native":
        import hybridtf as htf

        return [
            htf.native.stitch_combine_grad(
                c["grads"],
                c["inverse"],
                c["sizes"],
                c["combiners"],
                c["num_unique"],
                **_combine_kwargs(c),
            )
        ]
    tf = _tf()
    if path == "raw":
        out = _ops().hybrid_tf_stitch_combine_grad(
            [tf.constant(g) for g in c["grads"]],
            *_combine_args(tf, c),
            tf.constant(c["num_unique"], tf.int64),
            combiners=c["combiners"],
        )
        return [_np(out)]
    import hybridtf as htf

    if c["num_unique"] != c["rows"].shape[0]:  # the wrapper derives num_unique from the rows
        raise NotApplicable("num_unique is not the rows' count (only the raw op takes it)")
    rows = tf.constant(c["rows"])
    with tf.GradientTape() as tape:
        tape.watch(rows)
        outs = htf.ops.stitch_combine(
            rows,
            c["inverse"],
            c["sizes"],
            c["combiners"],
            **_combine_kwargs(c),
        )
        loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(outs, c["grads"])])
    return [_np(tape.gradient(loss, rows))]


def ref_stitch_combine_grad(c):
    return [
        ref.combine_grad_reference(
            c["grads"],
            c["inverse"],
            c["sizes"],
            c["segments"],
            c["lengths"],
            c["weights"],
            c["combiners"],
            c["num_unique"],
        )
    ]


# ---- StitchConcat family ----------------------------------------------------------------------


def _layout_attrs(c):
    groups, pieces, attrs = c["groups"], c["pieces"], c["attrs"]
    group_fields = [len(g["combiners"]) for g in groups]
    if "group_fields_delta" in attrs:
        group_fields[0] += attrs["group_fields_delta"]
    if "piece" in attrs:
        pieces = [attrs["piece"], *list(pieces[1:])]
    return dict(
        group_fields=group_fields,
        combiners=[x for g in groups for x in g["combiners"]],
        piece_groups=[int(p[0]) for p in pieces],
        piece_items=[int(p[1]) for p in pieces],
    )


def _lists(tf, c):
    g = c["groups"]
    return (
        [tf.constant(x["rows"]) for x in g],
        [tf.constant(x["inverse"]) for x in g],
        [tf.constant(x["sizes"]) for x in g],
        [tf.constant(x["segments"]) for x in g],
        [tf.constant(x["lengths"]) for x in g],
    )


def _stitch_groups(tf, c):
    from hybridtf._src.run.stitch_concat import StitchGroup

    if "piece" in c["attrs"] or "group_fields_delta" in c["attrs"]:
        raise NotApplicable("attributes the wrapper derives itself")
    return [
        StitchGroup(
            tf.constant(x["rows"]),
            tf.constant(x["inverse"]),
            tf.constant(x["sizes"]),
            tf.constant(x["segments"]),
            tf.constant(x["lengths"]),
            tuple(x["combiners"]),
        )
        for x in c["groups"]
    ]


def _pieces(c):
    return [tuple(int(v) for v in p) for p in c["pieces"]]


def run_stitch_concat(c, path):
    tf = _tf()
    dense = [tf.constant(d) for d in c["dense"]]
    if path == "raw":
        return [_np(_ops().hybrid_tf_stitch_concat(*_lists(tf, c), dense, **_layout_attrs(c)))]
    from hybridtf._src.run.stitch_concat import stitch_concat

    return [_np(stitch_concat(_stitch_groups(tf, c), dense, _pieces(c)))]


def ref_stitch_concat(c):
    return [ref.concat_reference(c["groups"], c["dense"], _pieces(c))]


def _widths(c):
    dims = [x["rows"].shape[1] for x in c["groups"]]
    dense_widths = [d.shape[1] for d in c["dense"]]
    for key in ("dims", "dense_widths"):
        if key in c["attrs"]:
            (dims if key == "dims" else dense_widths)[0] = c["attrs"][key]
    return dims, dense_widths


def run_stitch_concat_grad(c, path):
    tf = _tf()
    if path == "raw":
        _, inverses, sizes, segments, lengths = _lists(tf, c)
        num_unique = [tf.constant(x["rows"].shape[0], tf.int64) for x in c["groups"]]
        dims, dense_widths = _widths(c)
        d_rows, d_dense = _ops().hybrid_tf_stitch_concat_grad(
            tf.constant(c["grad"]),
            inverses,
            sizes,
            segments,
            lengths,
            num_unique,
            dims=dims,
            dense_widths=dense_widths,
            broadcast_grad=c["broadcast"],
            num_dense=len(c["dense"]),
            **_layout_attrs(c),
        )
        return [_np(x) for x in (*d_rows, *d_dense)]
    from hybridtf._src.run.stitch_concat import stitch_concat

    if "dims" in c["attrs"] or "dense_widths" in c["attrs"]:
        raise NotApplicable("attributes the wrapper derives itself")
    if "grad_rows_delta" in c["attrs"]:
        raise NotApplicable("the upstream gradient's shape comes from the forward output on this path")
    groups = _stitch_groups(tf, c)
    dense = [tf.constant(d) for d in c["dense"]]
    sources = [g.rows for g in groups] + dense
    grad = tf.constant(c["grad"])
    with tf.GradientTape() as tape:
        tape.watch(sources)
        out = stitch_concat(groups, dense, _pieces(c))
        loss = tf.reduce_sum(out * grad)  # broadcast [batch, 1] grads reach every column of their row
    grads = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [_np(tf.convert_to_tensor(g)) for g in grads]


def ref_stitch_concat_grad(c):
    dims, dense_widths = _widths(c)
    num_unique = [x["rows"].shape[0] for x in c["groups"]]
    d_rows, d_dense = ref.concat_grad_reference(
        c["grad"], c["groups"], dense_widths, _pieces(c), num_unique, dims, c["broadcast"]
    )
    return [*d_rows, *d_dense]


def run_stitch_concat_matmul(c, path):
    tf = _tf()
    dense = [tf.constant(d) for d in c["dense"]]
    kernel = tf.constant(c["kernel"])
    if path == "raw":
        return [_np(_ops().hybrid_tf_stitch_concat_mat_mul(*_lists(tf, c), dense, kernel, **_layout_attrs(c)))]
    from hybridtf._src.run.stitch_concat import stitch_concat_matmul

    return [_np(stitch_concat_matmul(_stitch_groups(tf, c), dense, _pieces(c), kernel))]


def ref_stitch_concat_matmul(c):
    return [ref.concat_reference(c["groups"], c["dense"], _pieces(c)) @ np.asarray(c["kernel"], np.float64)]


def run_stitch_concat_matmul_grad(c, path):
    tf = _tf()
    dense = [tf.constant(d) for d in c["dense"]]
    kernel = tf.constant(c["kernel"])
    grad = tf.constant(c["grad"])
    if path == "raw":
        d_rows, d_dense, d_kernel = _ops().hybrid_tf_stitch_concat_mat_mul_grad(
            grad, kernel, *_lists(tf, c), dense, **_layout_attrs(c)
        )
        return [_np(x) for x in (*d_rows, *d_dense, d_kernel)]
    from hybridtf._src.run.stitch_concat import stitch_concat_matmul

    if "grad_rows_delta" in c["attrs"]:
        raise NotApplicable("the upstream gradient's shape comes from the forward output on this path")
    groups = _stitch_groups(tf, c)
    sources = [g.rows for g in groups] + dense + [kernel]
    with tf.GradientTape() as tape:
        tape.watch(sources)
        out = stitch_concat_matmul(groups, dense, _pieces(c), kernel)
        loss = tf.reduce_sum(out * grad)
    grads = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [_np(tf.convert_to_tensor(g)) for g in grads]


def ref_stitch_concat_matmul_grad(c):
    d_rows, d_dense, d_kernel = ref.matmul_grad_reference(c["grad"], c["kernel"], c["groups"], c["dense"], _pieces(c))
    return [*d_rows, *d_dense, d_kernel]


def _fm_of(x, num_fields):
    """(cross term, field sums) of the stacked fields x ([batch, fields * dim]), float64."""
    x = np.asarray(x, np.float64)
    x = x.reshape(x.shape[0], num_fields, x.shape[1] // num_fields)
    sums = x.sum(axis=1)
    return sums * sums - (x * x).sum(axis=1), sums


def run_stitch_fm(c, path):
    tf = _tf()
    dense = [tf.constant(d) for d in c["dense"]]
    if path == "raw":
        return [_np(x) for x in _ops().hybrid_tf_stitch_fm(*_lists(tf, c), dense, **_layout_attrs(c))]
    from hybridtf._src.run.stitch_concat import stitch_concat
    from hybridtf._src.run.stitch_fm import fm_of_stitch_concat

    groups = _stitch_groups(tf, c)

    @tf.function
    def fm():
        out = fm_of_stitch_concat(stitch_concat(groups, dense, _pieces(c)).op)
        return out, out.op.outputs[1]

    return [_np(x) for x in fm()]


def ref_stitch_fm(c):
    return list(_fm_of(ref.concat_reference(c["groups"], [], _pieces(c)), len(c["pieces"])))


def run_stitch_fm_grad(c, path):
    tf = _tf()
    dense = [tf.constant(d) for d in c["dense"]]
    grad, grad_sums = tf.constant(c["grad"]), tf.constant(c["grad_sums"])
    if path == "raw":
        lists, attrs = _lists(tf, c), _layout_attrs(c)
        try:  # the sums the forward returns for these inputs (any [batch, dim] when it rejects them)
            sums = _ops().hybrid_tf_stitch_fm(*lists, dense, **attrs)[1]
        except tf.errors.InvalidArgumentError:
            sums = grad
        if "grad_rows_delta" in c["attrs"]:
            sums = tf.zeros_like(grad)
        d_rows = _ops().hybrid_tf_stitch_fm_grad(grad, sums, grad_sums, *lists, dense, **attrs)
        return [_np(x) for x in d_rows]
    from hybridtf._src.run.stitch_concat import stitch_concat
    from hybridtf._src.run.stitch_fm import fm_of_stitch_concat

    if "grad_rows_delta" in c["attrs"]:
        raise NotApplicable("the upstream gradient's shape comes from the forward output on this path")
    groups = _stitch_groups(tf, c)
    sources = [g.rows for g in groups]

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            tape.watch(sources)
            rows = [type(g)(r, *list(vars(g).values())[1:]) for r, g in zip(sources, groups)]
            out = fm_of_stitch_concat(stitch_concat(rows, dense, _pieces(c)).op)
            loss = tf.reduce_sum(out * grad) + tf.reduce_sum(out.op.outputs[1] * grad_sums)
        return tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    return [_np(tf.convert_to_tensor(g)) for g in grads()]


def ref_stitch_fm_grad(c):
    num_fields = len(c["pieces"])
    x = ref.concat_reference(c["groups"], [], _pieces(c))
    _, sums = _fm_of(x, num_fields)
    dy, ds = np.asarray(c["grad"], np.float64), np.asarray(c["grad_sums"], np.float64)
    e = np.asarray(x, np.float64).reshape(x.shape[0], num_fields, x.shape[1] // num_fields)
    g_x = (2 * dy * sums + ds)[:, None, :] - 2 * dy[:, None, :] * e
    dims = [x["rows"].shape[1] for x in c["groups"]]
    num_unique = [x["rows"].shape[0] for x in c["groups"]]
    d_rows, _ = ref.concat_grad_reference(
        g_x.reshape(x.shape[0], x.shape[1]), c["groups"], [], _pieces(c), num_unique, dims, False
    )
    return d_rows
