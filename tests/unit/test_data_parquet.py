"""hybridtf.data.parquet_dataset: every row read exactly once over 1, 2 and 3 ranks, exact batches, clear errors."""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf import data as hd
from hybridtf._src.data.parquet import plan_chunks, resolve_rank

SPEC = hd.FeatureSpec(label="label", dense=["d_float", "d_int"], one_hot=["row", "cat"], multi_hot=["bag"])


def make_files(directory, rows_per_file, row_group_rows=16, seed=0, first_row=0, **write_kw):
    """Writes one file per entry of ``rows_per_file``; returns (paths, {row id: expected values})."""
    rng = np.random.default_rng(seed)
    paths, expected = [], {}
    row = first_row
    for i, n in enumerate(rows_per_file):
        ids = np.arange(row, row + n, dtype=np.int64)
        cols = {
            "label": rng.integers(0, 2, n).astype(np.float32),
            "d_float": rng.normal(size=n).astype(np.float32),
            "d_int": rng.integers(-1000, 1000, n).astype(np.int32),
            "row": ids,
            "cat": rng.integers(0, 2**62, n, dtype=np.int64),
            "bag": [rng.integers(0, 2**40, rng.integers(0, 4)).astype(np.int64) for _ in range(n)],
            "unused": np.full(n, "text"),
        }
        path = os.path.join(directory, f"part-{i:03d}.parquet")
        hd.write_parquet(path, cols, SPEC, row_group_rows=row_group_rows, **write_kw)
        paths.append(path)
        for j in range(n):
            expected[int(ids[j])] = (
                cols["label"][j],
                (cols["d_float"][j], np.float32(cols["d_int"][j])),
                cols["cat"][j],
                tuple(cols["bag"][j].tolist()),
            )
        row += n
    return paths, expected


def read_rows(ds):
    """[(row id, values)] and the batch sizes of a dataset of SPEC."""
    rows, sizes = [], []
    for features, labels in ds:
        sizes.append(int(labels.shape[0]))
        bags = features["bag"].to_list()
        for j, row in enumerate(features["row"].numpy()):
            dense = features["dense"][j].numpy()
            values = (labels[j].numpy(), (dense[0], dense[1]), features["cat"][j].numpy(), tuple(bags[j]))
            rows.append((int(row), values))
    return rows, sizes


