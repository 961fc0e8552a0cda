"""How a fuzz case runs: the raw op (``load_ops().hybrid_tf_*``), the Python wrapper (``htf.ops`` /
GradientTape for the gradient ops) or the NumPy binding (``htf.native``), and its NumPy reference.

``run(case, path)`` returns a list of NumPy arrays (or raises); ``reference(case)`` returns what a
valid case must give. Only imported inside worker processes (it imports TensorFlow lazily).
"""

from __future__ import annotations

import numpy as np

from tests.fuzz import references as ref


class NotApplicable(Exception):
    """The case cannot be expressed on this path (e.g. an attribute the wrapper derives itself)."""


NATIVE_OPS = ("PackIds", "StitchCombine", "StitchCombineGrad", "UniquePartition", "UniqueSubset")


def _tf():
    import tensorflow as tf

    return tf


def _ops():
    from hybridtf._src.run.loader import load_ops

    return load_ops()


def _np(x):
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


# ---- the ids family --------------------------------------------------------------------------


def run_unique_partition(c, path):
    tf = _tf()
    kw = dict(num_partitions=c["num_partitions"], strategy=c["strategy"])
    if path == "raw":
        ids = tf.constant(c["ids"])
        bounds = tf.zeros([0], ids.dtype) if c["bounds"] is None else tf.constant(c["bounds"], ids.dtype)
        out = _ops().hybrid_tf_unique_partition(
            ids, bounds, out_idx=tf.as_dtype(c["out_idx"]), sorted=c["sort_ids"], **kw
        )
    elif path == "wrapper":
        import hybridtf as htf

        out = htf.ops.unique_partition(
            tf.constant(c["ids"]),
            c["num_partitions"],
            c["strategy"],
            range_bounds=c["bounds"],
            out_idx=tf.as_dtype(c["out_idx"]),
            sort_ids=c["sort_ids"],
        )
    else:
        import hybridtf as htf

        out = htf.native.unique_partition(
            c["ids"],
            c["num_partitions"],
            c["strategy"],
            range_bounds=c["bounds"],
            out_idx=c["out_idx"],
            sort_ids=c["sort_ids"],
        )
    return [_np(x) for x in out]


def ref_unique_partition(c):
    return list(
        ref.unique_partition_reference(
            c["ids"], c["num_partitions"], c["strategy"], c["bounds"], sort_ids=c["sort_ids"]
        )
    )


def run_pack_ids(c, path):
    args = (c["row_offsets"], c["num_rows"], c["table_names"])
    if path == "raw":
        tf = _tf()
        out = _ops().hybrid_tf_pack_ids(
            [tf.constant(a) for a in c["ids"]],
            row_offsets=args[0],
            num_rows=args[1],
            table_names=args[2],
            on_invalid=c["on_invalid"],
        )
    elif path == "wrapper":
        import hybridtf as htf

        out = htf.ops.pack_ids(c["ids"], *args, on_invalid=c["on_invalid"])
        if c["on_invalid"] != "count":
            out = (*out, np.zeros(len(c["ids"]), np.int64))
    else:
        import hybridtf as htf

        out = htf.native.pack_ids(c["ids"], *args, on_invalid=c["on_invalid"])
    return [_np(x) for x in out]


def ref_pack_ids(c):
    return list(ref.pack_ids_reference(c["ids"], c["row_offsets"], c["num_rows"], c["on_invalid"]))


def run_bag_splits(c, path):
    tf = _tf()
    values, rows = tf.constant(c["values"]), tf.constant(c["rows"])
    if path == "raw":
        return [_np(x) for x in _ops().hybrid_tf_bag_splits(values, rows, c["nrows"], kind=c["kind"], table="t")]
    from hybridtf._src.run import bag_splits

    if c["kind"] == "row_ids":
        if rows.shape.rank != 1:
            raise NotApplicable("a SparseTensor's row indices are a column of its indices")
        indices = tf.stack([rows, tf.zeros_like(rows)], axis=1)
        bags = bag_splits.bags_from_sparse(tf.SparseTensor(indices, values, [c["nrows"], 1]), "t")
    else:
        if rows.shape.rank != 1 or values.dtype not in (tf.int32, tf.int64):
            raise NotApplicable("RaggedTensor.from_row_splits checks the splits' rank and the values' dtype itself")
        bags = bag_splits.checked_bags(tf.RaggedTensor.from_row_splits(values, rows, validate=False), "t")
    return [_np(bags.values), _np(bags.row_splits)]


