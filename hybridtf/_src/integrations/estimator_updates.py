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

import bisect
import collections
import contextlib
import logging
import re

import tensorflow as tf
from tensorflow.python.ops import cond_v2

from hybridtf._src.capture.context import CaptureError
from hybridtf._src.distribute.world import current_world
from hybridtf._src.integrations.estimator_saver import view_entries
from hybridtf._src.rewrite.packed_storage import TableView

_log = logging.getLogger("hybridtf")

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
_MAX_WALK = 512
_MAX_SHADOW_HOPS = 4  # table read -> Sub -> Mul -> AssignSubVariableOp of its shadow (a moving average)
MOVING_AVERAGE = "moving average"
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


_SCOPE_INDEX = "_htf_update_scope_index"  # graph attribute: (version, sorted names of update-scope ops, the ops)


def _update_scope_ops(graph, prefix: str) -> list:
    """The ops of ``graph`` whose name starts with ``prefix`` (an optimizer's ``.../update_<variable>/`` scope).

    The index lives on the graph (a module-level cache held the last graph alive after its Estimator was gone).
    """
    cached = getattr(graph, _SCOPE_INDEX, None)
    if cached is None or cached[0] != graph.version:
        names = sorted((op.name, op) for op in graph.get_operations() if "/update_" in op.name)
        cached = (graph.version, [n for n, _ in names], [op for _, op in names])
        setattr(graph, _SCOPE_INDEX, cached)
    keys, ops = cached[1], cached[2]
    return ops[bisect.bisect_left(keys, prefix) : bisect.bisect_left(keys, prefix + "\U0010ffff")]


def _is_update(op: tf.Operation) -> bool:
    """Whether ``op`` writes a variable in an optimizer's ``update_<variable>`` scope."""
    return op.type.startswith(_WRITES) and "/update_" in op.name


def _update_inputs(update: tf.Operation) -> list:
    """The ops feeding a variable's whole update: ``update`` and every op of its ``.../update_<variable>/`` scope
    (an Adam update reads its slots back after scattering the gradient into them)."""
    scope = update.name[: update.name.rfind("/") + 1]
    return [t.op for seed in (update, *_update_scope_ops(update.graph, scope)) for t in seed.inputs]


def _signature(op: tf.Operation) -> str:
    """``op``'s type and the values of its small constant inputs (``Mul(20.0)``): two scales differ."""
    values = []
    for t in op.inputs:
        if t.op.type != "Const":
            continue
        value = tf.get_static_value(t)
        if value is not None and value.size <= 8:
            values.append(",".join(repr(v) for v in value.ravel().tolist()))
    return f"{op.type}({';'.join(values)})" if values else op.type