def check_round_trip(paths, expected, batch_size, size, drop_remainder, **kw):
    total = len(expected)
    seen = collections.Counter()
    steps = []
    for rank in range(size):
        ds = hd.parquet_dataset(
            paths, spec=SPEC, batch_size=batch_size, rank=rank, size=size, drop_remainder=drop_remainder, **kw
        )
        rows, sizes = read_rows(ds)
        assert int(ds.cardinality()) == len(sizes)
        begin, end, batches = hd.shard_rows(total, batch_size, rank, size, drop_remainder)
        assert len(sizes) == batches
        assert sum(sizes) == end - begin
        assert all(s == batch_size for s in sizes[:-1])
        if drop_remainder:
            assert all(s == batch_size for s in sizes)
        for row, values in rows:
            seen[row] += 1
            want = expected[row]
            assert values[0] == want[0] and values[2] == want[2] and values[3] == want[3], row
            np.testing.assert_array_equal(values[1], want[1])
        if not kw.get("shuffle"):
            assert [r for r, _ in rows] == sorted(r for r, _ in rows), "unshuffled rows come in file order"
        steps.append(len(sizes))
    assert max(seen.values(), default=1) == 1, "a row was read twice"
    if drop_remainder:
        assert len(set(steps)) == 1, "drop_remainder gives every rank the same number of steps"
        assert sum(seen.values()) == size * (total // (size * batch_size)) * batch_size
    else:
        assert set(seen) == set(expected), "every row is read"


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize(
    ("rows_per_file", "batch_size", "row_group_rows"),
    [([103], 8, 16), ([40, 0, 37, 26], 7, 10), ([5, 3], 16, 4)],
    ids=["one-file", "four-files-one-empty", "batch-larger-than-files"],
)
def test_every_row_exactly_once(tmp_path, rows_per_file, batch_size, row_group_rows, size, drop_remainder):
    paths, expected = make_files(tmp_path, rows_per_file, row_group_rows)
    check_round_trip(paths, expected, batch_size, size, drop_remainder, read_rows=12)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows_per_file=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    batch_size=st.integers(1, 25),
    size=st.integers(1, 3),
    drop_remainder=st.booleans(),
    row_group_rows=st.integers(1, 20),
    read_rows=st.integers(1, 30),
    shuffle=st.booleans(),
)
def test_every_row_exactly_once_property(
    rows_per_file, batch_size, size, drop_remainder, row_group_rows, read_rows, shuffle
):
    with tempfile.TemporaryDirectory() as d:
        paths, expected = make_files(d, rows_per_file, row_group_rows, seed=len(rows_per_file))
        check_round_trip(
            paths, expected, batch_size, size, drop_remainder, read_rows=read_rows, shuffle=shuffle, seed=3
        )


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.lists(st.integers(0, 30), max_size=4), min_size=1, max_size=4),
    batch_size=st.integers(1, 20),
    size=st.integers(1, 5),
    drop_remainder=st.booleans(),
    read_rows=st.integers(1, 25),
)
def test_shard_plan_tiles_rows(groups, batch_size, size, drop_remainder, read_rows):
    total = sum(map(sum, groups))
    shards = [hd.shard_rows(total, batch_size, r, size, drop_remainder) for r in range(size)]
    if drop_remainder:
        assert {b for _, _, b in shards} == {total // (size * batch_size)}
    else:
        assert [s[0] for s in shards[1:]] == [s[1] for s in shards[:-1]]
        assert shards[0][0] == 0 and shards[-1][1] == total
        assert max(e - b for b, e, _ in shards) - min(e - b for b, e, _ in shards) <= 1
    starts = np.cumsum([0] + [sum(g) for g in groups])
    bounds = [set(starts[f] + np.cumsum([0, *g])) for f, g in enumerate(groups)]
    for begin, end, _ in shards:
        covered = []
        for f, a, b in plan_chunks(groups, begin, end, read_rows):
            assert 0 < b - a <= read_rows
            # a chunk never crosses a row group: no boundary strictly inside it
            assert not any(starts[f] + a < x < starts[f] + b for x in bounds[f])
            covered.extend(range(starts[f] + a, starts[f] + b))
        assert covered == list(range(begin, end))


def test_drop_remainder_gives_static_batch_dimension(tmp_path):
    paths, _ = make_files(tmp_path, [50])
    ds = hd.parquet_dataset(paths, spec=SPEC, batch_size=8, drop_remainder=True)
    features, labels = ds.element_spec
    assert labels.shape == [8]
    assert features["dense"].shape == [8, 2] and features["row"].shape == [8]
    assert isinstance(features["bag"], tf.RaggedTensorSpec) and features["bag"].shape.as_list() == [8, None]
    assert features["bag"].dtype == tf.int64 and features["cat"].dtype == tf.int64
    assert int(ds.cardinality()) == 6
    loose = hd.parquet_dataset(paths, spec=SPEC, batch_size=8)
    assert loose.element_spec[1].shape.as_list() == [None]
    assert [int(lab.shape[0]) for _, lab in loose] == [8] * 6 + [2]


def test_an_input_without_batches_or_with_uneven_ranks_is_named_in_a_warning(tmp_path, caplog):
    # Keras's fit on an empty dataset only says "Expected input data to be non-empty"; uneven ranks leave one
    # Horovod rank waiting in a collective step
    for name in ("empty", "some"):
        (tmp_path / name).mkdir()
    empty, _ = make_files(tmp_path / "empty", [0])
    some, _ = make_files(tmp_path / "some", [5])
    cases = [
        (dict(paths=empty, batch_size=4), "holds no rows"),
        (dict(paths=some, batch_size=8, drop_remainder=True), "give rank 0 of 1 no batch of 8"),
        (dict(paths=some, batch_size=2, rank=1, size=2), "rank 0: 1, rank 1: 2 of 2 rows each"),
        # many ranks: counted in closed form (a loop over 2**70 ranks never ended), summarized
        (dict(paths=some, batch_size=1, rank=0, size=2**70), "give rank 0 of 1180591620717411303424 no batch"),
        (dict(paths=some, batch_size=1, rank=3, size=20), "0 or 1 per rank over 20 ranks of 1 rows each"),
    ]
    for kwargs, message in cases:
        caplog.clear()
        with caplog.at_level("WARNING", logger="hybridtf"):
            hd.parquet_dataset(spec=SPEC, **kwargs)
        assert message in caplog.text, (kwargs, caplog.text)
    caplog.clear()
    with caplog.at_level("WARNING", logger="hybridtf"):
        hd.parquet_dataset(some, spec=SPEC, batch_size=2, rank=1, size=2, drop_remainder=True)
    assert "hybridtf.data" not in caplog.text


def test_empty_bags_and_large_ids_survive(tmp_path):
    path = str(tmp_path / "bags.parquet")
    bags = [[], [2**62 + 5], [], [0, 1, 1, 7], []]
    spec = hd.FeatureSpec(label=None, multi_hot=["bag"])
    hd.write_parquet(path, {"bag": bags}, spec)
    (features,) = list(hd.parquet_dataset(path, spec=spec, batch_size=5))
    assert features["bag"].to_list() == bags
    assert features["bag"].row_lengths().numpy().tolist() == [0, 1, 0, 4, 0]


def test_multi_hot_column_larger_than_a_data_page_reads_back_exactly(tmp_path):
    # > 1 MiB of distinct bags per column chunk: past Arrow's default dictionary limit, where
    # tensorflow-io 0.36 misread the PLAIN pages Arrow falls back to.
    rng = np.random.default_rng(3)
    bags = [rng.integers(0, 2**40, size=rng.integers(0, 30)).tolist() for _ in range(20_000)]
    spec = hd.FeatureSpec(label=None, multi_hot=["bag"])
    path = str(tmp_path / "big_bags.parquet")
    hd.write_parquet(path, {"bag": bags}, spec)
    got = [b for features in hd.parquet_dataset(path, spec=spec, batch_size=4096) for b in features["bag"].to_list()]
    assert got == bags


def test_shuffle_reads_every_row_once_in_a_new_order_each_epoch(tmp_path):
    paths, expected = make_files(tmp_path, [60, 45], row_group_rows=20)
    ds = hd.parquet_dataset(paths, spec=SPEC, batch_size=10, shuffle=True, seed=7)
    epochs = [[r for r, _ in read_rows(ds)[0]] for _ in range(2)]
    for order in epochs:
        assert sorted(order) == sorted(expected)
        assert order != sorted(order)
    assert epochs[0] != epochs[1], "each epoch is shuffled anew"
    again = hd.parquet_dataset(paths, spec=SPEC, batch_size=10, shuffle=True, seed=7)
    assert [r for r, _ in read_rows(again)[0]] == epochs[0], "the same seed gives the same order"


def test_dense_key_none_and_no_label(tmp_path):
    paths, expected = make_files(tmp_path, [9])
    ds = hd.parquet_dataset(
        paths, label=None, dense=["d_int", "d_float"], one_hot=["row"], dense_key=None, batch_size=4
    )
    assert isinstance(ds.element_spec, dict)
    batches = list(ds)
    assert sorted(batches[0]) == ["d_float", "d_int", "row"]
    for f in batches:
        assert f["d_int"].dtype == tf.float32 and f["d_int"].shape.rank == 1
        for row, d_int, d_float in zip(f["row"].numpy(), f["d_int"].numpy(), f["d_float"].numpy()):
            assert (d_float, d_int) == expected[row][1]
    stacked = next(iter(hd.parquet_dataset(paths, dense=["d_int", "d_float"], one_hot=["row"], batch_size=9)))[0]
    np.testing.assert_array_equal(stacked["dense"][:, 0], [expected[r][1][1] for r in range(9)])


def test_spec_read_from_file_and_paths_forms(tmp_path):
    paths, _ = make_files(tmp_path, [7, 6])
    assert hd.read_feature_spec(paths[0]) == SPEC
    for given_paths in (str(tmp_path), str(tmp_path / "*.parquet"), paths, [tmp_path / "part-000.parquet"]):
        ds = hd.parquet_dataset(given_paths, spec=SPEC, batch_size=5)
        rows = [r for r, _ in read_rows(ds)[0]]
        want = 7 if isinstance(given_paths, list) and len(given_paths) == 1 else 13
        assert rows == list(range(want))


def test_plain_pyarrow_files_with_nullable_columns(tmp_path):
    """Files not written by hybridtf (nullable columns, no spec) read fine when they hold no nulls."""
    path = str(tmp_path / "plain.parquet")
    table = pa.table({"y": [1, 0, 1], "f": [0.5, 1.5, 2.5], "c": pa.array([3, 4, 5], pa.int32())})
    pq.write_table(table, path, compression="snappy")
    features, labels = next(iter(hd.parquet_dataset(path, label="y", dense=["f"], one_hot=["c"], batch_size=3)))
    assert labels.numpy().tolist() == [1.0, 0.0, 1.0]
    assert features["c"].dtype == tf.int64 and features["c"].numpy().tolist() == [3, 4, 5]
    assert features["dense"].numpy()[:, 0].tolist() == [0.5, 1.5, 2.5]


def test_a_top_level_column_named_with_a_dot_reads_and_a_nested_one_is_named_missing(tmp_path):
    path = str(tmp_path / "dotted.parquet")
    table = pa.table({"y": [1, 0], "user.id": pa.array([7, 9], pa.int64()), "s": [{"a": 1}, {"a": 2}]})
    pq.write_table(table, path)
    features, _ = next(iter(hd.parquet_dataset(path, label="y", one_hot=["user.id"], batch_size=2)))
    assert features["user.id"].numpy().tolist() == [7, 9]
    with pytest.raises(ValueError, match=r"one_hot column 's\.a' is not in"):
        hd.parquet_dataset(path, label="y", one_hot=["s.a"], batch_size=2)
    # a top-level "s.x" next to a struct s with a field x: the same path (tensorflow-io read the struct's values)
    clash = str(tmp_path / "clash.parquet")
    pq.write_table(pa.table({"y": [1, 0], "s": [{"x": 100}, {"x": 200}], "s.x": pa.array([1, 2], pa.int64())}), clash)
    with pytest.raises(hd.ParquetSchemaError, match=r"'s\.x' of .*clash.parquet has the same path as a nested field"):
        hd.parquet_dataset(clash, label="y", one_hot=["s.x"], batch_size=2)


@pytest.mark.parametrize("compression", ["lz4", "snappy", "zstd", "none"])
def test_compressions_round_trip(tmp_path, compression):
    paths, expected = make_files(tmp_path, [30], row_group_rows=8, compression=compression)
    check_round_trip(paths, expected, batch_size=7, size=2, drop_remainder=False)


def test_rewritten_file_is_read_anew(tmp_path):
    """tensorflow-io caches readers per key; a file rewritten in place must not be read through a stale one."""
    path = str(tmp_path / "x.parquet")
    spec = hd.FeatureSpec(label=None, one_hot=["c"])
    hd.write_parquet(path, {"c": np.arange(8)}, spec)
    assert next(iter(hd.parquet_dataset(path, spec=spec, batch_size=8)))["c"].numpy().tolist() == list(range(8))
    hd.write_parquet(path, {"c": np.arange(8) + 100}, spec)
    assert next(iter(hd.parquet_dataset(path, spec=spec, batch_size=8)))["c"].numpy().tolist() == list(range(100, 108))


@pytest.mark.parametrize("change", ["rewrite", "remove"])
def test_a_file_changed_after_the_dataset_was_built_is_an_error_not_an_abort(tmp_path, change):
    """tensorflow-io reading the new bytes with the old row groups would abort the process (a C++ exception)."""
    path = str(tmp_path / "x.parquet")
    spec = hd.FeatureSpec(label=None, one_hot=["c"])
    hd.write_parquet(path, {"c": np.arange(1000)}, spec)
    ds = hd.parquet_dataset(path, spec=spec, batch_size=100)
    if change == "rewrite":
        hd.write_parquet(path, {"c": np.arange(10) + 5000}, spec)
    else:
        os.remove(path)
    word = "rewritten" if change == "rewrite" else "removed"
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"x.parquet' was {word} after parquet_dataset was built"):
        list(ds)


