"""The on-disk layout of hybridtf's Parquet inputs, and the feature spec stored with it.

One Parquet row is one example. Columns by role:

* label: any integer / floating / bool column, read as float32.
* dense: integer / floating / bool columns, read as float32.
* one-hot: one integer id per row (int8/16/32/64, uint8/16), read as int64.
* multi-hot: a ``binary`` (or ``large_binary``) column; each value holds the
  row's ids as little-endian int64, 8 bytes each (an empty value is an empty
  bag). This layout exists because tensorflow-io 0.36 reads a Parquet
  ``list<int64>`` column as its flat values, not aligned to rows; a binary
  column is one value per row, which it reads row-aligned.
  :func:`encode_multi_hot` turns ``list<int>`` data into this layout.

No column may hold nulls (tensorflow-io returns garbage for them). Files
written by :func:`write_parquet` or the converter carry a :class:`FeatureSpec`
as JSON under the schema metadata key ``b"hybridtf.feature_spec"``;
``schema.read_feature_spec`` reads it back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hybridtf._src.data.errors import DataValueError

# tensorflow-io 0.36 misreads a binary (multi-hot) column when one read spans several PLAIN-encoded
# data pages; Arrow's writer falls back from dictionary to PLAIN pages once a column chunk's
# dictionary passes its limit (1 MiB by default). hybridtf's writers raise the limit so that
# multi-hot columns stay dictionary-encoded.
DICTIONARY_PAGESIZE_LIMIT = 1 << 30

SPEC_METADATA_KEY = b"hybridtf.feature_spec"
LAYOUT_VERSION = 1
ID_BYTES = 8  # a multi-hot id on disk: little-endian int64
DEFAULT_ROW_GROUP_ROWS = 65536


def pyarrow_modules():
    """``(pyarrow, pyarrow.parquet)``, or an ImportError that names the fix."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - pyarrow is part of the pinned stack
        raise ImportError("hybridtf.data needs pyarrow (Parquet metadata, writing): pip install pyarrow==21.0.0") from e
    return pa, pq