def ref_bag_splits(c):
    rows = np.asarray(c["rows"], np.int64)
    if c["kind"] == "row_splits":
        return [np.asarray(c["values"]), rows]
    return [np.asarray(c["values"]), np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=c["nrows"]))])]


def run_gather_rows(c, path):
    tf = _tf()
    var = tf.Variable(c["table"])
    if path == "raw":
        out = _ops().hybrid_tf_gather_rows(var.handle, tf.constant(c["indices"]), dtype=var.dtype)
    else:
        from hybridtf._src.run.gather_rows import gather_rows

        out = gather_rows(var, c["indices"])
    return [_np(out)]


def ref_gather_rows(c):
    return [np.asarray(c["table"])[np.asarray(c["indices"], np.int64)]]


def run_sparse_apply(c, path):
    tf = _tf()
    variables = [tf.Variable(c["var"])] + [tf.Variable(s) for s in c["slots"]]
    if c["alias"] is not None:
        a, b = c["alias"]
        variables[b] = variables[a]
    scalars = [tf.constant(s, tf.float32) for s in c["scalars"]]
    grad, indices = tf.constant(c["grad"]), tf.constant(c["indices"])
    kind = c["kind"]
    if path == "raw":
        ops = _ops()
        handles = [v.handle for v in variables]
        if kind == "sgd":
            ops.hybrid_tf_sparse_apply_sgd(*handles, *scalars, grad, indices)
        elif kind == "adagrad":
            ops.hybrid_tf_sparse_apply_adagrad(*handles, *scalars, grad, indices)
        else:
            ops.hybrid_tf_sparse_apply_adam(*handles, *scalars, grad, indices, lazy=c["lazy"])
    else:
        from hybridtf._src.run import sparse_apply as sa

        if kind == "sgd":
            sa.sparse_apply_sgd(*variables, *scalars, grad, indices)
        elif kind == "adagrad":
            sa.sparse_apply_adagrad(*variables, *scalars, grad, indices)
        else:
            sa.sparse_apply_adam(*variables, *scalars, grad, indices, lazy=c["lazy"])
    return [_np(v) for v in variables]


def ref_sparse_apply(c):
    return list(
        ref.sparse_apply_reference(c["kind"], c["var"], c["slots"], c["scalars"], c["grad"], c["indices"], c["lazy"])
    )


# ---- UniqueSubset ------------------------------------------------------------------------------


def run_unique_subset(c, path):
    attrs = {k: c[k] for k in ("source_fields", "source_offsets", "target_offsets", "num_rows")}
    if path == "native":
        import hybridtf as htf

        return [_np(x) for x in htf.native.unique_subset(c["unique_ids"], c["inverse"], c["field_sizes"], **attrs)]
    tf = _tf()
    u, inv, sizes = tf.constant(c["unique_ids"]), tf.constant(c["inverse"]), tf.constant(c["field_sizes"])
    if path == "raw":
        out = _ops().hybrid_tf_unique_subset(u, inv, sizes, **attrs)
    else:
        import hybridtf as htf
        from hybridtf._src.run.results import UniquePartitionResult

        source = UniquePartitionResult(u, tf.constant([len(c["unique_ids"])], tf.int32), inv)
        result, field_sizes = htf.ops.unique_subset(source, sizes, **attrs)
        out = (*result, field_sizes)
    return [_np(x) for x in out]


def ref_unique_subset(c):
    return list(
        ref.unique_subset_reference(
            c["a_ids"], c["field_sizes"], c["source_fields"], c["source_offsets"], c["target_offsets"]
        )
    )


def run_regularization_penalty(c, path):
    tf = _tf()
    var = tf.Variable(c["var"])
    args = [tf.constant(c[k]) for k in ("ranges", "l1", "l2")]
    if path == "raw":
        return [_np(_ops().hybrid_tf_regularization_penalty(var.handle, *args))]
    from hybridtf._src.run.regularized_apply import regularization_penalty

    return [_np(regularization_penalty(var, *args))]


def ref_regularization_penalty(c):
    var = np.asarray(c["var"], np.float64)
    out = []
    for (b, e), l1, l2 in zip(c["ranges"], c["l1"], c["l2"]):
        w = var[b:e]
        out.append(l1 * np.abs(w).sum() + l2 * (w * w).sum())
    return [np.array(out, np.float32)]