def gradient_transform(update: tf.Operation, optimizer_scope: str, bridge: dict | None = None) -> tuple[str, ...]:
    """What the model_fn applied to a variable's gradient before ``update``: op types (with their constants).

    Walks back from the inputs of the variable's whole update (the ops of its
    ``<optimizer>/update_<variable>/`` scope: an Adam update reads its slots
    back after scattering the gradient into them) to the gradient computation
    (a ``gradients`` scope) and the sources (constants, variables,
    placeholders). The ops on the way that compute float values from a
    gradient, other than the optimizer's own (its scope) and Horovod's
    averaging, are the model_fn's doing: a gradient scaled or clipped for some
    variables (``tf.IndexedSlices(g.values * 10, ...)`` for those whose name
    contains ``emb``), each with its constants (``Mul(10.0)``: a scale of 2
    for one scope and 0.5 for another differ). Ops that do not read a
    gradient (the ids, a learning rate schedule) and integer ops (shapes) are
    not counted. A set, not counts: a global norm over all gradients
    (``tf.clip_by_global_norm``) has one ``L2Loss`` per variable, fewer with
    packed variables. ``bridge`` maps the input placeholders of a ``tf.cond``
    branch the update runs in to the ``If`` op's inputs outside it: the walk
    goes on there.

    Example:
        >>> gradient_transform(table_update_op, "Adagrad")
        ('Mul(10.0)',)
    """
    ranks = current_world().size
    bridge = bridge or {}
    from_gradient: dict = {}  # op -> whether a gradient op is among its inputs' producers
    found = set()
    stack = [(op, False) for op in _update_inputs(update)]
    while stack:
        op, expanded = stack.pop()
        if op in from_gradient and not expanded:
            continue
        if op in bridge:  # a cond branch's input: its value comes from outside the branch
            op = bridge[op]
            if op in from_gradient:
                continue
        if op.type in _SOURCES or len(from_gradient) >= _MAX_WALK:
            from_gradient[op] = False
            continue
        if _GRADIENT_SCOPE.search(op.name):
            from_gradient[op] = True
            continue
        if not expanded:
            from_gradient[op] = False  # while its inputs are walked (a cycle reads it as not)
            stack.append((op, True))
            stack.extend((t.op, False) for t in op.inputs if t.op not in from_gradient)
            continue
        from_gradient[op] = any(from_gradient.get(bridge.get(t.op, t.op), False) for t in op.inputs)
        if not from_gradient[op] or op.name.startswith(f"{optimizer_scope}/") or _data_parallel(op, ranks):
            continue
        if any(t.dtype.is_floating or t.dtype.is_complex for t in op.outputs):
            found.add(_signature(op))
    return tuple(sorted(found))


def updaters(variable) -> frozenset:
    """The optimizer updates of a graph-mode resource ``variable``: ``(op type, optimizer scope, transform)``.

    Only writes made in an optimizer's ``update_<variable>`` scope count (the
    variable's initializer and other assignments do not). The scope before it
    names the optimizer (``Ftrl``, ``Adagrad_1``, ``DistributedAdagrad``)
    without naming the variable, so a table and the packed variable holding it
    compare equal when one optimizer updates both. The transform is what the
    model_fn did to the gradient on the way (``gradient_transform``). Updates
    inside a ``tf.cond`` (a loss-scale optimizer's, a step skipped when a
    gradient is not finite) are found in its branches.

    Example:
        >>> updaters(table_variable)
        frozenset({('ResourceSparseApplyFtrl', 'Ftrl', ())})
    """
    found = set()
    _find_updates(variable.handle, {}, found, depth=0)
    found.update(_averages(variable))
    return frozenset(found)


_SHADOW_WRITES = ("AssignSubVariableOp", "AssignVariableOp", "AssignAddVariableOp")
_NUMBERED = re.compile(r"_\d+$")


def _averages(variable) -> set:
    """``(MOVING_AVERAGE, scope, ())`` for each variable named under ``variable`` that is written from its value.

    That is a moving average (``ExponentialMovingAverage.apply``: ``emb/embeddings/ExponentialMovingAverage``
    written in ``ExponentialMovingAverage/AssignMovingAvg_3``), or any shadow copy made the same way. The
    scope drops the per-variable number, so a table and the packed variable holding it compare equal when
    one moving average covers both.
    """
    own = variable.op.name + "/"
    found = set()
    frontier = [t for op in variable.handle.consumers() if op.type == "ReadVariableOp" for t in op.outputs]
    seen = set()
    for _ in range(_MAX_SHADOW_HOPS):
        nxt = []
        for tensor in frontier:
            for op in tensor.consumers():
                if op in seen or _GRADIENT_SCOPE.search(op.name):
                    continue
                seen.add(op)
                if op.type in _SHADOW_WRITES and op.inputs[0].op.name.startswith(own):
                    scope = op.name.rsplit("/", 1)[0] if "/" in op.name else ""
                    head, _, last = scope.rpartition("/")
                    found.add((MOVING_AVERAGE, f"{head}/{_NUMBERED.sub('', last)}".strip("/"), ()))
                elif op.type not in _SHADOW_WRITES:
                    nxt.extend(op.outputs)
        frontier = nxt
    return found