def test_a_multi_hot_column_written_without_a_dictionary_is_refused_naming_the_fix(tmp_path):
    """tensorflow-io misread such a column (717 of 3,000 rows got other ids, silently; found by a probe)."""
    rng = np.random.default_rng(1)
    bags = [rng.integers(0, 2**40, int(rng.integers(0, 4))).tolist() for _ in range(3000)]
    table = pa.table({"mh": hd.encode_multi_hot(bags)})
    spec = hd.FeatureSpec(label=None, multi_hot=["mh"])
    plain, encoded = str(tmp_path / "plain.parquet"), str(tmp_path / "encoded.parquet")
    pq.write_table(table, plain, use_dictionary=False, data_page_size=8192)
    with pytest.raises(hd.ColumnTypeError, match=r"'mh' of .*plain.parquet is written without dictionary encoding"):
        hd.parquet_dataset(plain, spec=spec, batch_size=512)
    pq.write_table(table, encoded, data_page_size=8192)  # pyarrow's default: dictionary-encoded
    got = [b for features in hd.parquet_dataset(encoded, spec=spec, batch_size=512) for b in features["mh"].to_list()]
    assert got == bags


def test_a_directory_leaves_out_hidden_and_underscore_files(tmp_path):
    """A writer's temporary copy (".part-0.parquet.inprogress.parquet", "_tmp.parquet") is not read twice."""
    paths, _ = make_files(tmp_path, [5])
    for name in (".part-000.parquet.inprogress.parquet", "_tmp.parquet"):
        with open(paths[0], "rb") as src, open(tmp_path / name, "wb") as dst:
            dst.write(src.read())
    ds = hd.parquet_dataset(str(tmp_path), spec=SPEC, batch_size=4)
    assert [r for r, _ in read_rows(ds)[0]] == list(range(5))


