"""Finding Parquet inputs and checking their columns before any data is read.

Reads only Parquet footers (with pyarrow): row counts, row-group sizes,
column types and null counts. tensorflow-io, which reads the data, sees only
physical types: it cannot tell strings from binary or a list column from a
flat one, and it returns garbage for nulls, so these checks run first and turn
every such problem into an exception that names the file, the column and the
fix. TensorFlow-free. ``check_parquet`` is the one reader of data pages here:
it decodes whole files, on request, to find damage the footers do not show.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob as globlib
import hashlib
import io
import os
from collections.abc import Sequence
from typing import Any

from hybridtf._src.data.errors import ColumnTypeError, DataValueError, ParquetFileError, ParquetSchemaError
from hybridtf._src.data.layout import SPEC_METADATA_KEY, FeatureSpec, pyarrow_modules

_GLOB_CHARS = "*?["
_SUPPORTED_PHYSICAL = ("BOOLEAN", "INT32", "INT64", "FLOAT", "DOUBLE", "BYTE_ARRAY")


@dataclasses.dataclass(frozen=True)
class ParquetFileMeta:
    """What the reader needs to know about one Parquet file.

    Attributes:
        path: the file.
        num_rows: rows in the file.
        row_groups: rows of each row group, in order.
        schema: the Arrow schema (``pyarrow.Schema``).
        physical: ``{top-level column: Parquet physical type}`` for flat columns.
        max_def: ``{top-level column: max definition level}`` (0: no nulls possible).
        resource_key: identifies this version of the file (path, size, mtime, footer hash) for
            tensorflow-io's reader cache.
        size, mtime_ns: the file's size and modification time when it was opened.
        metadata: the ``pyarrow.parquet.FileMetaData``.
    """

    path: str
    num_rows: int
    row_groups: tuple[int, ...]
    schema: Any
    physical: dict[str, str]
    max_def: dict[str, int]
    resource_key: str
    size: int
    mtime_ns: int
    metadata: Any = dataclasses.field(repr=False)


def _is_remote(path: str) -> bool:
    return "://" in path


class _GFileReader(io.RawIOBase):
    """A seekable binary reader over ``tf.io.gfile.GFile`` (remote file systems), for pyarrow."""

    def __init__(self, path: str):
        import tensorflow as tf

        self._f = tf.io.gfile.GFile(path, "rb")
        self._size = self._f.size()

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._f.tell(), io.SEEK_END: self._size}[whence]
        self._f.seek(base + offset)
        return self._f.tell()

    def tell(self):
        return self._f.tell()

    def readinto(self, b):
        data = self._f.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self):
        self._f.close()
        super().close()


def stat_file(path: str) -> tuple[bool, bool, int, int]:
    """``(exists, is_dir, size, mtime_ns)``."""
    if _is_remote(path):
        import tensorflow as tf

        if not tf.io.gfile.exists(path):
            return False, False, 0, 0
        if tf.io.gfile.isdir(path):
            return True, True, 0, 0
        st = tf.io.gfile.stat(path)
        return True, False, int(st.length), int(st.mtime_nsec)
    if not os.path.exists(path):
        return False, False, 0, 0
    st = os.stat(path)
    return True, os.path.isdir(path), st.st_size, st.st_mtime_ns


def _glob(pattern: str) -> list[str]:
    if _is_remote(pattern):
        import tensorflow as tf

        return sorted(tf.io.gfile.glob(pattern))
    return sorted(globlib.glob(pattern))


def _list_dir(path: str) -> list[str]:
    if _is_remote(path):
        import tensorflow as tf

        names = tf.io.gfile.listdir(path)
    else:
        names = os.listdir(path)
    # names starting with "." or "_" are hidden or a writer's temporary / bookkeeping files (Spark, Hive and
    # pyarrow.dataset skip them): a half-written copy would be read twice
    return sorted(os.path.join(path, n) for n in names if n.endswith(".parquet") and not n.startswith((".", "_")))


def resolve_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The Parquet files named by ``paths``: files, directories (their ``*.parquet``) and glob patterns.

    Files keep the given order; directories and patterns expand sorted. A path that exists is taken
    literally, even when its name holds ``*``, ``?`` or ``[``; any other such path is a pattern.

    Raises:
        ValueError: no paths, or a file named twice.
        ParquetFileError: a path that does not exist, a directory without
            ``.parquet`` files, or a pattern that matches nothing.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise DataValueError("parquet_dataset needs at least one Parquet file; got an empty list of paths.")
    files: list[str] = []
    for p in paths:
        # a file or directory that exists is itself, also when its name holds glob characters ("part[1].parquet"
        # next to "part1.parquet": as a pattern it would name the other file)
        if any(c in p for c in _GLOB_CHARS) and not stat_file(p)[0]:
            matched = _glob(p)
            if not matched:
                raise ParquetFileError(f"no file matches the pattern {p!r}; check the path.")
            files.extend(matched)
            continue
        exists, is_dir, _, _ = stat_file(p)
        if not exists:
            raise ParquetFileError(f"Parquet input {p!r} does not exist; check the path (or the file system prefix).")
        if is_dir:
            found = _list_dir(p)
            if not found:
                raise ParquetFileError(f"directory {p!r} contains no '*.parquet' files.")
            files.extend(found)
        else:
            files.append(p)
    # the same local file named two ways ("a.parquet", "./a.parquet", its directory) is one file
    seen: dict[str, str] = {}
    dupes = set()
    for f in files:
        key = f if _is_remote(f) else os.path.realpath(f)
        if key in seen:
            dupes.add(seen[key] if seen[key] == f else f"{seen[key]} and {f}")
        seen.setdefault(key, f)
    if dupes:
        raise DataValueError(
            f"Parquet files listed more than once (their rows would be read twice): {sorted(dupes)}; "
            "name each file once."
        )
    return files


def _tail_digest(path: str, size: int, nbytes: int = 65536) -> str:
    """Hash of the file's last bytes (the Parquet footer with its statistics)."""
    with _GFileReader(path) if _is_remote(path) else open(path, "rb") as f:
        f.seek(max(0, size - nbytes))
        return hashlib.blake2b(f.read(nbytes), digest_size=8).hexdigest()


