"""The Parquet input pipeline: tensorflow-io reads, per-rank row shards, exact batches.

How a dataset is built (``parquet_dataset``):

1. Footers only (``schema``): expand the paths, read row counts, row groups
   and column types, and check every requested column (missing, wrong type,
   nulls, differing between files) before anything is read.
2. Plan (``shard_rows``, ``plan_chunks``; pure Python): the files are one
   sequence of ``T`` rows in path order. Rank ``r`` of ``N`` owns the
   contiguous rows ``[T*r//N, T*(r+1)//N)``, so the ranks together own every
   row exactly once, whatever ``T`` and the number of files. With
   ``drop_remainder`` every rank keeps the first ``T // (N*B)`` full batches of
   its rows, so all ranks run the same number of steps (what Horovod needs).
   The owned rows are cut into chunks at file and row-group boundaries (and
   every ``read_rows`` rows).
3. Read (tf.data): one tensorflow-io read per chunk and column
   (``IO>ParquetReadableRead``, the op behind ``tfio.IODataset.from_parquet``,
   called on whole chunks instead of row by row); with ``shuffle`` the chunk
   order and the rows inside each chunk are permuted. ``rebatch`` then cuts
   exact batches across chunk and file boundaries, and multi-hot columns are
   decoded to ``tf.RaggedTensor`` per batch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from hybridtf._src.data.errors import DataValueError, ParquetFileError, ParquetSchemaError
from hybridtf._src.data.layout import ID_BYTES, FeatureSpec
from hybridtf._src.data.schema import ParquetFileMeta, check_columns, open_parquet, resolve_paths, stat_file
from hybridtf._src.distribute.world import current_world
from hybridtf._src.limits import INT64_MAX

_log = logging.getLogger("hybridtf")

_CONTAINER = "hybridtf.data"
_READER_SLOTS = 4  # independent tensorflow-io readers per file, so chunks of one file read in parallel
DEFAULT_READ_ROWS = 131072
_PHYSICAL_DTYPES = {
    "BOOLEAN": tf.bool,
    "INT32": tf.int32,
    "INT64": tf.int64,
    "FLOAT": tf.float32,
    "DOUBLE": tf.float64,
    "BYTE_ARRAY": tf.string,
}
_UNSET: Any = object()


def _core_ops():
    try:
        from tensorflow_io.python.ops import core_ops
    except ImportError as e:
        raise ImportError(
            "hybridtf.data reads Parquet with tensorflow-io: pip install tensorflow-io==0.36.0 "
            f"(the release built for TensorFlow {tf.__version__.rsplit('.', 1)[0]})."
        ) from e
    return core_ops


def resolve_rank(rank: int | None, size: int | None) -> tuple[int, int]:
    """``(rank, size)``: as given, or from Horovod when both are None.

    With ``rank=size=None`` the values come from ``horovod.tensorflow`` if the
    program has imported it and called ``hvd.init()``; otherwise ``(0, 1)``.
    hybridtf never imports or initializes Horovod itself.

    Raises:
        ValueError: only one of them given, ``size < 1``, or rank outside ``[0, size)``.
        TypeError: non-integer values.

    Example:
        >>> resolve_rank(None, None)
        (0, 1)
        >>> resolve_rank(1, 2)
        (1, 2)
    """
    if rank is None and size is None:
        world = current_world()
        return world.rank, world.size
    if rank is None or size is None:
        raise DataValueError(
            f"give both rank and size (or neither, to take them from Horovod); got rank={rank}, size={size}."
        )
    for name, v in (("rank", rank), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}.")
    if size < 1:
        raise DataValueError(f"size must be >= 1, got {size}.")
    if not 0 <= rank < size:
        raise DataValueError(f"rank must be in [0, size) = [0, {size}), got {rank}.")
    return int(rank), int(size)


def shard_rows(total: int, batch_size: int, rank: int, size: int, drop_remainder: bool) -> tuple[int, int, int]:
    """The global rows ``[begin, end)`` rank ``rank`` of ``size`` reads, and its number of batches.

    Without ``drop_remainder`` the ranks' ranges tile ``[0, total)``: every row
    is read exactly once, and ranks may differ by one batch. With it, each rank
    reads the first ``total // (size * batch_size)`` full batches of its range,
    the same number on every rank.

    Example:
        >>> [shard_rows(10, 2, r, 3, False) for r in range(3)]
        [(0, 3, 2), (3, 6, 2), (6, 10, 2)]
        >>> [shard_rows(10, 2, r, 3, True) for r in range(3)]
        [(0, 2, 1), (3, 5, 1), (6, 8, 1)]
    """
    begin, end = total * rank // size, total * (rank + 1) // size
    if drop_remainder:
        batches = total // (size * batch_size)
        return begin, begin + batches * batch_size, batches
    return begin, end, -(-(end - begin) // batch_size)


def _check_batches(files, total: int, batch_size: int, rank: int, size: int, drop_remainder: bool) -> None:
    """Warns when the input yields no batch on this rank (Keras's ``fit`` would only say "Expected input data to
    be non-empty") and when ranks would run different numbers of batches."""
    shown = ", ".join(m.path for m in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    mine = shard_rows(total, batch_size, rank, size, drop_remainder)[2]
    # The ranks' ranges hold total // size rows (rank 0) or one more (the last rank holds the ceiling), so
    # the first and last ranks bound the batch counts without a loop over the ranks (size may be large).
    fewest = shard_rows(total, batch_size, 0, size, drop_remainder)[2]
    most = shard_rows(total, batch_size, size - 1, size, drop_remainder)[2]
    if total == 0:
        _log.warning("hybridtf.data: the Parquet input (%s) holds no rows: the dataset is empty.", shown)
    elif mine == 0:
        _log.warning(
            "hybridtf.data: the Parquet input (%s) has %d rows, which give rank %d of %d no batch of %d%s: the dataset "
            "is empty. Lower batch_size or add rows.",
            shown,
            total,
            rank,
            size,
            batch_size,
            " (drop_remainder=True keeps full batches only)" if drop_remainder else "",
        )
    elif fewest != most:
        counts = (
            ", ".join(f"rank {r}: {shard_rows(total, batch_size, r, size, drop_remainder)[2]}" for r in range(size))
            if size <= 16
            else f"{fewest} or {most} per rank over {size} ranks"
        )
        _log.warning(
            "hybridtf.data: the ranks get different numbers of batches (%s of %d rows each, %d rows in all): a "
            "Horovod rank that runs out first leaves the others in a collective step. Pass drop_remainder=True "
            "(every rank then reads the same number of full batches).",
            counts,
            batch_size,
            total,
        )


def plan_chunks(
    row_groups: Sequence[Sequence[int]], begin: int, end: int, read_rows: int
) -> list[tuple[int, int, int]]:
    """Cuts the global rows ``[begin, end)`` into reads ``(file, start, stop)`` (rows of that file).

    Chunks never cross a file or a row group (tensorflow-io decodes a row group
    from its start for every read, so a read that starts mid-group costs the
    rows before it) and hold at most ``read_rows`` rows.

    Example:
        >>> plan_chunks([[4, 4], [3]], begin=2, end=10, read_rows=3)
        [(0, 2, 4), (0, 4, 7), (0, 7, 8), (1, 0, 2)]
    """
    chunks = []
    offset = 0  # global row of the current row group's first row
    for f, groups in enumerate(row_groups):
        local = 0
        for n in groups:
            lo, hi = max(begin, offset), min(end, offset + n)
            for a in range(lo, hi, read_rows):
                b = min(hi, a + read_rows)
                chunks.append((f, a - offset + local, b - offset + local))
            offset += n
            local += n
    return chunks


def _probe_with_tfio(files: Sequence[ParquetFileMeta], columns: Sequence[str]) -> None:
    """Opens every file with tensorflow-io once, so that unreadable files fail here, not mid-epoch."""
    core_ops = _core_ops()
    # Eagerly even when the dataset is built inside a tf.Graph (an Estimator's
    # input_fn, a TF1 session): there tf.init_scope stays in that graph.
    with tf.init_scope(), context.eager_mode():
        for meta in files:
            try:
                names, shapes, _ = core_ops.io_parquet_readable_info(
                    meta.path, shared=f"{meta.resource_key}#0", container=_CONTAINER
                )
            except tf.errors.OpError as e:
                raise ParquetFileError(f"tensorflow-io cannot open {meta.path!r}: {e.message}") from e
            found = dict(zip((n.decode() for n in names.numpy()), shapes.numpy()[:, 0]))
            for c in columns:
                if found.get(c) != meta.num_rows:
                    raise ParquetSchemaError(
                        f"tensorflow-io sees column {c!r} of {meta.path} with {found.get(c)} rows, not "
                        f"{meta.num_rows}; write the file as flat (non-nested) columns."
                    )


@dataclasses.dataclass(frozen=True)
class _Reader:
    """The graph-side reader of one dataset: file tables and the per-chunk read function."""

    files: Sequence[ParquetFileMeta]
    spec: FeatureSpec
    physical: dict[str, str]
    dense_key: str | None

    @property
    def label_key(self) -> str:
        """The label's key until ``finish`` splits it off: one no feature of this dataset has."""
        taken = set(self.spec.one_hot) | set(self.spec.multi_hot) | set(self.spec.dense) | {self.dense_key}
        key = "__label__"
        while key in taken:
            key += "_"
        return key

    def _check_unchanged(self, file) -> None:
        """Raises (InvalidArgumentError in the pipeline) when file ``file`` changed since the dataset was built.

        tensorflow-io would read the new bytes with the old file's row groups and
        abort the process (an uncaught C++ exception), not raise.
        """
        meta = self.files[int(file)]
        exists, _, size, mtime = stat_file(meta.path)
        if not exists or (size, mtime) != (meta.size, meta.mtime_ns):
            raise ValueError(
                f"Parquet input {meta.path!r} was {'removed' if not exists else 'rewritten'} after parquet_dataset "
                "was built; build the dataset again (and write new files under new names, or rename them into "
                "place, while a job reads them)."
            )

    def read(self, file, start, stop, slot, seed=None):
        core_ops = _core_ops()
        check = tf.py_function(lambda f: self._check_unchanged(f.numpy()) or True, [file], tf.bool)
        paths = tf.constant([m.path for m in self.files])
        keys = tf.constant([m.resource_key for m in self.files])
        rows = tf.constant([m.num_rows for m in self.files], tf.int64)
        path = tf.gather(paths, file)
        shared = tf.strings.join([tf.gather(keys, file), tf.strings.as_string(slot)], separator="#")
        shape = tf.reshape(tf.gather(rows, file), [1])
        cols = {}
        for name in self.spec.columns:
            with tf.control_dependencies([check]):  # each column's read, after the file is checked
                x = core_ops.io_parquet_readable_read(
                    input=path,
                    shared=shared,
                    component=name,
                    shape=shape,
                    start=tf.reshape(start, [1]),
                    stop=tf.reshape(stop, [1]),
                    dtype=_PHYSICAL_DTYPES[self.physical[name]],
                    container=_CONTAINER,
                )
            cols[name] = tf.ensure_shape(x, [None])
        out = self._assemble(cols)
        if seed is not None:  # after stacking: one gather for all dense columns
            perm = tf.argsort(tf.random.stateless_uniform(tf.shape(cols[self.spec.columns[0]]), seed=seed))
            out = {k: tf.gather(v, perm) for k, v in out.items()}
        return out

    def _assemble(self, cols):
        """Casts and stacks the columns of one chunk; multi-hot stays encoded (tf.string) until batched."""
        out = {}
        spec = self.spec
        if spec.label is not None:
            out[self.label_key] = tf.cast(cols[spec.label], tf.float32)
        if spec.dense:
            dense = [tf.cast(cols[n], tf.float32) for n in spec.dense]
            if self.dense_key is None:
                out.update(zip(spec.dense, dense))
            else:
                out[self.dense_key] = tf.stack(dense, axis=1)
        for n in spec.one_hot:
            out[n] = tf.cast(cols[n], tf.int64)
        for n in spec.multi_hot:
            out[n] = cols[n]
        return out

    def finish(self, batch):
        """Decodes multi-hot columns of one batch to ragged ids; splits off the label."""
        features = dict(batch)
        for n in self.spec.multi_hot:
            encoded = features[n]
            lengths = tf.strings.length(encoded)
            check = tf.debugging.assert_equal(
                lengths % ID_BYTES,
                tf.zeros_like(lengths),
                message=(
                    f"multi-hot column {n}: a value has a length that is not a multiple of {ID_BYTES} bytes; "
                    "multi-hot values must be little-endian int64 ids (hybridtf.data.encode_multi_hot)"
                ),
            )
            with tf.control_dependencies([check]):
                values = tf.io.decode_raw(tf.strings.reduce_join(encoded), tf.int64, little_endian=True)
            row_lengths = tf.cast(lengths // ID_BYTES, tf.int64)
            features[n] = tf.RaggedTensor.from_row_lengths(tf.reshape(values, [-1]), row_lengths, validate=False)
        if self.spec.label is None:
            return features
        label = features.pop(self.label_key)
        return features, label


def parquet_dataset(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    batch_size: int,
    label: str | None = _UNSET,
    dense: Sequence[str] = (),
    one_hot: Sequence[str] = (),
    multi_hot: Sequence[str] = (),
    spec: FeatureSpec | None = None,
    dense_key: str | None = "dense",
    drop_remainder: bool = False,
    shuffle: bool = False,
    seed: int | None = None,
    rank: int | None = None,
    size: int | None = None,
    read_rows: int = DEFAULT_READ_ROWS,
) -> tf.data.Dataset:
    """Batches of label, dense, one-hot and multi-hot features from Parquet files, read with tensorflow-io.

    Every element is ``(features, labels)`` (just ``features`` when ``label`` is
    None): ``labels`` float32 ``[batch]``; ``features[dense_key]`` float32
    ``[batch, len(dense)]`` (columns in ``dense`` order; with
    ``dense_key=None`` each dense column is its own float32 ``[batch]``
    feature); ``features[c]`` int64 ``[batch]`` per one-hot column;
    ``features[c]`` ``tf.RaggedTensor`` int64 ``[batch, None]`` per multi-hot
    column. This is the input of the Keras CTR models and of
    ``hybridtf.keras.optimize``'d models.

    Rows, not files, are sharded: the files form one sequence of rows (in path
    order) and rank ``r`` of ``N`` reads the contiguous slice
    ``[T*r//N, T*(r+1)//N)`` of its ``T`` rows, so the ranks together read every
    row exactly once, also with one file or ``T`` not divisible by ``N``.
    Batches have exactly ``batch_size`` rows across file boundaries; the last
    one may be smaller unless ``drop_remainder``, which also gives every rank
    the same number of batches (``T // (N * batch_size)``) and a static batch
    dimension. ``dataset.cardinality()`` is the number of batches.

    Args:
        paths: Parquet files, directories (their ``*.parquet`` files, sorted)
            or glob patterns. Any file system TensorFlow reads (``gs://``, ...).
        batch_size: rows per batch.
        label: label column (default ``"label"``), or None for no labels.
        dense: dense feature columns (numeric).
        one_hot: one-hot id columns (integer).
        multi_hot: multi-hot id columns (binary, little-endian int64 ids; see
            ``hybridtf.data.encode_multi_hot``).
        spec: a ``FeatureSpec`` (e.g. from ``read_feature_spec``) instead of
            ``label`` / ``dense`` / ``one_hot`` / ``multi_hot``.
        dense_key: feature name of the stacked dense features, or None to keep
            one feature per dense column.
        drop_remainder: drop the rows that do not fill a batch on every rank.
        shuffle: read the chunks in a random order and permute the rows inside
            each chunk, anew every epoch (a shuffle buffer of one chunk, up to
            ``read_rows`` rows of one row group). Every row is still read once.
        seed: seed of the shuffle (same seed, same order of epochs).
        rank: this process's rank; with ``size``. Both None: from Horovod if
            ``horovod.tensorflow`` is imported and initialized, else 0 of 1.
        size: number of ranks.
        read_rows: most rows per tensorflow-io read.

    Returns:
        A ``tf.data.Dataset``.

    Raises:
        ValueError: no paths, ``batch_size < 1``, a bad rank/size, a column in
            two roles, or columns given together with ``spec``.
        ParquetFileError: a path that does not exist or is not a readable Parquet file.
        ParquetSchemaError: a requested column that is missing, holds nulls, or
            differs in type between files.
        ColumnTypeError: a column whose type does not fit its role (e.g.
            strings requested as one-hot ids).

    Example:
        >>> ds = parquet_dataset(
        ...     "train/*.parquet", batch_size=4096, dense=[f"I{i}" for i in range(1, 14)],
        ...     one_hot=[f"C{i}" for i in range(1, 27)], drop_remainder=True, shuffle=True, seed=0,
        ... )  # doctest: +SKIP
        >>> features, labels = next(iter(ds))  # doctest: +SKIP
        >>> features["dense"].shape, features["C1"].dtype, labels.shape  # doctest: +SKIP
        (TensorShape([4096, 13]), tf.int64, TensorShape([4096]))
    """
    if spec is None:
        spec = FeatureSpec(
            label="label" if label is _UNSET else label, dense=dense, one_hot=one_hot, multi_hot=multi_hot
        )
    elif label is not _UNSET or dense or one_hot or multi_hot:
        raise DataValueError("give either spec or label/dense/one_hot/multi_hot, not both.")
    for what, value in (("batch_size", batch_size), ("read_rows", read_rows)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= int(value) <= INT64_MAX:
            raise DataValueError(f"{what} must be a positive int (at most 2**63 - 1), got {value!r}.")
    batch_size, read_rows = int(batch_size), int(read_rows)
    if not spec.columns:
        raise DataValueError("parquet_dataset needs at least one column (label, dense, one_hot or multi_hot).")
    feature_names = set(spec.one_hot) | set(spec.multi_hot) | (set(spec.dense) if dense_key is None else set())
    if spec.dense and dense_key is not None and dense_key in feature_names:
        raise DataValueError(f"dense_key {dense_key!r} is also a column name; choose another dense_key.")
    rank, size = resolve_rank(rank, size)
    files = [open_parquet(p) for p in resolve_paths(paths)]
    physical = check_columns(files, spec)
    _probe_with_tfio(files, spec.columns)

    total = sum(m.num_rows for m in files)
    begin, end, num_batches = shard_rows(total, int(batch_size), rank, size, drop_remainder)
    _check_batches(files, total, int(batch_size), rank, size, drop_remainder)
    chunks = plan_chunks([m.row_groups for m in files], begin, end, int(read_rows))
    arr = np.array(chunks, dtype=np.int64).reshape(-1, 3)
    reader = _Reader(files, spec, physical, dense_key)
    ds = tf.data.Dataset.from_tensor_slices(
        (arr[:, 0].astype(np.int32), arr[:, 1], arr[:, 2], np.arange(len(arr), dtype=np.int64) % _READER_SLOTS)
    )
    if shuffle and len(arr) > 0:
        ds = ds.shuffle(len(arr), seed=seed, reshuffle_each_iteration=True)
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
        ds = tf.data.Dataset.zip((ds, seeds)).map(
            lambda chunk, s: reader.read(*chunk, seed=tf.stack([s, chunk[1]])),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    else:
        ds = ds.map(reader.read, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.rebatch(int(batch_size), drop_remainder=drop_remainder)
    ds = ds.map(reader.finish, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.apply(tf.data.experimental.assert_cardinality(num_batches))
    return ds.prefetch(tf.data.AUTOTUNE)
