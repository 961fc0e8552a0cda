"""hybridtf.report: op counts of the training step (nested functions included), the report and its JSON."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

import hybridtf as htf
import hybridtf.report as htf_report
from hybridtf._src.models import ctr_data, ctr_models
from hybridtf._src.plan.packing import PackingPlan

N_FIELDS = 12
N_DENSE = 2
BATCH = 8


def _fields():
    return ctr_data.criteo_like_fields(dim=4, max_vocab=50)[:N_FIELDS]


def _batch():
    x, y = ctr_data.generate_batch(_fields(), N_DENSE, BATCH, 0, seed=5)
    return ctr_data.to_tensors(x), tf.constant(y)


def _model(batch, optimize=False, **optimize_kwargs):
    model = ctr_models.wide_and_deep(_fields(), N_DENSE, hidden=(4,), seed=3)
    model(batch[0])
    if optimize:
        model = htf.keras.optimize(model, **optimize_kwargs)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return model


@pytest.fixture(scope="module")
def models():
    batch = _batch()
    return batch, _model(batch), _model(batch, optimize=True, exclude=["emb_C1"])


def _check_counts(ops):
    assert ops["total"] > 0 and ops["grappler_total"] > 0, ops.get("grappler_error")
    assert ops["total"] == sum(ops["by_type"].values())
    assert ops["grappler_total"] == sum(ops["grappler_by_type"].values())
    assert not set(ops["by_type"]) & (htf_report.PLUMBING_OPS | {"PartitionedCall", "StatefulPartitionedCall"})
    assert ops["nodes"] > ops["total"]  # plumbing exists but is not counted


def test_optimized_model_has_fewer_training_ops(models):
    batch, plain, optimized = models
    plain_ops = htf_report.count_ops(plain, batch)
    optimized_ops = htf_report.count_ops(optimized, batch)
    _check_counts(plain_ops)
    _check_counts(optimized_ops)
    assert optimized_ops["total"] < plain_ops["total"]
    assert optimized_ops["grappler_total"] < plain_ops["grappler_total"]
    # The plain step dedups each table's gradient (a Unique per table); the packed step runs one fused
    # UniquePartition per packed table instead.
    assert plain_ops["by_type"]["Unique"] >= 2 * N_FIELDS
    # (or, for a packed table whose ids another chain already deduplicates, one UniqueSubset)
    by_type = optimized_ops["grappler_by_type"]
    shared = len(optimized.hybridtf_shared_uniques)
    assert by_type["HybridTF>UniquePartition"] == len(optimized.hybridtf_plan.packed_tables) - shared
    assert by_type.get("HybridTF>UniqueSubset", 0) == shared


def test_counts_are_deterministic(models):
    batch, plain, optimized = models
    for model in (plain, optimized):
        first = htf_report.count_ops(model, batch)
        again = htf_report.count_ops(model, batch)
        assert first == again
    rebuilt = htf_report.count_ops(_model(batch, optimize=True, exclude=["emb_C1"]), batch)
    assert rebuilt == htf_report.count_ops(optimized, batch)


def test_count_ops_takes_batch_spec_or_dataset(models):
    batch, plain, _ = models
    spec = tf.nest.map_structure(tf.type_spec_from_value, batch)
    dataset = tf.data.Dataset.from_tensors(batch)
    by_batch = htf_report.count_ops(plain, batch, grappler=False)
    assert by_batch["grappler_total"] is None
    assert htf_report.count_ops(plain, spec, grappler=False) == by_batch
    assert htf_report.count_ops(plain, dataset, grappler=False) == by_batch


def test_count_ops_leaves_the_train_function_alone(models):
    batch, plain, _ = models
    plain.train_on_batch(*batch)
    before = plain.train_function
    htf_report.count_ops(plain, batch, grappler=False)
    assert plain.train_function is before


def test_count_ops_needs_a_compiled_model():
    batch = _batch()
    model = ctr_models.wide_and_deep(_fields(), N_DENSE, hidden=(4,), seed=3)
    model(batch[0])
    with pytest.raises(ValueError, match="compile"):
        htf_report.count_ops(model, batch)


def test_nested_function_bodies_are_counted_per_call():
    @tf.function
    def inner(x):
        return tf.sin(x) * 2.0 + 1.0  # Sin, Mul, AddV2 (+ Const, Identity: plumbing)

    @tf.function
    def outer(x):
        return inner(inner(x)) - 3.0  # two calls of inner, one Sub

    @tf.function
    def outermost(x):
        return tf.exp(outer(x))

    spec = tf.TensorSpec([4], tf.float32)
    counts = htf_report.count_graph_ops(outer.get_concrete_function(spec))
    assert counts["by_type"] == {"Sin": 2, "Mul": 2, "AddV2": 2, "Sub": 1}
    assert counts["total"] == 7 and counts["function_calls"] == 2
    deeper = htf_report.count_graph_ops(outermost.get_concrete_function(spec))
    assert deeper["by_type"] == {"Sin": 2, "Mul": 2, "AddV2": 2, "Sub": 1, "Exp": 1}
    assert deeper["function_calls"] == 3
    # The top-level graph alone has only the call nodes: the bodies live in its function library.
    graph_def = outermost.get_concrete_function(spec).graph.as_graph_def()
    assert "Sin" not in {n.op for n in graph_def.node}
    assert len(graph_def.library.function) == 2


def test_both_branches_of_a_cond_are_counted():
    @tf.function
    def f(x):
        return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.sin(x), lambda: tf.cos(x))

    counts = htf_report.count_graph_ops(f.get_concrete_function(tf.TensorSpec([3], tf.float32)))
    assert counts["by_type"]["Sin"] == 1 and counts["by_type"]["Cos"] == 1
    assert counts["function_calls"] == 2


def test_count_graph_ops_rejects_a_python_function():
    with pytest.raises(TypeError, match="get_concrete_function"):
        htf_report.count_graph_ops(tf.function(lambda x: x))


def test_report_json_round_trip_keeps_plan_and_skipped_layers(models):
    batch, plain, optimized = models
    r = htf_report.report(optimized, batch, baseline=plain)
    d = json.loads(r.to_json())
    assert d["plan"] == optimized.hybridtf_plan.to_dict()
    assert PackingPlan.from_dict(d["plan"]) == optimized.hybridtf_plan
    assert any(s["name"] == "emb_C1" and s["reason"].startswith("excluded by user") for s in d["skipped"])
    assert d["fused_concats"] == optimized.hybridtf_fused_concats == ["deep_concat", "concat"]
    # the deep packed table's lookups use the wide table's ids (emb_C1 is excluded: C1's wide lookup
    # is in the wide packed table, but the deep one is not packed)
    assert d["shared_uniques"] == optimized.hybridtf_shared_uniques and len(d["shared_uniques"]) == 1
    assert "UniqueSubset" in str(r) and " <- " in str(r)
    assert d["ops"]["total"] == r.ops["total"] and d["baseline_ops"]["total"] == r.baseline_ops["total"]
    assert 0 < d["ops_ratio"] < 1 and 0 < d["grappler_ops_ratio"] < 1
    assert htf_report.Report.from_json(r.to_json()) == r

    totals = d["table_totals"]
    fields = _fields()
    assert totals["model_tables"] == 2 * N_FIELDS  # emb_<field> and wide_<field>
    assert totals["unpacked_tables"] == 1  # emb_C1, excluded
    assert totals["packed_tables"] == len(optimized.hybridtf_plan.packed_tables)
    assert totals["params"] == sum(f.vocab * (f.dim + 1) for f in fields)
    assert totals["bytes"] == 4 * totals["params"]


def test_report_text_shows_ops_plan_tables_and_skipped(models):
    batch, plain, optimized = models
    text = str(htf_report.report(optimized, batch, baseline=plain))
    assert str(optimized.hybridtf_plan) in text
    assert "after Grappler" in text and "ratio" in text
    assert "emb_C1: excluded by user" in text
    assert "Concatenate layers fused with the lookups (StitchConcat): deep_concat, concat" in text
    for packed in optimized.hybridtf_plan.packed_tables:
        assert packed.name in text


def test_report_of_a_plain_model_lists_every_table_unpacked(models):
    batch, plain, _ = models
    r = htf_report.report(plain, batch)
    assert not r.optimized and r.plan is None and r.baseline_ops is None and r.ops_ratio is None
    assert r.table_totals()["unpacked_tables"] == 2 * N_FIELDS
    assert "no packing plan" in str(r)


@pytest.mark.parametrize("labels", ["synthesized", "list", "dict"])
def test_report_of_a_multi_input_multi_output_model(labels):
    """Lists in the batch (a multi-input model's inputs, a multi-output model's labels) are structures, not values."""
    import numpy as np

    ids = [tf.keras.Input((1,), dtype="int64", name=f"f{i}") for i in range(2)]
    emb = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(10, 4)(x)) for x in ids]
    h = tf.keras.layers.Concatenate()(emb)
    model = tf.keras.Model(ids, [tf.keras.layers.Dense(1, name="ctr")(h), tf.keras.layers.Dense(1, name="cvr")(h)])
    model = htf.keras.optimize(model)
    model.compile("adam", ["mse", "mse"])
    x = [np.zeros((8, 1), "int64")] * 2
    y = {"list": [np.zeros((8, 1), "float32")] * 2, "dict": {"ctr": np.zeros((8, 1), "float32")} | {"cvr": 0 * x[0]}}
    report = htf_report.report(model, None if labels == "synthesized" else (x, y[labels]))
    assert report.optimized and report.ops["total"] > 0 and report.plan is not None


def test_report_of_something_that_is_not_a_keras_model_names_the_alternative():
    from hybridtf.embedding import TableConfig, Tables

    for thing in (42, Tables([TableConfig("a", 10, 4)])):
        with pytest.raises(TypeError, match=r"must be a tf\.keras\.Model.*count_graph_ops"):
            htf_report.report(thing)


def test_report_on_two_ranks_of_a_subclassed_model_whose_call_takes_no_training_argument():
    """Keras calls such a model without ``training``; so must the bytes-per-rank estimate."""
    import numpy as np

    class NoTraining(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = tf.keras.layers.Embedding(20, 4)
            self.out = tf.keras.layers.Dense(1)

        def call(self, x):
            return self.out(tf.reduce_sum(self.emb(x), axis=1))

    x = np.arange(16, dtype="int64").reshape(8, 2)
    model = NoTraining()
    model(x)
    model = htf.keras.optimize(model)
    model.compile("adagrad", "mse")
    report = htf_report.report(model, (x, np.zeros((8, 1), "float32")), num_ranks=2)
    assert report.optimized and report.communication["num_ranks"] == 2
    assert not report.communication["ids_one_value"] and "pass a batch of real ids" not in str(report)
    # the synthetic batch's ids are all 0: its traffic is no estimate of real data's, and the report says so
    synthetic = htf_report.report(model, num_ranks=2)
    assert synthetic.communication["ids_one_value"] and "pass a batch of real ids" in str(synthetic)
    assert htf_report.Report.from_json(synthetic.to_json()) == synthetic


@pytest.mark.parametrize(
    ("num_ranks", "match"), [(2.5, "must be an int"), (True, "must be an int"), (-3, "must be >= 1")]
)
def test_report_refuses_a_bad_num_ranks_and_an_uncompiled_baseline(models, num_ranks, match):
    batch, _, optimized = models
    with pytest.raises(ValueError, match=f"num_ranks {match}"):
        htf_report.report(optimized, batch, num_ranks=num_ranks)
    uncompiled = ctr_models.wide_and_deep(_fields(), N_DENSE, hidden=(4,), seed=3)
    uncompiled(batch[0])
    with pytest.raises(ValueError, match=r"the baseline model is not compiled; compile it"):
        htf_report.report(optimized, batch, baseline=uncompiled)


def test_report_lists_the_factorization_machine_fusion():
    batch = _batch()
    model = ctr_models.deepfm(_fields(), N_DENSE, hidden=(4,), seed=3)
    model(batch[0])
    model = htf.keras.optimize(model)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    r = htf_report.report(model, batch)
    assert r.other_fusions["fm"] == model.hybridtf_fused_fm != []
    assert f"factorization-machine cross terms fused (StitchFM): {', '.join(model.hybridtf_fused_fm)}" in str(r)
    assert htf_report.Report.from_json(r.to_json()) == r
