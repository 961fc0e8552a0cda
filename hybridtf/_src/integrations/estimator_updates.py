"""Which optimizer updates each table of an Estimator model_fn: packing groups, names, and a check.

A TF1 model_fn often trains its tables with several optimizers and picks each
one's variables by scope or name (``tf.compat.v1.get_collection(TRAINABLE_VARIABLES,
scope="wide")``, ``"deep" in v.name``): FTRL for the wide part, Adagrad for the
deep part. A packed variable holds several tables, so the wrapper

* reads, in the record pass (the plain model_fn's graph), which updates each
  table's variable gets (``updaters``: one entry per optimizer update op, told
  apart by the optimizer's name scope and op type), and
  packs only tables with the same updates together (``update_groups``);
* names a packed variable under the name scope its member tables share
  (``packed_storage.shared_scope``: ``wide/packed_1d_float32_model``), so the usual scope and
  name filters select it with its tables;
* checks, after the real pass, that each packed variable gets exactly the
  updates its tables got in the plain model_fn (``check_updates``), and raises
  naming the tables and the fix otherwise, instead of training them wrongly
  (with another optimizer, or not at all).
"""

from __future__ import annotations

from hybridtf._src.capture.context import CaptureError

_WRITES = (
    "ResourceApply",
    "ResourceSparseApply",
    "ResourceScatter",
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
)


def updaters(variable) -> frozenset:
    """The optimizer updates of a graph-mode resource ``variable``: ``(op type, optimizer scope)`` pairs.

    Only writes made in an optimizer's ``update_<variable>`` scope count (the
    variable's initializer and other assignments do not). The scope before it
    names the optimizer (``Ftrl``, ``Adagrad_1``, ``DistributedAdagrad``)
    without naming the variable, so a table and the packed variable holding it
    compare equal when one optimizer updates both.

    Example:
        >>> updaters(table_variable)
        frozenset({('ResourceSparseApplyFtrl', 'Ftrl')})
    """
    found = set()
    for op in variable.handle.consumers():
        cut = op.name.find("/update_")
        if op.type.startswith(_WRITES) and cut >= 0:
            found.add((op.type, op.name[:cut]))
    return frozenset(found)


def update_groups(variables: dict) -> dict[str, int]:
    """Table name -> index of its updates among the distinct ones, in first-seen order (0: the first kind)."""
    kinds: dict[frozenset, int] = {}
    return {name: kinds.setdefault(updaters(var), len(kinds)) for name, var in variables.items()}


def _describe(kinds) -> str:
    if not kinds:
        return "no optimizer"
    return " and ".join(sorted({f"{scope} ({op_type})" for op_type, scope in kinds}))


def check_updates(plan, packed: dict, record_variables: dict) -> None:
    """Raises unless every packed variable gets the updates its member tables got in the plain model_fn.

    Args:
        plan: the packing plan.
        packed: packed table name -> its variable in the real graph.
        record_variables: table name -> the table's own variable in the record pass's graph.

    Raises:
        CaptureError: naming the packed table, its tables, both sets of updates and the fix.
    """
    for pt in plan.packed_tables:
        got = updaters(packed[pt.name])
        for m in pt.members:
            want = updaters(record_variables[m.name])
            if want == got:
                continue
            names = [x.name for x in pt.members]
            what = (
                f"hybridtf.estimator: embedding tables {names} share the packed variable {packed[pt.name].name!r}, "
                f"which the wrapped model_fn updates with {_describe(got)}, but the plain model_fn updates table "
                f"{m.name!r} with {_describe(want)}"
            )
            if {scope for _, scope in got} == {scope for _, scope in want}:  # one optimizer, another kind of update
                raise CaptureError(
                    f"{what}: the same optimizer gets another kind of gradient (dense or sparse) for it. The "
                    "model_fn's loss or gradients treat variables picked by name or scope differently (e.g. an L2 "
                    "term over the variables whose name contains 'embeddings', or a gradient scaled for one layer's "
                    "variables), and the packed variable does not carry the tables' names. Pick them with the "
                    "layers' own variables (layer.trainable_variables) or a Keras embeddings_regularizer, or keep "
                    f"these tables unpacked: model_fn(fn, exclude={names})."
                )
            raise CaptureError(
                f"{what}. The model_fn picks each optimizer's variables in a way a packed variable cannot match for "
                "all its tables (by a name or scope the tables do not share). Pass each optimizer the layers' own "
                "variables (layer.trainable_variables), give the tables of each optimizer a variable scope of their "
                f"own, or keep these tables unpacked: model_fn(fn, exclude={names})."
            )


def real_pass_error(error: Exception, packed: dict) -> CaptureError:
    """The error for a model_fn that ran in the record pass but raised ``error`` with the packed variables."""
    names = sorted(v.name for v in packed.values())
    return CaptureError(
        f"hybridtf.estimator: the model_fn raised {type(error).__name__}: {error} when run with the packed "
        f"variables {names} in place of its embedding tables, but not with its own tables. A model_fn that picks "
        "variables by name or scope (e.g. for one optimizer per part of the model) sees each packed variable "
        "under the name scope its tables share. Pass each optimizer the layers' own variables "
        "(layer.trainable_variables), give the tables of each optimizer a variable scope of their own, or keep "
        "the tables it needs by name unpacked: model_fn(fn, exclude=[...])."
    )
