"""HybridTF>PackIds: packing several fields' ids, and the out-of-vocabulary error naming the table."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.run.pack_ids import pack_ids


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(1, 1000), st.sampled_from([(), (0,), (7,), (3, 4), (2, 1, 5)])), min_size=1,
                max_size=6), st.integers(0, 2**31 - 1), st.booleans())  # fmt: skip
def test_matches_numpy(fields, seed, int32):
    rng = np.random.default_rng(seed)
    ids, offsets, rows, offset = [], [], [], 0
    for vocab, shape in fields:
        ids.append(rng.integers(0, vocab, size=shape).astype(np.int32 if int32 else np.int64))
        offsets.append(offset)
        rows.append(vocab)
        offset += vocab
    packed, sizes = pack_ids(ids, offsets, rows, [f"t{i}" for i in range(len(ids))])
    expected = np.concatenate([i.reshape(-1).astype(np.int64) + o for i, o in zip(ids, offsets)])
    np.testing.assert_array_equal(packed.numpy(), expected)
    np.testing.assert_array_equal(sizes.numpy(), [i.size for i in ids])


def test_static_shapes_in_graph():
    @tf.function
    def fn(a, b):
        packed, sizes = pack_ids([a, b], [0, 4], [4, 4], ["a", "b"])
        assert packed.shape.as_list() == [5] and sizes.shape.as_list() == [2]
        return packed

    fn(tf.constant([1, 2]), tf.constant([[0, 1, 3]]))


@pytest.mark.parametrize("bad", [7, -1])
def test_out_of_vocabulary_names_the_table(bad):
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"embedding table 'user_id' got id {bad} \(flat position 1 of its ids\), "
        r"outside its vocabulary \[0, 7\)",
    ):
        pack_ids([[0, 1], [[3, bad]]], [0, 2], [2, 7], ["item", "user_id"])


def test_argument_errors():
    with pytest.raises(ValueError, match="give one of each per field"):
        pack_ids([[1]], [0, 1], [2], ["a"])
    with pytest.raises(TypeError, match="ids of table 'a' must be int32 or int64"):
        pack_ids([[1.0]], [0], [2], ["a"])
    with pytest.raises(ValueError, match="at least one field"):
        pack_ids([], [], [], [])


def test_count_mode_replaces_and_counts_invalid_ids():
    packed, sizes, invalid = pack_ids(
        [tf.constant([0, 5, -1], tf.int64), tf.constant([[2, 9]], tf.int32)],
        [0, 4],
        [4, 3],
        ["a", "b"],
        on_invalid="count",
    )
    assert packed.numpy().tolist() == [0, 0, 0, 6, 4]  # invalid ids -> the table's first row
    assert sizes.numpy().tolist() == [3, 2]
    assert invalid.numpy().tolist() == [2, 1]


def test_count_mode_of_valid_ids_matches_error_mode():
    ids = [tf.constant([3, 1]), tf.constant([0, 0, 2])]
    p1, s1 = pack_ids(ids, [0, 4], [4, 3], ["a", "b"])
    p2, s2, invalid = pack_ids(ids, [0, 4], [4, 3], ["a", "b"], on_invalid="count")
    assert p1.numpy().tolist() == p2.numpy().tolist() and s1.numpy().tolist() == s2.numpy().tolist()
    assert invalid.numpy().tolist() == [0, 0]
    with pytest.raises(ValueError, match="on_invalid"):
        pack_ids(ids, [0, 4], [4, 3], ["a", "b"], on_invalid="ignore")