def _names(value, role: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    names = tuple(value)
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise TypeError(f"{role} column names must be non-empty strings, got {bad!r}.")
    return names


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """Which Parquet columns are the label, dense, one-hot and multi-hot features.

    Args:
        label: label column (read as float32), or None for unlabeled data.
        dense: dense feature columns (read as float32).
        one_hot: one-hot id columns (read as int64 ``[batch]``).
        multi_hot: multi-hot id columns (read as ``tf.RaggedTensor`` int64 ``[batch, None]``).
        buckets: size of the id space of id columns (``{column: n}``: ids are in
            ``[0, n)``), e.g. the ``input_dim`` of their embedding tables.
            Informational; the converter fills it in.

    Raises:
        ValueError: a column in two roles, or buckets for an unknown or non-id column.

    Example:
        >>> spec = FeatureSpec(label="click", one_hot=["site"], multi_hot=["tags"], buckets={"site": 1000})
        >>> spec.columns
        ('click', 'site', 'tags')
        >>> FeatureSpec.from_json(spec.to_json()) == spec
        True
    """

    label: str | None = "label"
    dense: Sequence[str] = ()
    one_hot: Sequence[str] = ()
    multi_hot: Sequence[str] = ()
    buckets: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.label is not None and (not isinstance(self.label, str) or not self.label):
            raise TypeError(f"label must be a column name or None, got {self.label!r}.")
        for role in ("dense", "one_hot", "multi_hot"):
            object.__setattr__(self, role, _names(getattr(self, role), role))
        seen: dict[str, str] = {}
        for role, names in self.roles():
            for name in names:
                if name in seen:
                    raise DataValueError(
                        f"column {name!r} is requested as {seen[name]} and as {role}; give each column one role."
                    )
                seen[name] = role
        buckets = {str(k): int(v) for k, v in dict(self.buckets).items()}
        ids = set(self.one_hot) | set(self.multi_hot)
        for name, n in buckets.items():
            if name not in ids:
                raise DataValueError(f"buckets given for {name!r}, which is not a one-hot or multi-hot column.")
            if n < 1:
                raise DataValueError(f"buckets[{name!r}] must be >= 1, got {n}.")
        object.__setattr__(self, "buckets", buckets)

    def roles(self) -> list[tuple[str, tuple[str, ...]]]:
        """``[(role, column names)]`` in column order: label, dense, one_hot, multi_hot."""
        label = (self.label,) if self.label is not None else ()
        return [("label", label), ("dense", self.dense), ("one_hot", self.one_hot), ("multi_hot", self.multi_hot)]

    @property
    def columns(self) -> tuple[str, ...]:
        """All columns the spec reads, in order."""
        return tuple(name for _, names in self.roles() for name in names)

    def to_json(self) -> str:
        """The spec as JSON (stored in the Parquet schema metadata)."""
        return json.dumps(
            {
                "layout_version": LAYOUT_VERSION,
                "label": self.label,
                "dense": list(self.dense),
                "one_hot": list(self.one_hot),
                "multi_hot": list(self.multi_hot),
                "buckets": dict(self.buckets),
                "multi_hot_encoding": "int64 little-endian ids in a binary column",
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> FeatureSpec:
        """The spec stored by :meth:`to_json`."""
        d = json.loads(text)
        version = d.get("layout_version", LAYOUT_VERSION)
        if version != LAYOUT_VERSION:
            raise DataValueError(f"feature spec has layout version {version}; this hybridtf reads {LAYOUT_VERSION}.")
        return cls(
            label=d.get("label"),
            dense=d.get("dense", ()),
            one_hot=d.get("one_hot", ()),
            multi_hot=d.get("multi_hot", ()),
            buckets=d.get("buckets", {}),
        )


def encode_multi_hot(bags: Any):
    """Multi-hot id bags in hybridtf's on-disk layout: a pyarrow binary array of little-endian int64 ids.

    Args:
        bags: a pyarrow ``list<integer>`` array (or chunked array), or a
            sequence of id sequences / 1-D integer arrays. A null or empty bag
            becomes an empty value.

    Returns:
        ``pyarrow.BinaryArray`` (``LargeBinaryArray`` beyond 2 GiB), one value per bag.

    Raises:
        TypeError: ids that are not integers.
        ValueError: a null id inside a bag, or uint64 ids that int64 cannot hold.

    Example:
        >>> arr = encode_multi_hot([[1, 2], [], [7]])
        >>> [len(v) for v in arr.to_pylist()]
        [16, 0, 8]
    """
    pa, _ = pyarrow_modules()
    import pyarrow.compute as pc

    if isinstance(bags, pa.ChunkedArray):
        bags = bags.combine_chunks()
    if isinstance(bags, (pa.ListArray, pa.LargeListArray)):
        if not pa.types.is_integer(bags.type.value_type):
            raise TypeError(f"multi-hot ids must be integers, got list<{bags.type.value_type}>.")
        lengths = pc.list_value_length(bags).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = pc.list_flatten(bags)
        if flat.null_count:
            raise DataValueError(
                f"{flat.null_count} multi-hot ids are null (inside a bag); drop them or map them to an id of "
                "their own before encoding (a null bag is fine: it becomes an empty bag)."
            )
        values = flat.to_numpy(zero_copy_only=False)
    else:
        arrays = [np.zeros(0, np.int64) if b is None or len(b) == 0 else np.asarray(b) for b in bags]
        for a in arrays:
            if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
                raise TypeError(f"multi-hot ids must be 1-D integer sequences, got dtype {a.dtype}, shape {a.shape}.")
            _check_fits_int64(a)
        lengths = np.array([a.size for a in arrays], dtype=np.int64)
        values = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
    return multi_hot_from_lengths(lengths, values)


def _check_fits_int64(values: np.ndarray) -> None:
    if values.size and values.dtype.kind == "u" and values.dtype.itemsize == 8 and values.max() >= 2**63:
        raise DataValueError(
            "multi-hot ids are uint64 with values of 2**63 or more, which int64 ids cannot hold; reinterpret them "
            "as int64 yourself (values.view(np.int64): distinct ids stay distinct) or hash them into a smaller range."
        )


def multi_hot_from_lengths(lengths: np.ndarray, values: np.ndarray):
    """The multi-hot binary array of bags given as row lengths and the concatenated ids (no copies per row).

    Example:
        >>> [len(v) for v in multi_hot_from_lengths(np.array([2, 0, 1]), np.array([5, 6, 7])).to_pylist()]
        [16, 0, 8]
    """
    pa, _ = pyarrow_modules()
    lengths = np.asarray(lengths, dtype=np.int64)
    values = np.asarray(values)
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"multi-hot ids must be integers, got {values.dtype}.")
    _check_fits_int64(values)
    if lengths.sum() != values.size:
        raise DataValueError(f"row lengths sum to {lengths.sum()} but {values.size} ids were given.")
    data = np.ascontiguousarray(values, dtype="<i8").tobytes()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths * ID_BYTES, out=offsets[1:])
    if offsets[-1] < 2**31:
        buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
        return pa.Array.from_buffers(pa.binary(), len(lengths), buffers)
    return pa.Array.from_buffers(pa.large_binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def decode_multi_hot(values: Any) -> list[np.ndarray]:
    """The id bags of a multi-hot column (inverse of :func:`encode_multi_hot`), for inspection and tests.

    Args:
        values: a pyarrow binary array or a sequence of ``bytes``.

    Returns:
        One int64 array per row.

    Raises:
        ValueError: a value whose length is not a multiple of 8 bytes.

    Example:
        >>> [b.tolist() for b in decode_multi_hot(encode_multi_hot([[1, 2], []]))]
        [[1, 2], []]
    """
    if hasattr(values, "to_pylist"):
        values = values.to_pylist()
    out = []
    for i, v in enumerate(values):
        if len(v) % ID_BYTES:
            raise DataValueError(f"multi-hot value {i} has {len(v)} bytes, not a multiple of {ID_BYTES}.")
        out.append(np.frombuffer(v, dtype="<i8").astype(np.int64))
    return out


def write_parquet(
    path: str | os.PathLike,
    columns: Mapping[str, Any],
    spec: FeatureSpec | None = None,
    *,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    compression: str = "lz4",
) -> None:
    """Writes a Parquet file in hybridtf's layout (multi-hot columns encoded, spec stored).

    Args:
        path: output file.
        columns: ``{name: values}``: 1-D arrays (or pyarrow arrays) for label,
            dense and one-hot columns; for multi-hot columns anything
            :func:`encode_multi_hot` takes (lists of ids, a ``list<int>`` array)
            or an already encoded binary array.
        spec: the feature spec to store; its multi-hot columns are encoded.
            Without a spec, the columns are written as they are.
        row_group_rows: rows per row group. tensorflow-io re-decodes a row
            group from its start for every read, so keep row groups at most a
            few hundred thousand rows.
        compression: Parquet codec. ``"lz4"`` (the default) and ``"none"`` read
            fastest with tensorflow-io; ``"snappy"`` / ``"zstd"`` make smaller,
            slower-to-read files.

    Raises:
        ValueError: columns of different lengths, or a spec column that is not given.

    Example:
        >>> spec = FeatureSpec(label="label", dense=["d"], one_hot=["c"], multi_hot=["m"])
        >>> write_parquet(
        ...     "/tmp/x.parquet",
        ...     {"label": [0.0, 1.0], "d": [0.5, 2.0], "c": [3, 4], "m": [[1, 2], []]},
        ...     spec,
        ... )
    """
    pa, pq = pyarrow_modules()
    if row_group_rows < 1:
        raise DataValueError(f"row_group_rows must be >= 1, got {row_group_rows}.")
    if spec is not None:
        missing = [c for c in spec.columns if c not in columns]
        if missing:
            raise DataValueError(f"write_parquet: spec columns {missing} are not in the given columns {list(columns)}.")
    arrays = {}
    for name, values in columns.items():
        if spec is not None and name in spec.multi_hot:
            is_binary = isinstance(values, pa.Array) and (
                pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)
            )
            arrays[name] = values if is_binary else encode_multi_hot(values)
        elif isinstance(values, (pa.Array, pa.ChunkedArray)):
            arrays[name] = values
        else:
            arrays[name] = pa.array(np.asarray(values))
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise DataValueError(f"write_parquet: columns have different lengths {lengths}.")
    nulls = {name: a.null_count for name, a in arrays.items() if a.null_count}
    if nulls:
        raise DataValueError(
            f"write_parquet: columns hold nulls {nulls}; fill them first (tensorflow-io cannot read nulls)."
        )
    # Required (non-nullable) columns: tensorflow-io reads them faster, and they cannot hold nulls.
    schema = pa.schema([pa.field(name, a.type, nullable=False) for name, a in arrays.items()])
    table = pa.table(arrays, schema=schema)
    if spec is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), SPEC_METADATA_KEY: spec.to_json()})
    pq.write_table(
        table,
        os.fspath(path),
        row_group_size=row_group_rows,
        compression=compression,
        dictionary_pagesize_limit=DICTIONARY_PAGESIZE_LIMIT,
    )