def open_parquet(path: str) -> ParquetFileMeta:
    """Reads the footer of one Parquet file.

    Raises:
        ParquetFileError: the file does not exist, cannot be read, or is not Parquet.
    """
    _, pq = pyarrow_modules()
    exists, is_dir, size, mtime = stat_file(path)
    if not exists or is_dir:
        raise ParquetFileError(f"Parquet input {path!r} does not exist or is a directory; check the path.")
    try:
        source = _GFileReader(path) if _is_remote(path) else path
        pf = pq.ParquetFile(source)
        metadata = pf.metadata
        schema = pf.schema_arrow
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError with the reason
        raise ParquetFileError(
            f"{path!r} is not a readable Parquet file ({type(e).__name__}: {e}). "
            "Write inputs with pyarrow / Spark / hybridtf.data.write_parquet, or convert text with "
            "`python -m hybridtf.data convert`."
        ) from e
    repeated = sorted({n for n in schema.names if schema.names.count(n) > 1})
    if repeated:
        raise ParquetSchemaError(
            f"{path!r} has more than one column named {', '.join(map(repr, repeated))}; columns are read by name, "
            "so each must be unique. Rewrite the file with unique column names."
        )
    physical, max_def = {}, {}
    for i in range(metadata.num_columns):
        col = metadata.schema.column(i)
        if col.max_repetition_level == 0 and col.path == col.name:  # top level (a dotted name is fine)
            physical[col.path] = col.physical_type
            max_def[col.path] = col.max_definition_level
    row_groups = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
    return ParquetFileMeta(
        path=path,
        num_rows=metadata.num_rows,
        row_groups=row_groups,
        schema=schema,
        physical=physical,
        max_def=max_def,
        # tensorflow-io caches one reader per key for the life of the process; a file rewritten in place
        # must get a new key (a stale reader returns wrong rows or crashes), hence size, mtime and footer hash.
        resource_key=f"{path}|{size}|{mtime}|{_tail_digest(path, size)}",
        size=size,
        mtime_ns=mtime,
        metadata=metadata,
    )


def _role_error(role: str, name: str, path: str, arrow_type, pa) -> str | None:
    """The problem with ``arrow_type`` for ``role`` (None: fine)."""
    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    where = f"{role} column {name!r} of {path}"
    if pa.types.is_unsigned_integer(t) and t.bit_width > 16:
        return (
            f"{where} is {t}; tensorflow-io reads unsigned columns as signed, so values above "
            f"{2 ** (t.bit_width - 1) - 1} would come back negative. Write it as int64."
        )
    is_int = pa.types.is_integer(t)
    if role in ("label", "dense"):
        if is_int or pa.types.is_boolean(t) or pa.types.is_float32(t) or pa.types.is_float64(t):
            return None
        return f"{where} is {t}; {role} columns must be numeric (integer, float32, float64 or bool)."
    if role == "one_hot":
        if is_int:
            return None
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
            return (
                f"{where} holds strings ({t}); one-hot columns hold integer ids. Hash the strings into ids first: "
                "hybridtf.data.hash_strings(values, buckets), or convert text data with "
                "`python -m hybridtf.data convert`."
            )
        return f"{where} is {t}; one-hot columns hold integer ids (int8..int64, uint8, uint16). Write it as int64."
    # multi_hot
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return None
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return (
            f"{where} is a Parquet list column ({t}). tensorflow-io 0.36 reads list columns as their flat values, "
            "not aligned to rows, so hybridtf stores multi-hot ids as a binary column of little-endian int64 ids "
            "(8 bytes per id, one value per row). Rewrite the column with "
            "hybridtf.data.encode_multi_hot(table.column(name)) or hybridtf.data.write_parquet."
        )
    return (
        f"{where} is {t}; multi-hot columns are binary columns of little-endian int64 ids "
        "(see hybridtf.data.encode_multi_hot)."
    )


