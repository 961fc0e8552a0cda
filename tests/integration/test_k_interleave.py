"""K-interleaving: control dependencies between groups of packed chains, same numbers.

The traced step of ``optimize(model, interleave_groups=2)`` has, for every
chain stage of group 1 (pack / unique / stitch), control inputs from the same
stage of group 0; excluded tables have none. Losses are bit-identical to the
un-interleaved model (same kernels, only the order in which they may start
changes), in Keras and in ``hybridtf.function``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.plan.interleaving import InterleavingPlan
from hybridtf._src.run.gather_rows import OP_NAME as GATHER
from tests.integration.step_ops import step_graph
from tests.integration.test_micro_batch import FIELDS, _batches, dlrm, wide_and_deep

STEPS = 10


def _model(build, **options):
    model = build()
    model(_batches(1)[0][0])
    model = htf.keras.optimize(model, max_shards=1, **options)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return model


def _train(model, batches):
    return np.array([model.train_on_batch(x, y) for x, y in batches])


def _control_edges(graph, plan):
    """(group of the op, group of its control input) for ops in packed tables' name scopes."""

    def group(op):
        parts = op.name.split("/")
        for g, members in enumerate(plan.groups):
            if any(m in parts for m in members.members):
                return g
        return None

    edges = set()
    for op in graph.get_operations():
        for dep in op.control_inputs:
            a, b = group(op), group(dep)
            if a is not None and b is not None and a != b:
                edges.add((a, b))
    return edges


# DLRM's tables all have dim 8: force two packed tables so that there are two chains to interleave.
DLRM_TWO = {"first": ["emb_f0", "emb_f1"], "second": ["emb_f2", "emb_f3", "emb_f4"]}


@pytest.mark.parametrize(
    "build, options", [(wide_and_deep, {}), (dlrm, {"force_groups": DLRM_TWO})], ids=["wdl", "dlrm"]
)
def test_groups_get_control_dependencies_and_same_losses(build, options):
    batches = _batches(STEPS)
    plain = _model(build, **options)
    grouped = _model(build, interleave_groups=2, **options)
    plan = grouped.hybridtf_interleaving
    assert plan.num_groups == 2 and plan.source == "num_groups"
    assert _control_edges(step_graph(plain, batches), plan) == set()
    edges = _control_edges(step_graph(grouped, batches), plan)
    assert edges == {(1, 0)}
    np.testing.assert_array_equal(_train(grouped, batches[1:]), _train(plain, batches[1:]))


def test_excluded_embedding_has_no_control_dependencies():
    batches = _batches(2)
    model = _model(wide_and_deep, interleave_groups=2, interleave_exclude=["wide_f0"])
    plan = model.hybridtf_interleaving
    assert plan.excluded == (model.hybridtf_plan.location("wide_f0")[0],)
    assert plan.num_groups == 1  # only the deep table is left
    assert _control_edges(step_graph(model, batches), plan) == set()
    with pytest.raises(KeyError, match="nope"):
        _model(wide_and_deep, interleave_groups=2, interleave_exclude=["nope"])


def test_plan_given_as_json_and_stage_order():
    batches = _batches(2)
    model = _model(wide_and_deep, interleave_groups=2)
    plan = InterleavingPlan.from_json(model.hybridtf_interleaving.to_json())
    again = _model(wide_and_deep, interleave_groups=plan)
    assert again.hybridtf_interleaving.groups == plan.groups
    graph = step_graph(again, batches)
    first = set(plan.groups[0].members)
    second = set(plan.groups[1].members)
    # every PackIds/UniquePartition/GatherRows of group 1 waits (through its inputs' control edges) for the
    # same op type of group 0
    checked = 0
    for op in graph.get_operations():
        if op.type in ("HybridTF>PackIds", "HybridTF>UniquePartition", GATHER) and second & set(op.name.split("/")):
            before = {a.type for a in _ancestors(op) if first & set(a.name.split("/"))}
            assert op.type in before, f"{op.name} does not wait for the {op.type} of group 0"
            checked += 1
    assert checked == 3
    # stitching waits for nothing: a fused-away StitchCombine must stay prunable
    assert not [op for op in graph.get_operations() if op.type.startswith("HybridTF>Stitch") and op.control_inputs]


def _ancestors(op):
    seen, todo = {}, [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in seen:
                seen[parent.name] = parent
                todo.append(parent)
    return list(seen.values())


def test_hybridtf_function_uses_the_groups():
    batches = _batches(STEPS)
    results = []
    for groups in (None, 2):
        model = _model(wide_and_deep, interleave_groups=groups)
        opt = model.optimizer
        loss_fn = tf.keras.losses.BinaryCrossentropy()

        @htf.function
        def step(x, y, model=model, opt=opt, loss_fn=loss_fn):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            variables = model.trainable_variables
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        results.append(np.array([step(x, y).numpy() for x, y in batches]))
    np.testing.assert_array_equal(results[1], results[0])
    assert len(FIELDS) == 5


def test_estimator_model_fn_groups(tmp_path):
    from hybridtf._src.integrations.estimator_hooks import report_of
    from tests.integration import test_estimator as est_test

    losses = {}
    for groups in (None, 2):
        fn = htf.estimator.model_fn(est_test.wdl_model_fn, interleave_groups=groups)
        _, losses[groups] = est_test._train(fn, tmp_path / f"g{groups}", 15)
        graph = tf.Graph()
        with graph.as_default():
            feats, labels = tf.compat.v1.data.make_one_shot_iterator(est_test.input_fn()).get_next()
            tf.compat.v1.train.get_or_create_global_step()
            fn(feats, labels, tf.estimator.ModeKeys.TRAIN)
        waits = [
            op.name
            for op in graph.get_operations()
            if op.type == "HybridTF>PackIds" and any(d.type == "HybridTF>PackIds" for d in op.control_inputs)
        ]
        assert len(waits) == (0 if groups is None else 1), waits
        summary = report_of(graph).summary()  # what StatsHook logs at begin
        assert ("2 K-interleaving groups" in summary) == (groups == 2), summary
    np.testing.assert_array_equal(losses[2], losses[None])


def test_report_shows_groups_excluded_and_micro_batches():
    import hybridtf.report

    batches = _batches(1)
    model = _model(wide_and_deep, interleave_groups=2, micro_batches=2, interleave_from="mlp")
    rep = hybridtf.report.report(model, batches[0])
    assert rep.interleaving == model.hybridtf_interleaving.to_dict()
    assert hybridtf.report.Report.from_json(rep.to_json()) == rep
    text = str(rep)
    assert "2 K-interleaving groups" in text and "group 1:" in text
    assert "D-interleaving from 'mlp': 2 micro-batches" in text
    excluded = _model(wide_and_deep, interleave_groups=2, interleave_exclude=["wide_f0"])
    assert "excluded (no control dependencies): packed_1d" in str(hybridtf.report.report(excluded, batches[0]))
