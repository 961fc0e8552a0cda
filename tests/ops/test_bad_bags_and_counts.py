"""Malformed multi-hot bags, HybridHash counts and checkpoints: clear errors naming the table, nothing changed.

Found by an adversarial probe: a SparseTensor row index of -1 inside a ``tf.function`` made a
DynamicEmbedding drop the id without a word (a segment sum skips negative segments); a RaggedTensor
built with ``validate=False`` whose splits go backwards inserted its ids before a later op failed, or
returned a result; HybridHash lookup counts near 2**63 wrapped a row's 32-bit count, and an import
clamped negative counts. ``BagSplits`` (``run/bag_splits.py``) validates the bags; the store validates
counts, steps and slot_init.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.caching.table import HybridHashTable, TableConfig
from hybridtf._src.run.bag_splits import bags_from_sparse, checked_bags
from hybridtf._src.run.loader import load_ops


def _sparse(rows, values, nrows, width=3):
    indices = tf.constant([[r, 0] for r in rows], tf.int64) if rows else tf.zeros([0, 2], tf.int64)
    return tf.SparseTensor(indices, tf.constant(values, tf.int64), [nrows, width])


def test_bags_from_sparse_equal_tensorflows_bags():
    sp = tf.sparse.reorder(_sparse([0, 0, 2, 4], [5, 6, 7, 8], 6))
    bags = bags_from_sparse(sp, "t")
    expected = tf.RaggedTensor.from_value_rowids(sp.values, sp.indices[:, 0], nrows=6)
    assert bags.to_list() == expected.to_list() == [[5, 6], [], [7], [], [8], []]
    assert bags_from_sparse(_sparse([], [], 3), "t").to_list() == [[], [], []]


@pytest.mark.parametrize("row", [-1, 4, -(2**63), 2**63 - 1])
def test_sparse_row_outside_the_batch_names_the_table(row):
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=rf"embedding table 'user': .*row index {row} .*dense_shape\[0\] = 4"
    ):
        bags_from_sparse(_sparse([0, row], [1, 2], 4), "user")


def test_unordered_sparse_rows_and_bad_shapes_are_refused():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tf.sparse.reorder"):
        bags_from_sparse(_sparse([2, 1], [1, 2], 4), "t")
    for nrows in (-1, 2**62):
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"dense_shape\[0\] = {nrows}, outside"):
            load_ops().hybrid_tf_bag_splits(
                tf.zeros([0], tf.int64), tf.zeros([0], tf.int64), nrows, kind="row_ids", table="t"
            )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"2 values but 1 row indices"):
        load_ops().hybrid_tf_bag_splits(
            tf.constant([1, 2], tf.int64), tf.constant([0], tf.int64), 3, kind="row_ids", table="t"
        )


@pytest.mark.parametrize(
    "splits, message",
    [
        ([0, 2**62, 2], r"row_splits\[1\] = 4611686018427387904 > row_splits\[2\] = 2"),
        ([0, 2, 1, 2], r"row_splits\[1\] = 2 > row_splits\[2\] = 1"),
        ([1, 2], r"row_splits\[0\] = 1, not 0"),
        ([0, 1], r"the last one is 1 but there are 2 values"),
    ],
)
def test_bad_ragged_splits_name_the_table(splits, message):
    ids = tf.RaggedTensor.from_row_splits(tf.constant([1, 2], tf.int64), tf.constant(splits, tf.int64), validate=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"embedding table 'item': .*{message}.*validate=True"):
        checked_bags(ids, "item")


def test_valid_ragged_bags_pass_through():
    ids = tf.ragged.constant([[1, 2], [], [3]], dtype=tf.int64)
    assert checked_bags(ids, "t").to_list() == [[1, 2], [], [3]]
    ids32 = tf.RaggedTensor.from_row_splits(tf.constant([4], tf.int32), tf.constant([0, 0, 1], tf.int32))
    out = checked_bags(ids32, "t")
    assert out.to_list() == [[], [4]] and out.row_splits.dtype == tf.int32


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("row", [-1, 5])
def test_dynamic_embedding_refuses_a_sparse_row_outside_the_batch_in_a_function(row, training):
    """The case that was silent: row -1 inside a tf.function gave zeros, the id dropped."""
    layer = htf.layers.DynamicEmbedding(2, hot_rows=4, combiner="sum", name="clicks")

    @tf.function
    def step(sp):
        return layer(sp, training=training)

    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"embedding table 'clicks': .*row index {row}"):
        step(_sparse([row], [7], 2, width=2))
    assert layer.table.stats()["size"] == 0


@pytest.mark.parametrize("splits", [[0, 2**62, 2], [0, 2, 1, 2]])
def test_dynamic_embedding_refuses_bad_ragged_splits_before_inserting(splits):
    layer = htf.layers.DynamicEmbedding(2, hot_rows=4, combiner="sum", name="hist")
    ids = tf.RaggedTensor.from_row_splits(tf.constant([1, 2], tf.int64), tf.constant(splits, tf.int64), validate=False)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"embedding table 'hist': the RaggedTensor of ids has invalid"
    ):
        layer(ids, training=True)
    assert layer.table.stats()["size"] == 0  # nothing inserted
    good = layer(tf.ragged.constant([[1, 2], [2]], dtype=tf.int64), training=True)
    assert good.shape == (2, 2) and layer.table.stats()["size"] == 2


def test_embedding_bag_names_the_table_for_a_sparse_row_outside_the_batch():
    layer = htf.layers.EmbeddingBag(10, 2, combiner="sum", name="tags")

    @tf.function
    def call(sp):
        return layer(sp)

    for run in (layer, call):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"embedding table 'tags': .*row index -1"):
            run(_sparse([-1], [1], 2, width=2))
    np.testing.assert_array_equal(layer(_sparse([1], [3], 2, width=2)).numpy()[0], [0.0, 0.0])


def _table():
    table = HybridHashTable(TableConfig("counted", dim=2, hot_rows=1))
    table.lookup(tf.constant([1, 2], tf.int64), counts=tf.constant([10, 10], tf.int64), insert=True)
    return table


@pytest.mark.parametrize("counts", [[2**63 - 1, 1], [1, 2**32], [-1, 1], [1, -(2**62)]])
def test_lookup_counts_outside_32_bits_are_refused_and_change_nothing(counts):
    table = _table()
    before = table.stats()
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"'counted': counts\[\d\] = -?\d+ is outside \[0, 4294967295\]"
    ):
        load_ops().hybrid_tf_hybrid_hash_lookup(
            table.resource_handle,
            tf.constant([1, 2], tf.int64),
            tf.constant(counts, tf.int64),
            tf.zeros([0], tf.int64),
            dim=2,
            insert=True,
        )
    assert table.export()[3].numpy().tolist() == [10, 10]
    assert table.stats()["occurrences"] == before["occurrences"]
    table.lookup(tf.constant([1], tf.int64), counts=tf.constant([2**32 - 11], tf.int64), insert=True)  # the largest sum
    assert sorted(table.export()[3].numpy().tolist()) == [10, 2**32 - 1]


def test_import_refuses_counts_and_steps_outside_32_bits_and_names_slot_init():
    table = _table()
    ids, rows, slots, counts, slot_init, step = table.export()
    for bad in ([2**63 - 1, 1], [1, -3]):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"the checkpoint's counts\[\d\] = -?\d+ is outside"):
            table.import_(ids, rows, slots, tf.constant(bad, tf.int64), slot_init, step)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"the checkpoint's step 4611686018427387904 is outside \[0, 4294967295\]"
    ):
        table.import_(ids, rows, slots, counts, slot_init, tf.constant(2**62, tf.int64))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"slots hold 0 optimizer slot\(s\) per row but its slot_init has 5"
    ):
        table.import_(ids, rows, slots, counts, tf.zeros([5]), step)
    assert table.export()[3].numpy().tolist() == [10, 10]  # nothing changed


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"hot_rows": 2**63}, r"'a': hot_rows = 9223372036854775808 does not fit int64"),
        ({"capacity": 2**63}, r"'a': capacity = 9223372036854775808 does not fit int64"),
        ({"ttl_steps": 2**63}, r"'a': ttl_steps = 9223372036854775808 does not fit int64"),
        ({"warmup_steps": 1.9}, r"'a': warmup_steps must be an int, got 1\.9"),  # was truncated to 1
        ({"flush_every": 2.5}, r"'a': flush_every must be an int, got 2\.5"),
        ({"ttl_steps": 0.5}, r"'a': ttl_steps must be an int, got 0\.5"),
        ({"seed": "abc"}, r"'a': seed must be an int, got 'abc'"),
        ({"embeddings_initializer": tf.keras.initializers.Constant([1.0, 2.0])}, r"Constant initializer .* one number"),
    ],
)
def test_dynamic_embedding_settings_are_whole_int64_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        htf.layers.DynamicEmbedding(2, **{"hot_rows": 1, **kwargs}, name="a")


def test_numpy_integer_settings_are_accepted_and_oversized_sizes_named():
    layer = htf.layers.DynamicEmbedding(np.int64(2), hot_rows=np.int32(4), warmup_steps=np.int64(1), seed=np.int64(3))
    assert layer(tf.constant([[1]], tf.int64), training=True).shape == (1, 1, 2)
    bag = htf.layers.EmbeddingBag(np.int64(10), np.int32(2))  # was "input_dim must be a positive int, got 10"
    assert bag.input_dim == 10 and type(bag.input_dim) is int
    with pytest.raises(
        ValueError, match=r"input_dim must be a positive int \(at most 2\*\*63 - 1\), got 9223372036854775808"
    ):
        htf.layers.EmbeddingBag(2**63, 2)
    with pytest.raises(ValueError, match=r"'t': num_rows must be a positive int \(at most 2\*\*63 - 1\)"):
        htf.embedding.TableConfig("t", 2**63, 4)


def test_stitch_combine_in_a_function_names_a_short_field_sizes():
    rows, inverse = tf.constant([[1.0, 1.0], [2.0, 2.0]]), tf.constant([0, 1, 1])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def combine(sizes):
        return htf.ops.stitch_combine(rows, inverse, sizes, ["none", "sum"])

    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"field_sizes and field_segments need num_fields = 2 entries, got 1"
    ):
        combine(tf.constant([3], tf.int64))
    out = combine(tf.constant([1, 2], tf.int64))
    np.testing.assert_array_equal(out[1].numpy(), [[2.0, 2.0], [2.0, 2.0]])  # bags of one id each