def test_file_system_paths(tmp_path):
    """Any TensorFlow file system works, here the in-memory ram://."""
    paths, _ = make_files(tmp_path, [11])
    tf.io.gfile.makedirs("ram://hybridtf_data_test/")
    tf.io.gfile.copy(paths[0], "ram://hybridtf_data_test/a.parquet", overwrite=True)
    ds = hd.parquet_dataset("ram://hybridtf_data_test/*.parquet", spec=SPEC, batch_size=4)
    assert [r for r, _ in read_rows(ds)[0]] == list(range(11))


def test_rank_and_size_from_horovod(tmp_path, monkeypatch):
    paths, _ = make_files(tmp_path, [10])
    monkeypatch.delitem(sys.modules, "horovod.tensorflow", raising=False)
    assert resolve_rank(None, None) == (0, 1)  # Horovod not imported: one process
    fake = types.SimpleNamespace(is_initialized=lambda: True, rank=lambda: 1, size=lambda: 2)
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", fake)
    assert resolve_rank(None, None) == (1, 2)
    rows = [r for r, _ in read_rows(hd.parquet_dataset(paths, spec=SPEC, batch_size=4))[0]]
    assert rows == [5, 6, 7, 8, 9]
    fake.is_initialized = lambda: False
    assert resolve_rank(None, None) == (0, 1)


