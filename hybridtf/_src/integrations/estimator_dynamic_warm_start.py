"""Estimator ``warm_start_from`` for dynamic (HybridHash) tables of a wrapped model_fn.

TensorFlow's warm start rewrites variable initializers; a HybridHash table has
none. When the Estimator that builds a TRAIN graph warm-starts, each selected
dynamic table gets an import of its entries from the warm-start checkpoint
(``hybridtf_dynamic/<table>/{ids, rows, slots, counts, slot_init, step}``:
rows, optimizer slots, counts and Algorithm 1's step), run by the Scaffold's
``init_fn``, i.e. only when the session starts without a checkpoint of its
own model_dir (exactly when TensorFlow's warm-started initializers run).

Selection follows ``WarmStartSettings.vars_to_warm_start`` applied to the
name ``hybridtf_dynamic/<table>``: a regex (the default ``".*"`` selects every
table) or a list of regexes; ``None`` or a list of variable objects selects
none. As TensorFlow selects only trainable variables with a regex and every
variable with a list, a table selected by a regex gets its ids, rows, counts
and step but no optimizer slots (its optimizer starts them afresh, as the
plain model_fn's fresh slot variables), one selected by a list its slots
too. ``var_name_to_prev_var_name`` maps ``hybridtf_dynamic/<table>`` to the
name the table had in the checkpoint. A selected table missing from the
checkpoint, or stored there with another dim, is a ValueError naming it.
"""

from __future__ import annotations

import re

import tensorflow as tf
from tensorflow.python.training import checkpoint_utils

from hybridtf._src.caching.serving import CHECKPOINT_PREFIX
from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.integrations import estimator_warm_start

PREFIX = CHECKPOINT_PREFIX
FIELDS = ("ids", "rows", "slots", "counts", "slot_init", "step")
_DTYPES = (tf.int64, tf.float32, tf.float32, tf.int64, tf.float32, tf.int64)


def _settings():
    """(the calling Estimator, its own WarmStartSettings), or (None, None)."""
    est = estimator_warm_start._calling_estimator()
    if est is None:
        return None, None
    return est, est.__dict__.get(estimator_warm_start._KEPT, est._warm_start_settings)


def _hide_from_tensorflow(est, settings) -> None:
    """TensorFlow's warm start refuses prev names of variables it does not know: hand it ours without them.

    The Estimator's own settings are kept (``estimator_warm_start._KEPT``), as
    the packed tables' warm start does (which filters the same names again).
    """
    prev = settings.var_name_to_prev_var_name or {}
    if any(k.startswith(PREFIX + "/") for k in prev):
        object.__setattr__(est, estimator_warm_start._KEPT, settings)
        kept = {k: v for k, v in prev.items() if not k.startswith(PREFIX + "/")}
        est._warm_start_settings = settings._replace(var_name_to_prev_var_name=kept or None)


def _selected(vars_to_warm_start, key: str) -> bool:
    if vars_to_warm_start is None:
        return False
    if isinstance(vars_to_warm_start, str):
        return re.match(vars_to_warm_start, key) is not None
    if all(isinstance(v, str) for v in vars_to_warm_start):
        return any(re.match(v, key) is not None for v in vars_to_warm_start)
    return False


def _import_op(owner, path: str, prev: str, available: dict, with_slots: bool = True):
    table = owner.table
    rows = available.get(f"{prev}/rows")
    if rows is None:
        saved = sorted({k.split("/")[1] for k in available if k.startswith(PREFIX + "/")})
        raise ValueError(
            f"hybridtf.estimator warm start: dynamic table {table.name!r} is selected but {path!r} has no "
            f"{prev!r} entries (its dynamic tables: {saved}). Leave it out of vars_to_warm_start, or map it with "
            f"var_name_to_prev_var_name={{'{PREFIX}/{table.name}': '{PREFIX}/<its name there>'}}."
        )
    if len(rows) != 2 or rows[1] != table.config.dim:
        raise ValueError(
            f"hybridtf.estimator warm start: dynamic table {table.name!r} has dim {table.config.dim} but "
            f"{prev!r} in {path!r} has rows of shape {rows}. Warm-start from a table of the same dim."
        )
    with tf.name_scope(f"hybridtf_warm_start/{table.name}"):
        tensors = tf.raw_ops.RestoreV2(
            prefix=path,
            tensor_names=[f"{prev}/{f}" for f in FIELDS],
            shape_and_slices=[""] * len(FIELDS),
            dtypes=list(_DTYPES),
        )
        ids, rows, slots, counts, slot_init, step = tensors
        if not with_slots:  # TensorFlow's regex selects trainable variables: rows, not optimizer state
            slots = tf.zeros(tf.stack([tf.shape(ids)[0], 0, table.config.dim]), tf.float32)
            slot_init = tf.zeros([0], tf.float32)  # the optimizer's first update starts the slots afresh
        world = getattr(table, "world", None)
        if world is not None and world.distributed:  # a whole table: keep the ids this rank owns
            ids, rows, slots, counts = dynamic_exchange.own_part(ids, rows, slots, counts, world)
        return table.import_(ids, rows, slots, counts, slot_init, step)


def apply(spec, owners, mode):
    """``spec`` with a Scaffold whose ``init_fn`` warm-starts the selected dynamic tables (else ``spec``).

    Raises:
        ValueError: a selected table is not in the warm-start checkpoint, or has another dim there.
    """
    if mode != tf.estimator.ModeKeys.TRAIN or not owners:
        return spec
    est, settings = _settings()
    if settings is None:
        return spec
    _hide_from_tensorflow(est, settings)
    path = checkpoint_utils._get_checkpoint_filename(settings.ckpt_to_initialize_from)
    prev_names = settings.var_name_to_prev_var_name or {}
    chosen = [o for o in owners if _selected(settings.vars_to_warm_start, f"{PREFIX}/{o.table.name}")]
    if not chosen:
        return spec
    available = dict(tf.train.list_variables(path))
    ops = []
    for owner in chosen:
        key = f"{PREFIX}/{owner.table.name}"
        # a regex (TensorFlow's default ".*") warm-starts trainable variables only, a list of names every
        # variable it matches, optimizer slots included (as for a static table's slots)
        with_slots = not isinstance(settings.vars_to_warm_start, str)
        ops.append(_import_op(owner, path, prev_names.get(key, key), available, with_slots))
    scaffold = spec.scaffold or tf.compat.v1.train.Scaffold()
    user_init_fn = scaffold._user_init_fn

    def init_fn(scaffold, session):
        if user_init_fn is not None:
            user_init_fn(scaffold, session)
        session.run(ops)

    return spec._replace(scaffold=tf.compat.v1.train.Scaffold(init_fn=init_fn, copy_from_scaffold=scaffold))
