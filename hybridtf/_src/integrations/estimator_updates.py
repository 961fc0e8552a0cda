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

import re

import tensorflow as tf

from hybridtf._src.capture.context import CaptureError
from hybridtf._src.distribute.world import current_world

_WRITES = (
    "ResourceApply",
    "ResourceSparseApply",
    "ResourceScatter",
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
)


# Where the walk back from an update stops: sources, and the ops that compute the gradient itself.
_SOURCES = frozenset(
    ("Const", "Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "ReadVariableOp", "NoOp")
)
_GRADIENT_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")
# Ops a wrapped step adds or moves per variable (identities, hybridtf's and Horovod's ops): not the user's.
_NOT_THE_USERS = ("Identity", "IdentityN", "StopGradient", "HybridTF>", "Horovod")
_MAX_WALK = 256
# Horovod's DistributedOptimizer averages the gradients of replicated variables in this scope.
_HOROVOD_SCOPE = re.compile(r"(^|/)Distributed\w*_Allreduce(_\d+)?/")


def _data_parallel(op: tf.Operation, ranks: int) -> bool:
    """Whether ``op`` is not the user's: an identity, hybridtf's or Horovod's averaging over the ranks.

    The plain model_fn's tables are replicated (Horovod allreduces their
    gradients); a packed table sharded over the ranks has its gradient rows
    from the alltoall and is only divided by the number of ranks (Horovod's
    scaling of a registered local variable, ``grad / size``).
    """
    if op.type.startswith(_NOT_THE_USERS) or _HOROVOD_SCOPE.search(op.name):
        return True
    if ranks > 1 and op.type in ("RealDiv", "Div") and op.inputs[1].op.type == "Const":
        divisor = tf.get_static_value(op.inputs[1])
        return divisor is not None and divisor.size == 1 and float(divisor) == ranks
    return False


def gradient_transform(update: tf.Operation, optimizer_scope: str) -> tuple[str, ...]:
    """The types of the ops the model_fn applied to a variable's gradient before ``update`` (sorted, once each).

    Walks back from the update's inputs to the gradient computation (a
    ``gradients`` scope) and the sources (constants, variables, placeholders).
    The ops on the way that compute from a gradient, other than the
    optimizer's own (its scope, or one that starts with its name: Horovod's
    ``DistributedAdagrad_Allreduce``), are the model_fn's doing: a gradient
    scaled or clipped for some variables (``tf.IndexedSlices(g.values * 10,
    ...)`` for those whose name contains ``emb``). Ops that do not read a
    gradient (the ids, a learning rate schedule) are not counted. Types, not
    counts: a global norm over all gradients (``tf.clip_by_global_norm``) has
    one ``L2Loss`` per variable, fewer with packed variables.

    Example:
        >>> gradient_transform(table_update_op, "Adagrad")
        ('Mul',)
    """
    head = optimizer_scope.split("/", maxsplit=1)[0]
    ranks = current_world().size
    from_gradient: dict[str, bool] = {}  # op name -> whether a gradient op is among its inputs' producers
    found = []
    stack = [(t.op, False) for t in update.inputs]
    while stack:
        op, expanded = stack.pop()
        if op.name in from_gradient and not expanded:
            continue
        if op.type in _SOURCES or len(from_gradient) >= _MAX_WALK:
            from_gradient[op.name] = False
            continue
        if _GRADIENT_SCOPE.search(op.name):
            from_gradient[op.name] = True
            continue
        if not expanded:
            from_gradient[op.name] = False  # while its inputs are walked (a cycle reads it as not)
            stack.append((op, True))
            stack.extend((t.op, False) for t in op.inputs if t.op.name not in from_gradient)
            continue
        from_gradient[op.name] = any(from_gradient.get(t.op.name, False) for t in op.inputs)
        own = op.name.startswith(f"{optimizer_scope}/") or op.name.split("/")[0].startswith(head)
        if from_gradient[op.name] and not own and not _data_parallel(op, ranks):
            found.append(op.type)
    return tuple(sorted(set(found)))


def updaters(variable) -> frozenset:
    """The optimizer updates of a graph-mode resource ``variable``: ``(op type, optimizer scope, transform)``.

    Only writes made in an optimizer's ``update_<variable>`` scope count (the
    variable's initializer and other assignments do not). The scope before it
    names the optimizer (``Ftrl``, ``Adagrad_1``, ``DistributedAdagrad``)
    without naming the variable, so a table and the packed variable holding it
    compare equal when one optimizer updates both. The transform is what the
    model_fn did to the gradient on the way (``gradient_transform``).

    Example:
        >>> updaters(table_variable)
        frozenset({('ResourceSparseApplyFtrl', 'Ftrl', ())})
    """
    found = set()
    for op in variable.handle.consumers():
        cut = op.name.find("/update_")
        if op.type.startswith(_WRITES) and cut >= 0:
            found.add((op.type, op.name[:cut], gradient_transform(op, op.name[:cut])))
    return frozenset(found)


def update_groups(variables: dict) -> dict[str, int]:
    """Table name -> index of its updates among the distinct ones, in first-seen order (0: the first kind)."""
    kinds: dict[frozenset, int] = {}
    return {name: kinds.setdefault(updaters(var), len(kinds)) for name, var in variables.items()}


def _describe(kinds) -> str:
    if not kinds:
        return "no optimizer"
    return " and ".join(sorted({f"{scope} ({op_type})" for op_type, scope, _ in kinds}))


def _transforms(kinds) -> str:
    ops = sorted({op for _, _, transform in kinds for op in transform})
    return ", ".join(ops) if ops else "nothing"


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
            if {k[:2] for k in got} == {k[:2] for k in want}:  # the same updates of other gradients
                raise CaptureError(
                    f"{what}, and the two apply other ops to the gradient before the update: {_transforms(want)} "
                    f"for the table, {_transforms(got)} for the packed variable. The model_fn changes the gradients "
                    "of variables it picks by name or scope (e.g. scales or clips those whose name contains "
                    "'embeddings', or takes a multiplier from a dict keyed by variable name), and the packed "
                    "variable does not carry the tables' names. Pick them with the layers' own variables "
                    "(layer.trainable_variables), give these tables a variable scope of their own (a packed "
                    f"variable is named under its tables' shared scope), or keep them unpacked: "
                    f"model_fn(fn, exclude={names})."
                )
            if {scope for _, scope, _ in got} == {scope for _, scope, _ in want}:  # one optimizer, another kind
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