def _leaf_columns(meta: ParquetFileMeta, name: str) -> list[int]:
    """The footer's leaf columns whose path is ``name`` (two: a top-level "s.x" and a struct s's field x)."""
    return [i for i in range(meta.metadata.num_columns) if meta.metadata.schema.column(i).path == name]


def _null_count(meta: ParquetFileMeta, name: str) -> int:
    """Nulls in a flat column: from row-group statistics, or by reading the column when they are absent."""
    if meta.max_def.get(name, 0) == 0:
        return 0
    index = meta.schema.get_field_index(name)
    leaf = _leaf_columns(meta, name)[0]
    total = 0
    for g in range(meta.metadata.num_row_groups):
        stats = meta.metadata.row_group(g).column(leaf).statistics
        if stats is None or not stats.has_null_count:
            break
        total += stats.null_count
    else:
        return total
    _, pq = pyarrow_modules()  # no statistics: count the nulls by reading the column
    source = _GFileReader(meta.path) if _is_remote(meta.path) else meta.path
    return pq.ParquetFile(source).read(columns=[meta.schema.field(index).name]).column(0).null_count


def _check_dictionary_encoded(meta: ParquetFileMeta, name: str, leaf: int) -> None:
    """Refuses a multi-hot column chunk written without a dictionary (only PLAIN-encoded pages).

    tensorflow-io 0.36 misreads a binary column when one read spans several PLAIN-encoded data pages:
    other ids than the file's, silently (a probe: 717 of 3,000 rows of a ``use_dictionary=False`` file).
    """
    for g in range(meta.metadata.num_row_groups):
        chunk = meta.metadata.row_group(g).column(leaf)
        if chunk.num_values and not chunk.has_dictionary_page:
            raise ColumnTypeError(
                f"multi-hot column {name!r} of {meta.path} is written without dictionary encoding (row group {g}: "
                "PLAIN pages only), which tensorflow-io misreads (other ids than the file's, silently) when a read "
                "spans several pages. Write it dictionary-encoded: pyarrow.parquet.write_table(table, path, "
                "use_dictionary=True, dictionary_pagesize_limit=1 << 30), or hybridtf.data.write_parquet."
            )


def check_columns(files: Sequence[ParquetFileMeta], spec: FeatureSpec) -> dict[str, str]:
    """Checks that every file has every column of ``spec`` with a type fit for its role and no nulls.

    Args:
        files: the inputs.
        spec: the requested columns.

    Returns:
        ``{column: Parquet physical type}`` (the same in every file).

    Raises:
        ParquetSchemaError: a missing column, nulls, or a column whose type differs between files.
        ColumnTypeError: a column whose type does not fit its role.
    """
    pa, _ = pyarrow_modules()
    physical: dict[str, tuple[str, str]] = {}
    for meta in files:
        names = meta.schema.names
        for role, columns in spec.roles():
            for name in columns:
                if name not in names:
                    close = difflib.get_close_matches(name, names, n=3)
                    hint = f" Did you mean {close}?" if close else ""
                    shown = ", ".join(names[:30]) + (", ..." if len(names) > 30 else "")
                    raise ParquetSchemaError(
                        f"{role} column {name!r} is not in {meta.path} (its columns: {shown}).{hint}"
                    )
                leaves = _leaf_columns(meta, name)
                if len(leaves) > 1:  # "s.x" and the field x of a struct s: tensorflow-io may read either
                    raise ParquetSchemaError(
                        f"{role} column {name!r} of {meta.path} has the same path as a nested field (a struct "
                        f"column {name.split('.')[0]!r} with a field {name.split('.', 1)[1]!r}); tensorflow-io "
                        "cannot tell them apart. Rename the top-level column (or the struct) when writing."
                    )
                problem = _role_error(role, name, meta.path, meta.schema.field(name).type, pa)
                if problem:
                    raise ColumnTypeError(problem)
                kind = meta.physical.get(name)
                if kind not in _SUPPORTED_PHYSICAL:
                    raise ColumnTypeError(
                        f"{role} column {name!r} of {meta.path} has Parquet type {kind}, which tensorflow-io "
                        "cannot read as one value per row; write it as int64, float32/float64, bool or binary."
                    )
                if name in physical and physical[name][0] != kind:
                    other_kind, other = physical[name]
                    raise ParquetSchemaError(
                        f"column {name!r} is {other_kind} in {other} but {kind} in {meta.path}; "
                        "write all files with the same schema."
                    )
                physical.setdefault(name, (kind, meta.path))
                if role == "multi_hot" and leaves:
                    _check_dictionary_encoded(meta, name, leaves[0])
                nulls = _null_count(meta, name)
                if nulls:
                    raise ParquetSchemaError(
                        f"{role} column {name!r} of {meta.path} has {nulls} null value(s); tensorflow-io cannot "
                        "read nulls. Fill them when writing (e.g. pyarrow.compute.fill_null(column, 0)); the "
                        "converter writes missing values as 0."
                    )
    return {name: kind for name, (kind, _) in physical.items()}


