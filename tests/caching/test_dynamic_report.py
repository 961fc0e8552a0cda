"""Dynamic-table metrics in ``hybridtf.report``: ``dynamic_tables``, the ``--dynamic`` section and its JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
import hybridtf.report as htf_report
from hybridtf._src.report_dynamic import _zipf_hashed_ids


def test_section_reports_sizes_hit_ratios_inserts_and_evictions():
    section = htf_report.dynamic_section(steps=12, batch=64, dim=4, vocab=2000, seed=3)
    rng = np.random.default_rng(3)  # the section's ids, drawn again: the table holds every distinct one
    ids = {f: _zipf_hashed_ids(rng, 2000, 12 * 64) for f in ("user", "item")}
    assert set(section.tables) == {"user_hash", "item_hash"}
    for field, m in zip(("user", "item"), section.tables.values()):
        assert m["size"] == m["inserts"] == len(np.unique(ids[field])) and m["evictions"] == 0
        assert m["step"] == 12 and m["flushes"] == 2 and m["hot_used"] == m["hot_rows"] == 100
        assert 0 < m["hit_ratio"] <= 1 and 0 < m["hit_ratio_cumulative"] < 1
        assert m["bytes_per_row"] is None and m["bytes"] > 0  # a few hundred rows: a chunk's bytes, not a row's
    text = str(section)
    assert "hit ratio (cumulative)" in text and "user_hash" in text and "evictions" in text
    assert "'-' under 8,192 rows" in text


def test_bytes_per_row_of_a_table_of_many_rows_is_near_its_rows_and_slots():
    tables = htf.embedding.Tables([htf.embedding.DynamicTableConfig("t", 8, hot_rows=16)])
    tables.lookup("t", tf.range(20_000, dtype=tf.int64))
    m = htf_report.dynamic_tables(tables)["t"]
    assert m["size"] == 20_000 and 8 * 4 < m["bytes_per_row"] < 4 * 8 * 4  # rows (no slots yet) + bookkeeping


def test_command_prints_the_section_as_json(capsys):
    assert htf_report.main(["--model", "none", "--dynamic", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tables = out["dynamic_tables"]["tables"]
    assert out["dynamic_tables"]["steps"] == 3 and tables["user_hash"]["size"] > 0


def test_dynamic_tables_of_tables_layers_and_evictions():
    tables = htf.embedding.Tables([htf.embedding.DynamicTableConfig("t", 2, hot_rows=2, capacity=64)])
    for start in range(0, 100, 20):  # 5 steps of 20 new ids: the table must evict from the 4th on
        tables.lookup("t", tf.range(start, start + 20, dtype=tf.int64))
        tables.dynamic_tables["t"].table.end_step()
    m = htf_report.dynamic_tables(tables)["t"]
    assert m["size"] <= 64 and m["evictions"] == 100 - m["size"] and m["inserts"] == 100
    layer = htf.layers.DynamicEmbedding(2, name="lay", hot_rows=2)
    assert htf_report.dynamic_tables(layer) == {}  # not built yet
    layer(tf.constant([1, 2], tf.int64), training=True)
    assert htf_report.dynamic_tables(layer)["lay"]["size"] == 2
    with pytest.raises(TypeError, match="dynamic_tables takes"):
        htf_report.dynamic_tables(object())


def test_report_of_a_user_model_holds_its_dynamic_tables():
    ids = tf.keras.Input(shape=(), dtype=tf.int64, name="ids")
    dense = tf.keras.Input(shape=(2,), name="numeric")
    emb = htf.layers.DynamicEmbedding(4, hot_rows=8, name="user_hash")(ids)
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Concatenate()([emb, dense]))
    model = tf.keras.Model({"ids": ids, "numeric": dense}, out)
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1)), loss="binary_crossentropy")
    x = {"ids": np.array([5, 2**62, 5, 7], np.int64), "numeric": np.zeros((4, 2), np.float32)}
    model.fit(x, np.ones((4, 1), np.float32), batch_size=4, epochs=2, verbose=0)
    rep = htf_report.report(model, (x, np.ones((4, 1), np.float32)))
    table = rep.dynamic_tables["user_hash"]
    assert table["size"] == table["inserts"] == 3 and table["evictions"] == 0
    assert "dynamic tables (HybridHash): 1" in str(rep) and "user_hash: 3 rows" in str(rep)
    assert htf_report.Report.from_json(rep.to_json()) == rep


def _dynamic_only_model():
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64, name="ids")
    fields = [
        tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(4, hot_rows=8, name=name)(ids[:, f : f + 1]))
        for f, name in enumerate(("user", "item"))
    ]
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Concatenate()(fields))
    return tf.keras.Model(ids, out)


def test_a_model_with_only_dynamic_tables_reports_its_store_traffic_and_timing():
    """Packed into one HybridHash store and nothing static: the report says optimized, names the store and its
    members (text and JSON), estimates the ranks' traffic, and the timing counts the store's chain."""
    model = htf.keras.optimize(_dynamic_only_model())
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    x, y = np.array([[5, 2**62], [7, 5], [9, 11], [5, 3]], np.int64), np.ones((4, 1), np.float32)
    timing = htf_report.step_timing(model, (x, y), steps=1)
    assert set(timing.chain_seconds) == {"hybridtf_dynamic_d4"} and timing.chains_total > 0
    rep = htf_report.report(model, (x, y), num_ranks=2)
    assert rep.optimized and "(optimized by hybridtf)" in str(rep)
    assert rep.dynamic_plan == ({"name": "hybridtf_dynamic_d4", "dim": 4, "members": ["user", "item"]},)
    assert "hybridtf_dynamic_d4 (dim 4: user, item)" in str(rep)
    assert rep.communication["tables"]["hybridtf_dynamic_d4"]["placement"] == "sharded by id (dynamic)"
    assert rep.dynamic_tables["user"]["size"] == 3 + 4  # the timed steps' (member, id) pairs, per store
    assert htf_report.Report.from_json(rep.to_json()) == rep


def test_a_model_with_nothing_packable_is_reported_and_timed():
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    table = tf.keras.layers.Embedding(10, 2, embeddings_constraint="non_neg")  # left unpacked, with the reason
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(table(ids))))
    model = htf.keras.optimize(model)
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.array([[1], [2]], np.int64), np.ones((2, 1), np.float32)
    assert htf_report.step_timing(model, (x, y), steps=1).chain_seconds == {}
    rep = htf_report.report(model, (x, y))
    assert rep.optimized and "nothing packed" in str(rep) and len(rep.skipped) == 1