# ----------------------------------------------------------------------------- errors


@pytest.fixture
def good_file(tmp_path):
    return make_files(tmp_path, [6])[0][0]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(one_hot=["rwo"]), hd.ParquetSchemaError, r"one_hot column 'rwo' is not in .*part-000.parquet.*'row'"),
        (dict(label="click"), hd.ParquetSchemaError, r"label column 'click' is not in"),
        (dict(one_hot=["unused"]), hd.ColumnTypeError, r"'unused' .* holds strings .*hash_strings"),
        (dict(one_hot=["d_float"]), hd.ColumnTypeError, r"one-hot columns hold integer ids"),
        (dict(dense=["unused"]), hd.ColumnTypeError, r"dense columns must be numeric"),
        (dict(multi_hot=["row"]), hd.ColumnTypeError, r"multi-hot columns are binary columns"),
        (dict(dense=["row"], one_hot=["row"]), ValueError, r"'row' is requested as dense and as one_hot"),
        (dict(batch_size=0), ValueError, r"batch_size must be a positive int"),
        (dict(batch_size=-3), ValueError, r"batch_size must be a positive int"),
        (dict(batch_size=True), ValueError, r"batch_size must be a positive int"),
        (dict(batch_size=2**63), ValueError, r"batch_size must be a positive int \(at most 2\*\*63 - 1\)"),
        (dict(batch_size=np.uint64(2**63 + 5)), ValueError, r"batch_size must be a positive int \(at most"),
        (dict(read_rows=2**64), ValueError, r"read_rows must be a positive int \(at most 2\*\*63 - 1\)"),
        (dict(rank=2, size=2), ValueError, r"rank must be in \[0, size\)"),
        (dict(rank=-1, size=2), ValueError, r"rank must be in \[0, size\)"),
        (dict(rank=0, size=0), ValueError, r"size must be >= 1"),
        (dict(rank=1), ValueError, r"give both rank and size"),
        (dict(spec=SPEC, dense=["d_int"]), ValueError, r"either spec or"),
        (dict(dense=["d_int"], dense_key="row", one_hot=["row"]), ValueError, r"dense_key 'row' is also a column"),
    ],
)
def test_argument_and_column_errors(good_file, kwargs, error, match):
    kw = dict(batch_size=4)
    kw.update(kwargs)
    with pytest.raises(error, match=match) as raised:
        hd.parquet_dataset(good_file, **kw)
    assert isinstance(raised.value, hd.DataError)  # every hybridtf.data error, as the data guide says