def read_feature_spec(path: str | os.PathLike) -> FeatureSpec:
    """The :class:`FeatureSpec` stored in a Parquet file by the converter or :func:`write_parquet`.

    Args:
        path: a Parquet file.

    Returns:
        The stored spec.

    Raises:
        ParquetFileError: the file is missing or not Parquet.
        ParquetSchemaError: the file carries no hybridtf feature spec.

    Example:
        >>> spec = read_feature_spec("criteo.parquet")  # doctest: +SKIP
        >>> ds = parquet_dataset("criteo.parquet", spec=spec, batch_size=4096)  # doctest: +SKIP
    """
    meta = open_parquet(os.fspath(path))
    raw = (meta.schema.metadata or {}).get(SPEC_METADATA_KEY)
    if raw is None:
        raise ParquetSchemaError(
            f"{path} carries no hybridtf feature spec (schema metadata {SPEC_METADATA_KEY.decode()!r}); "
            "pass label/dense/one_hot/multi_hot to parquet_dataset instead."
        )
    return FeatureSpec.from_json(raw)


def check_parquet(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    columns: Sequence[str] | None = None,
    *,
    keep_going: bool = False,
) -> int:
    """Decodes every row group of the files (with pyarrow): finds corrupt data pages before training does.

    ``parquet_dataset`` reads only the files' footers when it is built; a file
    whose footer is intact but whose data pages are damaged (a bad copy, bit
    rot) passes that, and tensorflow-io aborts the process when it reaches the
    damage (it does not catch its own C++ exception). This reads all of it.

    Args:
        paths: as for ``parquet_dataset`` (files, directories, glob patterns).
        columns: only these columns (default: all).
        keep_going: check every file and row group, then raise one error listing
            every problem (default: raise at the first).

    Returns:
        The number of rows checked.

    Raises:
        ParquetFileError: naming the file and row group that cannot be decoded
            (with ``keep_going``, each of them), or a file that is not Parquet.

    Example:
        >>> check_parquet("train/")  # doctest: +SKIP
        1048576
    """
    _, pq = pyarrow_modules()
    rows, problems, unresolved = 0, [], 0
    if keep_going and not isinstance(paths, (str, os.PathLike)) and len(paths) > 1:
        files = []  # each path on its own: a missing one is listed, the others still checked
        for entry in paths:
            try:
                files = list(dict.fromkeys([*files, *resolve_paths(entry)]))
            except ParquetFileError as e:
                problems.append((os.fspath(entry), str(e)))
                unresolved += 1
    else:
        files = resolve_paths(paths)
    for path in files:
        try:
            meta = open_parquet(path)
            source = _GFileReader(path) if _is_remote(path) else path
            pf = pq.ParquetFile(source)
        except ParquetFileError as e:
            if not keep_going:
                raise
            problems.append((path, str(e)))
            continue
        for g in range(len(meta.row_groups)):
            try:
                rows += pf.read_row_group(g, columns=list(columns) if columns is not None else None).num_rows
            except Exception as e:  # pyarrow: OSError / ArrowInvalid with the reason
                reason = " ".join(str(e).split())  # pyarrow's message spans lines
                error = ParquetFileError(
                    f"{path!r}: row group {g} of {len(meta.row_groups)} cannot be decoded ({type(e).__name__}: "
                    f"{reason}); the file is damaged: write or copy it again."
                )
                if not keep_going:
                    raise error from e
                problems.append((path, str(error)))
    if problems:
        bad_files = len({path for path, _ in problems})
        raise ParquetFileError(
            f"{len(problems)} problem(s) in {bad_files} of {len(files) + unresolved} file(s) ({rows} rows decoded):\n"
            + "\n".join(f"  {message}" for _, message in problems)
        )
    return rows
