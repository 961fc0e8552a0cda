"""``tf.compat.v1.train.init_from_checkpoint`` of packed tables in a wrapped model_fn.

A TF1 model_fn loads pretrained rows into a Keras ``Embedding`` by mapping a
checkpoint tensor to the layer's variable object:
``init_from_checkpoint(ckpt, {"emb/embeddings": layer.embeddings})``, or a map
built from ``tf.compat.v1.trainable_variables()`` (``{v.op.name: v}``, BERT's
recipe). TensorFlow then replaces the variable's initializer with a restore.
In a wrapped model_fn ``layer.embeddings`` is a view of a packed variable, not
a variable (TensorFlow took it for a scope name and failed), and the record
pass's table variables must keep initializers the real pass can copy.

While each pass runs the model_fn, ``intercepted`` replaces the function (as
``tf.compat.v1.train.init_from_checkpoint`` and in ``checkpoint_utils``): the
entries whose value is a table (its view, or its own variable in the record
pass) are noted per table and left out; TensorFlow gets the others.
``apply`` then makes each packed variable's initializer read the noted
members' rows from their checkpoint tensors (shapes checked), the other rows
keeping their own initial values, as ``warm_start_from`` does. String names
and scopes resolve against ``tf.compat.v1.get_variable``'s variable store,
which never holds a Keras table (in the plain model_fn either) but holds the
model_fn's own ``get_variable`` tables: a name or scope that covers such a
table is expanded here as TensorFlow expands it, the tables noted, the other
variables handed to TensorFlow one by one; other names go to it unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import tensorflow as tf
from tensorflow.python.training import checkpoint_utils

from hybridtf._src.capture.context import CaptureError
from hybridtf._src.integrations.estimator_warm_start import warm_start_rows
from hybridtf._src.rewrite.packed_storage import TableView


@contextlib.contextmanager
def intercepted(table_of: Callable[[object], str | None], noted: dict):
    """Runs the model_fn with ``init_from_checkpoint`` noting table entries into ``noted``.

    Args:
        table_of: the table name an assignment-map value stands for, or None.
        noted: table name -> (checkpoint file or directory, tensor name), filled in.
    """
    original = checkpoint_utils.init_from_checkpoint
    v1_train = tf.compat.v1.train
    exported = v1_train.init_from_checkpoint

    def init_from_checkpoint(ckpt_dir_or_file, assignment_map):
        items = assignment_map.items() if hasattr(assignment_map, "items") else assignment_map
        rest = {}
        for tensor_name, current in items:
            named = _tables_by_name(tensor_name, current, table_of) if isinstance(current, str) else None
            if named is not None:  # a name or scope that covers tables: those noted, the rest one by one
                tables, others = named
                for table, tensor in tables:
                    noted[table] = (ckpt_dir_or_file, tensor)
                rest.update(others)
                continue
            table = table_of(current)
            if table is None:
                rest[tensor_name] = current
                continue
            if tensor_name.endswith("/"):
                raise CaptureError(
                    f"init_from_checkpoint maps scope {tensor_name!r} to embedding table {table!r}: map a table to "
                    "its checkpoint tensor ({'<scope>/embeddings': layer.embeddings})."
                )
            noted[table] = (ckpt_dir_or_file, tensor_name)
        if rest:
            original(ckpt_dir_or_file, rest)

    checkpoint_utils.init_from_checkpoint = init_from_checkpoint
    v1_train.init_from_checkpoint = init_from_checkpoint
    try:
        yield
    finally:
        checkpoint_utils.init_from_checkpoint = original
        v1_train.init_from_checkpoint = exported


def _tables_by_name(tensor_name: str, current: str, table_of) -> tuple[list, dict] | None:
    """A string entry of an assignment map, resolved as TensorFlow resolves it, if it names tables.

    A ``tf.compat.v1.get_variable`` table hybridtf packs sits in the variable store under its own name
    as a table's view (TensorFlow would fail on it). A variable name or a ``"scope/": "scope/"`` map is
    expanded over the store as ``checkpoint_utils._init_from_checkpoint`` does it.

    Returns:
        ``([(table, checkpoint tensor)], {checkpoint tensor: other variable's name})``, or None when the
        entry names no table (TensorFlow gets it unchanged).
    """
    from tensorflow.python.ops import variable_scope

    store = variable_scope._get_default_variable_store()._vars
    if current in store:
        table = table_of(store[current])
        return ([(table, tensor_name)], {}) if table is not None else None
    if not tensor_name.endswith("/"):
        return None  # TensorFlow's own error (a scope mapped to a tensor), or a partitioned variable
    scopes = current[: current.rindex("/")] if "/" in current else ""
    tables, others = [], {}
    for var_name in sorted(store):
        if scopes and not var_name.startswith(scopes + "/"):
            continue
        base = var_name[: var_name.index("/part_")] if "/part_" in var_name else var_name
        full = base[len(scopes) :]
        if current != "/":
            full = full[1:]
        if tensor_name != "/":
            full = tensor_name + full
        full = full[:-1] if full.endswith("/") else full
        table = table_of(store[var_name])
        if table is not None:
            tables.append((table, full))
        else:
            others[full] = base
    return (tables, others) if tables else None


def record_pass_table(variables: Callable[[], dict]) -> Callable[[object], str | None]:
    """The record pass's ``table_of``: a table's view, or its own variable (``variables()``: table -> variable,
    asked when called: the tables are created while the model_fn runs)."""

    def table_of(value):
        if isinstance(value, TableView):
            return value.table
        return next((name for name, var in variables().items() if var is value), None)

    return table_of


def real_pass_table(packed: set) -> Callable[[object], str | None]:
    """The real pass's ``table_of``: the view of a packed table (the others are variables TensorFlow maps)."""
    return lambda value: value.table if isinstance(value, TableView) and value.table in packed else None


def apply(noted: dict, packed: dict, members: dict, keys: dict, shards: dict) -> None:
    """Makes each packed variable's initializer read its noted members from their checkpoints.

    Args:
        noted: table name -> (checkpoint file or directory, tensor name) (``intercepted``).
        packed: packed variable op name -> packed variable.
        members: packed variable op name -> [(checkpoint key, row offset, rows)].
        keys: table name -> its checkpoint key (the plain variable's name).
        shards: packed variable op name -> (ShardLayout, World) of sharded ones.

    Raises:
        ValueError: a tensor is not in its checkpoint, or has another shape than its table.
    """
    by_key = {keys[table]: source for table, source in noted.items() if table in keys}
    for owner, parts in members.items():
        chosen = [key for key, _, _ in parts if key in by_key]
        if not chosen:
            continue
        checkpoints = {}
        for key in chosen:
            checkpoints.setdefault(by_key[key][0], []).append(key)
        for ckpt, keys_here in checkpoints.items():  # one restore per checkpoint, the other rows kept
            ckpt_file = checkpoint_utils._get_checkpoint_filename(ckpt)
            shapes = tf.train.load_checkpoint(ckpt_file).get_variable_to_shape_map()
            names = {key: by_key[key][1] for key in keys_here}
            what, shard = "init_from_checkpoint", shards.get(owner)
            warm_start_rows(packed[owner], parts, set(keys_here), names, ckpt_file, shapes, what, shard)