def test_an_existing_file_with_glob_characters_in_its_name_is_read_literally(tmp_path):
    """As a pattern, 'part[1].parquet' names 'part1.parquet' and 'day?.parquet' also 'day1.parquet': other rows."""
    for name, value in (("part[1].parquet", 111), ("part1.parquet", 999), ("day?.parquet", 5), ("day1.parquet", 1)):
        pq.write_table(pa.table({"label": [1.0], "C1": [value]}), str(tmp_path / name))

    def ids(path):
        return [
            int(v) for f, _ in hd.parquet_dataset(str(tmp_path / path), one_hot=["C1"], batch_size=8) for v in f["C1"]
        ]

    assert ids("part[1].parquet") == [111] and ids("day?.parquet") == [5]
    assert ids("day[0-9].parquet") == [1]  # a pattern that is no file still expands


def test_a_file_with_a_repeated_column_name_is_a_schema_error(tmp_path):
    path = str(tmp_path / "dup.parquet")
    arrays = [pa.array([1.0], pa.float32()), pa.array([1], pa.int64()), pa.array([3], pa.int64())]
    pq.write_table(pa.Table.from_arrays(arrays, names=["label", "C1", "C1"]), path)
    with pytest.raises(hd.ParquetSchemaError, match=r"dup.parquet' has more than one column named 'C1'.*unique"):
        hd.parquet_dataset(path, one_hot=["C1"], batch_size=2)


def test_list_column_as_multi_hot_explains_the_layout(tmp_path):
    path = str(tmp_path / "lists.parquet")
    pq.write_table(pa.table({"label": [1.0, 0.0], "tags": pa.array([[1, 2], []], pa.list_(pa.int64()))}), path)
    with pytest.raises(hd.ColumnTypeError, match=r"'tags' .* list column .*not aligned to rows.*encode_multi_hot"):
        hd.parquet_dataset(path, multi_hot=["tags"], batch_size=2)


def test_unsigned_64_bit_ids_are_refused(tmp_path):
    path = str(tmp_path / "u64.parquet")
    pq.write_table(pa.table({"label": [1.0], "c": pa.array([2**63 + 1], pa.uint64())}), path)
    with pytest.raises(hd.ColumnTypeError, match=r"'c' .* uint64.*Write it as int64"):
        hd.parquet_dataset(path, one_hot=["c"], batch_size=2)


@pytest.mark.parametrize("statistics", [True, False])
def test_nulls_are_refused(tmp_path, statistics):
    path = str(tmp_path / "nulls.parquet")
    table = pa.table({"label": [1.0, 0.0, 1.0], "c": pa.array([1, None, 3], pa.int64())})
    pq.write_table(table, path, write_statistics=statistics)
    with pytest.raises(hd.ParquetSchemaError, match=r"one_hot column 'c' of .* has 1 null value.*fill_null"):
        hd.parquet_dataset(path, one_hot=["c"], batch_size=2)


def test_type_differing_between_files(tmp_path):
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"label": [1.0], "c": pa.array([1], pa.int64())}), a)
    pq.write_table(pa.table({"label": [1.0], "c": pa.array([1], pa.int32())}), b)
    with pytest.raises(hd.ParquetSchemaError, match=r"'c' is INT64 in .*a.parquet but INT32 in .*b.parquet"):
        hd.parquet_dataset([a, b], one_hot=["c"], batch_size=2)