def update_counts(variable) -> collections.Counter:
    """How many update ops of each optimizer scope write ``variable`` (outside a ``tf.cond``)."""
    return collections.Counter(
        op.name[: op.name.find("/update_")] for op in variable.handle.consumers() if _is_update(op)
    )


def _find_updates(handle: tf.Tensor, bridge: dict, found: set, depth: int) -> None:
    for op in handle.consumers():
        if _is_update(op):
            scope = op.name[: op.name.find("/update_")]
            found.add((op.type, scope, gradient_transform(op, scope, bridge)))
        elif op.type in ("If", "StatelessIf") and depth < 4:
            inner = dict(bridge)
            branches = cond_v2.get_func_graphs(op)
            for branch in branches:
                for outer, placeholder in zip(op.inputs[1:], branch.inputs):
                    inner[placeholder.op] = outer.op
            for branch in branches:
                for index, outer in enumerate(op.inputs[1:]):
                    if outer is handle:
                        _find_updates(branch.inputs[index], inner, found, depth + 1)


def update_groups(variables: dict) -> dict[str, int]:
    """Table name -> index of its updates (kinds and how many of each) among the distinct ones, first-seen order."""
    kinds: dict[tuple, int] = {}
    return {
        name: kinds.setdefault((updaters(var), frozenset(update_counts(var).items())), len(kinds))
        for name, var in variables.items()
    }


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
            averaged = {k for k in got ^ want if k[0] == MOVING_AVERAGE}
            if averaged and {k for k in got if k[0] != MOVING_AVERAGE} == {k for k in want if k[0] != MOVING_AVERAGE}:
                covers = "covers" if averaged & want else "does not cover"
                raise CaptureError(
                    f"hybridtf.estimator: embedding tables {names} share the packed variable "
                    f"{packed[pt.name].name!r}, but in the plain model_fn a moving average "
                    f"({', '.join(sorted(k[1] for k in averaged))}) {covers} table {m.name!r}, and in the wrapped one "
                    "it does not do the same for the packed variable. The model_fn picks the averaged variables by a "
                    "name or scope the packed variable does not carry (a packed variable is named under its tables' "
                    "shared scope). Pass ExponentialMovingAverage.apply the layers' own variables "
                    "(layer.trainable_variables) or give the averaged tables a variable scope of their own, or keep "
                    f"them unpacked: model_fn(fn, exclude={names})."
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
        _check_once(pt, packed[pt.name], record_variables)


def _check_once(pt, variable, record_variables: dict) -> None:
    """Raises when an optimizer updates the packed variable another number of times per step than its tables.

    Tables updated a different number of times are packed apart (``update_groups``), and the real pass lists
    each packed variable once (``each_packed_variable_once``), so this finds gradients applied from a list
    that repeats it.
    """
    got = update_counts(variable)
    for m in pt.members:
        want = update_counts(record_variables[m.name])
        extra = sorted(f"{scope} ({got.get(scope, 0)} times)" for scope, n in want.items() if got.get(scope, 0) != n)
        if extra:
            names = [x.name for x in pt.members]
            raise CaptureError(
                f"hybridtf.estimator: the wrapped model_fn updates the packed variable {variable.name!r} (tables "
                f"{names}) with {', '.join(extra)} a step, while the plain model_fn updates table {m.name!r} "
                f"{max(want.values(), default=0)} time(s). The model_fn gives the optimizer a variable list made of "
                "several packed layers' variables (each such layer lists the packed variable), and the optimizer "
                "applies each entry. Use a TF1 optimizer's minimize or compute_gradients (hybridtf removes the repeats "
                "there) instead of applying gradients of a list you built, remove repeated variables from the list "
                f"(list({{id(v): v for v in variables}}.values())), or keep these tables unpacked: "
                f"model_fn(fn, exclude={names})."
            )


def _ancestors(tensor) -> set:
    """The ops ``tensor`` is computed from (its graph only)."""
    seen, stack = set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
    return seen


def _whole_reads(variable, ancestors: set) -> int:
    """Reads of all of ``variable`` the loss is computed from: a penalty over it, not a view's rows or a lookup."""
    count = 0
    for op in variable.handle.consumers():
        if op.type != "ReadVariableOp" or op not in ancestors:
            continue
        users = [c for c in op.outputs[0].consumers() if c in ancestors]
        if any(c.type != "StridedSlice" and not c.type.startswith("HybridTF>") for c in users):
            count += 1
    return count


def check_loss_reads(plan, packed: dict, record_variables: dict, record_loss, loss) -> None:
    """Raises unless the loss reads each packed variable as a whole as often as the plain loss reads its tables.

    A term over a whole variable, e.g. ``tf.nn.l2_loss(v)`` over ``layer.trainable_variables`` of several
    layers, reads a packed variable once per layer that lists it, so it would cover all its tables that
    many times; over some layers' variables, tables the plain loss leaves out.
    """
    if record_loss is None or loss is None:
        return
    plain, real = _ancestors(record_loss), _ancestors(loss)
    for pt in plan.packed_tables:
        got = _whole_reads(packed[pt.name], real)
        for m in pt.members:
            want = _whole_reads(record_variables[m.name], plain)
            if got != want:
                names = [x.name for x in pt.members]
                raise CaptureError(
                    f"hybridtf.estimator: the wrapped model_fn's loss reads the packed variable "
                    f"{packed[pt.name].name!r} (tables {names}) as a whole {got} time(s), but the plain model_fn's "
                    f"loss reads table {m.name!r} {want} time(s): a term over whole variables (e.g. "
                    "tf.nn.l2_loss over layer.trainable_variables) that lists the packed variable once per layer "
                    "holding it, or leaves out tables it holds, would cover other rows than the plain loss. Use a "
                    "Keras embeddings_regularizer (packed), or compute the term over "
                    "tf.compat.v1.trainable_variables() (each variable once), or keep these tables unpacked: "
                    f"model_fn(fn, exclude={names}) (a term over a layer's embeddings, "
                    "tf.nn.l2_loss(layer.embeddings), reads the table as a tensor, which also leaves it unpacked)."
                )


@contextlib.contextmanager
def each_packed_variable_once(packed: dict, shared: set):
    """While a pass runs: a variable list given to a TF1 optimizer's ``compute_gradients`` (and so
    ``minimize``), to ``ExponentialMovingAverage.apply`` or to a ``tf.compat.v1.train.Saver`` lists the
    variable holding a table's rows in place of its view, and each packed variable of ``shared`` once;
    a TF1 optimizer's sparse update of rows that are distinct by construction (a packed chain's) skips the
    summing of repeated indices (``distinct_by_construction``).

    A model_fn that trains (or averages, or saves) ``layer_a.trainable_variables + layer_b.trainable_variables``
    lists the packed variable once per layer it holds; the optimizer would apply it that many times a step
    (and a Saver refuses two variables of one name). ``[layer.embeddings for layer in layers]`` lists the
    tables' views, which only the packed variable can stand for there.

    Args:
        packed: packed table name -> its variable (the record pass: none).
        shared: the names of the packed tables of more than one table (a packed variable of one
            table listed twice is the model_fn's own repeat, applied twice as in the plain model_fn).
    """
    repeats = {id(v) for name, v in packed.items() if name in shared}

    def once(var_list, views_as_variables=True):
        if var_list is None or isinstance(var_list, dict):
            return var_list
        seen, kept = set(), []
        for item in tf.nest.flatten(var_list):
            # a view: the variable holding its rows (the table's own in the record pass)
            var = item.packed_variable if views_as_variables and isinstance(item, TableView) else item
            if id(var) in repeats:
                if id(var) in seen:
                    continue
                seen.add(id(var))
            kept.append(var)
        return kept

    optimizer = tf.compat.v1.train.Optimizer
    average = tf.compat.v1.train.ExponentialMovingAverage
    saver = tf.compat.v1.train.Saver
    compute_gradients, apply, saver_init = optimizer.compute_gradients, average.apply, saver.__init__

    def compute_gradients_once(self, loss, var_list=None, *args, **kwargs):
        return compute_gradients(self, loss, once(var_list), *args, **kwargs)

    def apply_once(self, var_list=None):
        return apply(self, once(var_list))

    def saver_init_once(self, var_list=None, *args, **kwargs):
        if packed:  # the real pass: views saved as the plain model_fn's variables (estimator_saver.view_entries)
            return saver_init(self, once(view_entries(var_list), views_as_variables=False), *args, **kwargs)
        return saver_init(self, once(var_list), *args, **kwargs)

    dedup = optimizer._resource_apply_sparse_duplicate_indices

    def apply_sparse(self, grad, handle, indices):
        # The packed chain's gradient rows are one per distinct id already: the summing of repeated
        # indices (a Unique and a segment sum over every row, per variable) would change nothing.
        if packed and distinct_by_construction(indices):
            return self._resource_apply_sparse(grad, handle, indices)
        return dedup(self, grad, handle, indices)

    optimizer.compute_gradients, average.apply, saver.__init__ = compute_gradients_once, apply_once, saver_init_once
    optimizer._resource_apply_sparse_duplicate_indices = apply_sparse
    try:
        yield
    finally:
        optimizer.compute_gradients, average.apply, saver.__init__ = compute_gradients, apply, saver_init
        optimizer._resource_apply_sparse_duplicate_indices = dedup


# Op outputs whose values are distinct by construction: the distinct ids of a packed lookup chain.
_DISTINCT_OUTPUTS = frozenset((("HybridTF>UniquePartition", 0), ("HybridTF>UniqueSubset", 0)))


def distinct_by_construction(indices) -> bool:
    """Whether graph tensor ``indices`` holds distinct values by construction: the distinct ids a
    ``UniquePartition`` / ``UniqueSubset`` op returned (through identities), as the rows a packed
    chain gathers are. Anything else (a concatenation of two lookups' rows, ids received from other
    ranks) is not known to be distinct.

    Example:
        >>> distinct_by_construction(unique_partition(ids, ...).unique_ids)
        True
    """
    tensor = indices
    while isinstance(tensor, tf.Tensor) and tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return isinstance(tensor, tf.Tensor) and (tensor.op.type, tensor.value_index) in _DISTINCT_OUTPUTS


def _reaches(update: tf.Operation, wanted) -> tf.Operation | None:
    """The first op on the way back from ``update`` (and its update scope) to the gradients that ``wanted(op)``."""
    seen, stack = set(), _update_inputs(update)
    while stack and len(seen) < _MAX_WALK:
        op = stack.pop()
        if op in seen or op.type in _SOURCES or op.type.startswith("HybridTF>") or _GRADIENT_SCOPE.search(op.name):
            continue  # (hybridtf's own chain: its alltoall exchanges ids and rows, it averages nothing)
        seen.add(op)
        if wanted(op):
            return op
        stack.extend(t.op for t in op.inputs)
    return None


def _table_updates(variable):
    return [op for op in variable.handle.consumers() if _is_update(op)]


_CLIPS = re.compile(r"(^|/)clip_by_(value|norm|global_norm|average_norm)(_\d+)?/")


def warn_clipped_tables(plan, packed: dict) -> None:
    """Logs once when the model_fn clips the gradient of packed tables (the math differs once clipping acts)."""
    clipped = []
    for pt in plan.packed_tables:
        for update in _table_updates(packed[pt.name]):
            if _reaches(update, lambda op: op.type == "ClipByValue" or bool(_CLIPS.search(op.name))) is not None:
                clipped.extend(m.name for m in pt.members)
                break
    if clipped:
        _log.warning(
            "hybridtf.estimator: the model_fn clips the gradients of packed tables %s. A packed table's gradient "
            "has one summed row per distinct id, the plain model_fn's one row per lookup position: tf.clip_by_value "
            "and the norms of tf.clip_by_norm / tf.clip_by_global_norm see other values, so training differs "
            "once clipping acts (equal while it does not). For the plain math keep these tables unpacked: "
            "model_fn(fn, exclude=[...]).",
            sorted(clipped),
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
