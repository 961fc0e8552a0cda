"""The packed variables of an Estimator model_fn's real pass.

Each packed variable is created in the real graph, initialized from copies of
its member tables' own initializers (the record pass's initial values, copied
by ``estimator_graph.copy_to_graph``; under Horovod only this rank's rows of a
sharded table), and named in the name scope its tables share
(``packed_storage.shared_scope``) and ending as theirs do
(``wide/packed_1d_float32_model/embeddings``), so that a model_fn choosing
each optimizer's variables by scope or name picks it with its tables.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hybridtf._src.capture.context import CaptureError
from hybridtf._src.distribute.layout import ShardLayout
from hybridtf._src.distribute.world import current_world
from hybridtf._src.integrations import estimator_graph as graph_util
from hybridtf._src.integrations.horovod_hooks import LOCAL_VARIABLES
from hybridtf._src.plan.packing import PackingPlan
from hybridtf._src.rewrite.packed_storage import PackedTables, shared_scope


def _own_slice(layout: ShardLayout, world) -> slice:
    """Positions of ``world.rank``'s rows in ``layout.gather_order(0, num_rows)`` (rank-ordered)."""
    start = sum(layout.local_rows(r) for r in range(world.rank))
    return slice(start, start + layout.local_rows(world.rank))


def _initial_values(plan: PackingPlan, tables: dict, op_map, source, target) -> dict:
    """Packed table name -> its initial value in ``target``: the members' initializers, copied and concatenated."""
    inits = {}
    for pt in plan.packed_tables:
        parts = []
        for m in pt.members:
            init = tables[m.name].initial_value
            problem = graph_util.liftable_problem([init], op_map, allow_random=True)
            if problem is not None:
                raise CaptureError(
                    f"hybridtf.estimator: the initial value of embedding table {m.name!r} cannot be computed "
                    f"in the real graph: {problem}. Use a Keras initializer or a constant."
                )
            parts.append(graph_util.copy_to_graph([init], op_map, source, target, "hybridtf_init")[0])
        with target.as_default(), tf.name_scope("hybridtf"):
            inits[pt.name] = tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]
    return inits


def create(plan: PackingPlan, tables: dict, op_map, source, target) -> PackedTables:
    """The packed variables of ``plan`` in graph ``target``.

    Args:
        plan: the packing plan.
        tables: table name -> its own variable in the record pass's graph ``source``.
        op_map: the record pass's stand-in inputs -> the real ones (for copying initializers).
        source: the record pass's graph.
        target: the real graph.

    Returns:
        The ``PackedTables`` (sharded variables also in the graph's ``LOCAL_VARIABLES``).
    """
    inits = _initial_values(plan, tables, op_map, source, target)
    world = current_world()
    scopes = {pt.name: shared_scope([tables[m.name].name for m in pt.members]) for pt in plan.packed_tables}

    def substitute(next_creator, **kwargs):
        name = kwargs.get("name")
        if name not in inits:
            return next_creator(**kwargs)
        full = inits[name]
        if plan.placement(name, world.size) == "sharded":  # this rank's rows, in local order
            layout = ShardLayout(plan.packed_table(name).num_rows, world.size, plan.shard_strategy)
            full = tf.gather(full, layout.gather_order(0, layout.num_rows)[_own_slice(layout, world)])
        given = tuple(np.shape(kwargs["initial_value"]))
        if given != tuple(full.shape.as_list()):
            raise CaptureError(
                f"hybridtf.estimator: packed table {name!r} is stored with shape {given} here but its "
                f"initial value has shape {tuple(full.shape.as_list())}."
            )
        kwargs["initial_value"] = full
        # Named as its tables' variables end ("wide/packed_1d_float32_model/embeddings"), so that a model_fn
        # picking variables by name ("embeddings" in v.name) finds it with them.
        kwargs["name"] = "embeddings"
        if not scopes[name]:
            with tf.name_scope(name):  # under the enclosing "hybridtf" scope
                return next_creator(**kwargs)
        with tf.name_scope(f"{scopes[name]}/{name}/"):  # an absolute scope: "wide/packed_1d_float32_model/"
            return next_creator(**kwargs)

    # PackedTables takes arrays in graph mode: zero-stride stand-ins, replaced by the copied initializers.
    stand_ins = {}
    for pt in plan.packed_tables:
        for m in pt.members:
            stand_ins[m.name] = np.broadcast_to(np.zeros((), pt.dtype), (m.num_rows, pt.dim))
    with target.as_default(), tf.name_scope("hybridtf"), tf.variable_creator_scope(substitute):
        storage = PackedTables(plan, stand_ins)
    for var in storage.sharded_variables():  # rank-local: kept out of broadcasts and allreduces
        tf.compat.v1.add_to_collection(LOCAL_VARIABLES, var)
    return storage