def test_file_errors(tmp_path, good_file):
    with pytest.raises(ValueError, match="at least one Parquet file"):
        hd.parquet_dataset([], batch_size=2)
    with pytest.raises(hd.ParquetFileError, match=r"'.*nope.parquet' does not exist") as info:
        hd.parquet_dataset(str(tmp_path / "nope.parquet"), batch_size=2)
    assert isinstance(info.value, OSError)
    text = tmp_path / "notes.parquet"
    text.write_text("label,c\n1,2\n")
    with pytest.raises(hd.ParquetFileError, match=r"notes.parquet' is not a readable Parquet file"):
        hd.parquet_dataset(str(text), batch_size=2)
    with pytest.raises(hd.ParquetFileError, match="no file matches"):
        hd.parquet_dataset(str(tmp_path / "*.nothing"), batch_size=2)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(hd.ParquetFileError, match=r"contains no '\*.parquet' files"):
        hd.parquet_dataset(str(empty_dir), batch_size=2)
    with pytest.raises(ValueError, match="listed more than once"):
        hd.parquet_dataset([good_file, good_file], spec=SPEC, batch_size=2)
    with pytest.raises(hd.ParquetSchemaError, match="carries no hybridtf feature spec"):
        pq.write_table(pa.table({"x": [1]}), str(tmp_path / "plain.parquet"))
        hd.read_feature_spec(str(tmp_path / "plain.parquet"))


def test_corrupt_multi_hot_value_fails_with_the_column_name(tmp_path):
    path = str(tmp_path / "bad.parquet")
    spec = hd.FeatureSpec(label=None, multi_hot=["bag"])
    hd.write_parquet(path, {"bag": pa.array([b"\x01" * 8, b"\x01" * 5], pa.binary())}, spec)
    ds = hd.parquet_dataset(path, spec=spec, batch_size=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"multi-hot column bag: .*not a multiple of 8 bytes"):
        list(ds)


def test_encode_decode_multi_hot():
    bags = [[1, 2**63 - 1], [], None, [5]]
    arr = hd.encode_multi_hot(bags)
    assert [len(v) for v in arr.to_pylist()] == [16, 0, 0, 8]
    assert [b.tolist() for b in hd.decode_multi_hot(arr)] == [[1, 2**63 - 1], [], [], [5]]
    lists = pa.array([[3, 4], None, [], [9]], pa.list_(pa.int32()))
    assert [b.tolist() for b in hd.decode_multi_hot(hd.encode_multi_hot(lists))] == [[3, 4], [], [], [9]]
    with pytest.raises(TypeError, match="integer sequences"):
        hd.encode_multi_hot([[0.5]])
    with pytest.raises(ValueError, match="not a multiple of 8"):
        hd.decode_multi_hot([b"abc"])
    with pytest.raises(ValueError, match="2 multi-hot ids are null"):
        hd.encode_multi_hot(pa.array([[1, None], [None], [2]], pa.list_(pa.int64())))
    big = pa.array([[2**63 + 5], [1]], pa.list_(pa.uint64()))
    with pytest.raises(ValueError, match=r"uint64 with values of 2\*\*63 or more.*values.view\(np.int64\)"):
        hd.encode_multi_hot(big)
    with pytest.raises(ValueError, match=r"uint64 with values of 2\*\*63"):
        hd.encode_multi_hot([np.array([2**64 - 1], np.uint64)])
    small = pa.array([[2**63 - 1], [1]], pa.list_(pa.uint64()))  # fits int64: encoded as it is
    assert [b.tolist() for b in hd.decode_multi_hot(hd.encode_multi_hot(small))] == [[2**63 - 1], [1]]


def test_the_same_file_named_two_ways_is_refused(good_file, monkeypatch):
    directory, name = os.path.split(good_file)
    monkeypatch.chdir(directory)
    for paths in ([name, f"./{name}"], [directory, good_file], [good_file, os.path.join(directory, ".", name)]):
        with pytest.raises(ValueError, match=r"listed more than once .* name each file once"):
            hd.parquet_dataset(paths, spec=SPEC, batch_size=2)


def test_a_feature_column_named_like_the_label_key_keeps_its_values(tmp_path):
    path = str(tmp_path / "x.parquet")
    hd.write_parquet(path, {"label": np.ones(4, np.float32), "__label__": np.arange(4)})
    features, labels = next(iter(hd.parquet_dataset(path, batch_size=4, one_hot=["__label__"])))
    assert labels.numpy().tolist() == [1.0] * 4 and labels.dtype == tf.float32
    assert features["__label__"].numpy().tolist() == [0, 1, 2, 3]


def test_built_in_a_graph_as_in_an_estimator_input_fn(tmp_path):
    """tf.estimator calls input_fn inside a tf.Graph: the dataset must build there and read every row."""
    paths, expected = make_files(tmp_path, [9, 5], row_group_rows=4)
    with tf.Graph().as_default():
        ds = hd.parquet_dataset(paths, spec=SPEC, batch_size=4, shuffle=True, seed=3)
        iterator = tf.compat.v1.data.make_initializable_iterator(ds)  # as an Estimator iterates
        features, labels = iterator.get_next()
        got = []
        with tf.compat.v1.Session() as sess:
            sess.run(iterator.initializer)
            while True:
                try:
                    f, lab = sess.run((features, labels))
                except tf.errors.OutOfRangeError:
                    break
                got += [(int(r), float(v)) for r, v in zip(f["row"], lab)]
    assert sorted(got) == [(r, float(v[0])) for r, v in sorted(expected.items())]


def test_check_parquet_finds_damaged_data_pages_that_the_footer_checks_miss(tmp_path, capsys):
    """Footer intact, pages scrambled: parquet_dataset builds (tensorflow-io would abort reading it); check names it."""
    good = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"label": np.zeros(1000, np.float32), "c": np.arange(1000)}), good, row_group_size=400)
    bad = str(tmp_path / "b.parquet")
    raw = bytearray(open(good, "rb").read())
    for k in range(4, 2000):
        raw[k] ^= 0x5A
    open(bad, "wb").write(bytes(raw))
    assert hd.check_parquet(good) == 1000 and hd.check_parquet(good, columns=["c"]) == 1000
    hd.parquet_dataset([good, bad], batch_size=100, one_hot=["c"])  # the footers are fine
    with pytest.raises(hd.ParquetFileError, match=r"b.parquet': row group 0 of 3 cannot be decoded .* damaged"):
        hd.check_parquet(str(tmp_path))
    assert hd.main(["check", good]) == 0 and "ok: 1000 rows decoded" in capsys.readouterr().out
    assert hd.main(["check", good, bad]) == 1 and "row group 0 of 3" in capsys.readouterr().err


def test_check_keep_going_lists_every_damaged_file(tmp_path, capsys):
    """The CLI checks every file: a damaged one and one that is not Parquet are both named, the good one decoded."""
    good = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"label": np.zeros(1000, np.float32), "c": np.arange(1000)}), good, row_group_size=400)
    raw = bytearray(open(good, "rb").read())
    for k in range(4, 2000):
        raw[k] ^= 0x5A
    open(tmp_path / "b.parquet", "wb").write(bytes(raw))
    open(tmp_path / "c.parquet", "wb").write(b"not parquet at all")
    with pytest.raises(hd.ParquetFileError, match=r"b\.parquet': row group 0 of 3") as first:
        hd.check_parquet(str(tmp_path))
    assert "c.parquet" not in str(first.value)  # stops at the first problem by default
    with pytest.raises(hd.ParquetFileError) as every:
        hd.check_parquet(str(tmp_path), keep_going=True)
    message = str(every.value)
    # b's later row groups are intact: decoded with a's 1000 rows
    assert message.startswith("2 problem(s) in 2 of 3 file(s) (1600 rows decoded)")
    assert "b.parquet': row group 0 of 3" in message
    assert "c.parquet' is not a readable Parquet file" in message
    assert hd.main(["check", str(tmp_path), str(tmp_path / "missing.parquet"), good]) == 1
    err = capsys.readouterr().err
    assert "b.parquet" in err and "c.parquet" in err and "'" + str(tmp_path / "missing.parquet") + "' does not" in err
    assert err.startswith("error: 3 problem(s) in 3 of 4 file(s)")
