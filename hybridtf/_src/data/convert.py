"""Criteo, Avazu and Alimama text files to Parquet in hybridtf's layout.

The text (``.gz`` / ``.bz2`` read compressed) is streamed in blocks with
pyarrow's CSV reader (every field read as a string), turned into the output
columns, and written in row groups:

* label: renamed ``label``, float32. An empty label, or one that is not 0 or 1
  (every format's label is a click), is an error naming the file and line.
* dense: float32, the raw value (no ``log(1 + x)`` or other transform; models
  apply their own). A missing (empty) value is 0. A label or dense value that
  is not finite in float32 (``nan``, ``inf``, ``1e39``) is an error naming the line.
  (Lines are the file's own, found by reading it again when a message needs one:
  the reader skips blank lines and a quoted field may span lines.)
* categorical: hashed into ``[0, buckets)`` by :func:`hash_strings`
  (farmhash Fingerprint64, stable everywhere); a missing value is id 0.
* sequences (Alimama behaviour histories, one header column per position with
  a ``mask`` column per position): the hashed ids of the positions whose mask
  is non-zero (read as float64: ``1e-50`` is present), in order, as a
  multi-hot column (padding dropped). A present position with an empty value
  is id 0, as a missing categorical value is.

A file with a header and no rows (with or without a final newline) adds no
rows; a line that is not valid UTF-8 is an error naming it.

Formats (:data:`FORMATS`):

* ``criteo``: ``label, I1..I13, C1..C26``; tab-separated without header (the
  original files) or comma-separated with a header (the sample); detected
  from the first line.
* ``avazu``: CSV with header ``id, click, hour, C1, banner_pos, ..., C21``.
  ``click`` is the label; ``id`` is dropped; ``hour`` (``YYMMDDHH``) becomes
  the categorical ``hour_of_day`` (``HH``) and ``day_of_week`` (0 = Monday);
  the 21 other columns are categorical.
* ``alimama``: CSV with header: 50 columns each of ``cont_btag``,
  ``his_cate``, ``his_brand``, ``mask``, ``match_mask``, then ``uid`` ...
  ``pid``, ``target``. ``target`` is the label, ``price`` dense, the 15 other
  profile/ad columns categorical, ``his_cate``, ``his_brand`` and
  ``cont_btag`` multi-hot (masked by ``mask``); ``match_mask`` is dropped.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hybridtf._src.data.errors import DataValueError, TextFormatError
from hybridtf._src.data.hashing import DEFAULT_BUCKETS, check_buckets, hash_strings
from hybridtf._src.data.layout import (
    DEFAULT_ROW_GROUP_ROWS,
    DICTIONARY_PAGESIZE_LIMIT,
    SPEC_METADATA_KEY,
    FeatureSpec,
    multi_hot_from_lengths,
    pyarrow_modules,
)
from hybridtf._src.data.schema import check_parquet
from hybridtf._src.data.text_input import (
    RecordWhere,
    bad_record,
    compression_of,
    first_invalid_utf8_line,
    first_line,
    line_of_record,
    only_one_line,
)
from hybridtf._src.limits import INT64_MAX


def _avazu_hour(hour, where) -> dict:
    """``hour`` (``YYMMDDHH``, 8 ASCII digits) -> ``hour_of_day`` (``"HH"``) and ``day_of_week`` (``"0"`` = Monday).

    ``where(i)`` names the block's record ``i`` in an error.
    """
    pa, _ = pyarrow_modules()
    import pyarrow.compute as pc

    encoded = hour.dictionary_encode()
    hod, dow = [], []
    for s in encoded.dictionary.to_pylist():
        try:
            if not (len(s) == 8 and s.isascii() and s.isdigit()):  # int() would take signs, spaces, other digits
                raise ValueError(s)
            day = datetime.date(2000 + int(s[0:2]), int(s[2:4]), int(s[4:6]))
            if not 0 <= int(s[6:8]) < 24:
                raise ValueError(s)
        except ValueError:
            i = pc.index(hour, pa.scalar(s, pa.string())).as_py()
            raise TextFormatError(
                f"{where(i)}: avazu column 'hour' holds {s!r}; expected YYMMDDHH (8 digits), e.g. 14102100."
            ) from None
        hod.append(s[6:8])
        dow.append(str(day.weekday()))
    idx = encoded.indices
    return {"hour_of_day": pa.array(hod).take(idx), "day_of_week": pa.array(dow).take(idx)}


@dataclasses.dataclass(frozen=True)
class TextFormat:
    """How the columns of one text format become label, dense, one-hot and multi-hot columns.

    Attributes:
        name: the format's name.
        label: the label column in the text (written as ``label``).
        dense: dense columns.
        categorical: categorical columns, hashed one-to-one.
        sequences: columns repeated once per history position (multi-hot outputs).
        sequence_mask: the per-position mask column (non-zero: the position is present).
        headerless_columns: the column names of files without a header (None: a header is required).
        delimiter: the field separator, or None to detect tab vs comma from the first line.
        derive: makes extra categorical columns ``{name: strings}`` from the text columns and
            ``where`` (``where(i)`` names the block's record ``i`` in an error).
        derive_from: the text columns ``derive`` reads.
        derived: the names ``derive`` makes.
    """

    name: str
    label: str
    dense: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    sequences: tuple[str, ...] = ()
    sequence_mask: str | None = None
    headerless_columns: tuple[str, ...] | None = None
    delimiter: str | None = ","
    derive: Callable[[dict, Callable], dict] | None = dataclasses.field(default=None, repr=False)
    derive_from: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()

    @property
    def one_hot(self) -> tuple[str, ...]:
        return self.categorical + self.derived

    def spec(self, buckets: Mapping[str, int]) -> FeatureSpec:
        ids = self.one_hot + self.sequences
        return FeatureSpec("label", self.dense, self.one_hot, self.sequences, {c: buckets[c] for c in ids})

    def required(self) -> tuple[str, ...]:
        mask = (self.sequence_mask,) if self.sequence_mask else ()
        return (self.label, *self.dense, *self.categorical, *self.derive_from, *self.sequences, *mask)


_CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
_CRITEO_CAT = tuple(f"C{i}" for i in range(1, 27))
FORMATS: dict[str, TextFormat] = {
    "criteo": TextFormat(
        "criteo",
        label="label",
        dense=_CRITEO_DENSE,
        categorical=_CRITEO_CAT,
        headerless_columns=("label", *_CRITEO_DENSE, *_CRITEO_CAT),
        delimiter=None,
    ),
    "avazu": TextFormat(
        "avazu",
        label="click",
        categorical=tuple(
            "C1 banner_pos site_id site_domain site_category app_id app_domain app_category device_id device_ip "
            "device_model device_type device_conn_type C14 C15 C16 C17 C18 C19 C20 C21".split()
        ),
        derive=lambda cols, where: _avazu_hour(cols["hour"], where),
        derive_from=("hour",),
        derived=("hour_of_day", "day_of_week"),
    ),
    "alimama": TextFormat(
        "alimama",
        label="target",
        dense=("price",),
        categorical=tuple(
            "uid cms_segid cms_group_id final_gender_code age_level pvalue_level shopping_level occupation "
            "new_user_class_level mid cate_id campaign_id customer brand pid".split()
        ),
        sequences=("his_cate", "his_brand", "cont_btag"),
        sequence_mask="mask",
    ),
}


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _parse_error(error, path, fmt, delimiter, names, header, line) -> TextFormatError:
    """The reader's ``error`` with the line of the first record of the wrong width, when there is one.

    The reader parses blocks ahead, so a failing block's first line (``line``, None for the first block)
    is not the bad line: it is found by reading the file again (``bad_record``).
    """
    if "invalid UTF8" in str(error):
        line_utf8 = first_invalid_utf8_line(path)
        if line_utf8 is not None:
            return TextFormatError(
                f"{path}: line {line_utf8} is not valid UTF-8 text ({error}); re-encode the file as UTF-8 "
                "(e.g. iconv -f latin1 -t utf-8) or drop that line."
            )
    found = bad_record(path, delimiter, len(names), int(header))
    if found:
        where = f"line {found[0]} has {found[1]} fields, not {len(names)} ({error})"
    else:
        where = str(error) if line is None else f"at or after line {line} ({error})"
    return TextFormatError(f"{path}: not a valid {fmt.name} file: {where}")


def _layout(path: str, fmt: TextFormat) -> tuple[list[str], bool, str]:
    """``(column names, has header, delimiter)`` of one text input."""
    first = first_line(path)
    if not first:
        raise TextFormatError(f"text input {path!r} is empty; a {fmt.name} file needs at least a header or a row.")
    delimiter = fmt.delimiter or ("\t" if "\t" in first else ",")
    fields = [f.strip().strip('"') for f in first.split(delimiter)]
    if fmt.headerless_columns is not None and _is_number(fields[0]):
        names, header = list(fmt.headerless_columns), False
        if len(fields) != len(names):
            raise TextFormatError(
                f"{path}: the first row has {len(fields)} fields, but a {fmt.name} row without header has "
                f"{len(names)} ({', '.join(names[:5])}, ...)."
            )
    else:
        names, header = fields, True
    missing = [c for c in dict.fromkeys(fmt.required()) if c not in names]
    if missing:
        raise TextFormatError(
            f"{path} lacks the {fmt.name} columns {missing} (header: {', '.join(names[:12])}"
            f"{', ...' if len(names) > 12 else ''}); is this {fmt.name} data?"
        )
    return names, header, delimiter


def _parse_floats(arr, column: str, where, allow_empty: bool, float32: bool = True):
    """Strings -> float32 numpy; empty -> 0 when ``allow_empty``, otherwise an error naming the line.

    ``where(i)`` names the block's record ``i`` (``RecordWhere``). A value that is not finite in float32
    (``nan``, ``inf``, ``1e39``) is an error too: it would train as inf or NaN. ``float32=False`` returns
    the float64 values (a mask, where only non-zero matters: ``1e-50`` is present, not rounded to 0).
    """
    pa, _ = pyarrow_modules()
    import pyarrow.compute as pc

    arr = pc.utf8_trim_whitespace(arr)
    if allow_empty:
        arr = pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr)
    allowed = "a number or empty" if allow_empty else "a number"
    try:
        out = pc.cast(arr, pa.float64())
    except pa.ArrowInvalid as e:
        bad = _first_unparsable(arr)
        at = f"{where(bad)} ({arr[bad].as_py()!r})" if bad is not None else f"{where(0)} or later"
        raise TextFormatError(f"{at}: column {column!r} must be {allowed}: {e}") from None
    values = out.fill_null(0.0).to_numpy(zero_copy_only=False)
    limit = _FLOAT32_MAX if float32 else np.finfo(np.float64).max
    wrong = ~(np.abs(values) <= limit)  # NaN, infinities, and values float32 cannot hold
    if wrong.any():
        i = int(np.argmax(wrong))
        kind = f"float32 value (|x| <= {_FLOAT32_MAX:.4g})" if float32 else "number"
        raise TextFormatError(
            f"{where(i)}: column {column!r} holds {arr[i].as_py()!r}, which is not a finite "
            f"{kind}; it would train as inf or NaN. Fix or drop that row."
        )
    return values.astype(np.float32) if float32 else values


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _first_unparsable(arr) -> int | None:
    """The index of the first string of ``arr`` that is not a number (None values and numbers pass)."""
    for i, text in enumerate(arr.to_pylist()):
        if text is None:
            continue
        try:
            float(text)
        except ValueError:
            return i
    return None


class _BlockConverter:
    """Turns blocks of text columns (all strings) into output tables."""

    def __init__(self, fmt: TextFormat, names: list[str], buckets: Mapping[str, int], path: str):
        self.fmt, self.buckets, self.path = fmt, buckets, path
        self.positions: dict[str, list[int]] = {}
        for i, n in enumerate(names):
            self.positions.setdefault(n, []).append(i)
        if fmt.sequences:
            k = {c: len(self.positions[c]) for c in (*fmt.sequences, fmt.sequence_mask) if c}
            if len(set(k.values())) != 1:
                raise TextFormatError(f"{path}: sequence columns have different numbers of positions {k}.")

    def __call__(self, batch, where):
        pa, _ = pyarrow_modules()
        fmt = self.fmt

        def col(name):
            return batch.column(self.positions[name][0])

        label = _parse_floats(col(fmt.label), fmt.label, where, allow_empty=False)
        not_click = (label != 0) & (label != 1)
        if not_click.any():
            i = int(np.argmax(not_click))
            raise TextFormatError(
                f"{where(i)}: label column {fmt.label!r} holds {col(fmt.label)[i].as_py()!r}; "
                f"a {fmt.name} label is a click, 0 or 1. Fix or drop that row (for other labels, write the "
                "Parquet file yourself: hybridtf.data.write_parquet)."
            )
        out = {"label": label}
        for c in fmt.dense:
            out[c] = _parse_floats(col(c), c, where, allow_empty=True)
        for c in fmt.categorical:
            out[c] = hash_strings(col(c), self.buckets[c])
        if fmt.derive is not None:
            for c, strings in fmt.derive({n: col(n) for n in fmt.derive_from}, where).items():
                out[c] = hash_strings(strings, self.buckets[c])
        if fmt.sequences:
            mask_cols = [batch.column(i) for i in self.positions[fmt.sequence_mask]]
            mask = np.stack(
                [_parse_floats(m, fmt.sequence_mask, where, allow_empty=True, float32=False) for m in mask_cols], axis=1
            )
            keep = mask != 0
            for c in fmt.sequences:
                strings = pa.chunked_array([batch.column(i) for i in self.positions[c]])
                ids = hash_strings(strings, self.buckets[c]).reshape(len(self.positions[c]), batch.num_rows).T
                out[c] = multi_hot_from_lengths(keep.sum(axis=1), ids[keep])
        return out


def _output_schema(spec: FeatureSpec):
    pa, _ = pyarrow_modules()
    fields = [pa.field("label", pa.float32(), nullable=False)]
    fields += [pa.field(c, pa.float32(), nullable=False) for c in spec.dense]
    fields += [pa.field(c, pa.int64(), nullable=False) for c in spec.one_hot]
    fields += [pa.field(c, pa.binary(), nullable=False) for c in spec.multi_hot]
    return pa.schema(fields, metadata={SPEC_METADATA_KEY: spec.to_json()})


def convert_text(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    output: str | os.PathLike,
    format: str,
    *,
    buckets: int | Mapping[str, int] = DEFAULT_BUCKETS,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    compression: str = "lz4",
    block_bytes: int = 1 << 24,
) -> tuple[FeatureSpec, int]:
    """Converts Criteo / Avazu / Alimama text files into one Parquet file that ``parquet_dataset`` reads.

    Args:
        inputs: one text file or several (concatenated in order; ``.gz`` is read compressed).
        output: the Parquet file to write.
        format: ``"criteo"``, ``"avazu"`` or ``"alimama"`` (see :data:`FORMATS`).
        buckets: id space of every categorical column (int), or
            ``{output column: n}`` (columns not named get :data:`DEFAULT_BUCKETS`).
            Ids are ``0`` for missing values and ``1 + hash mod (n - 1)`` otherwise.
        row_group_rows: rows per Parquet row group.
        compression: Parquet codec (``"lz4"`` reads fastest with tensorflow-io).
        block_bytes: bytes of text parsed at a time.

    Returns:
        ``(spec, rows)``: the :class:`FeatureSpec` stored in the file (label
        ``"label"``, the format's dense / one-hot / multi-hot columns and their
        buckets), and the number of rows written.

    The file is written under a temporary name next to ``output`` and renamed
    when complete: a conversion that fails leaves no partial output.

    Raises:
        ValueError: an unknown format or compression, bad buckets, buckets for an
            unknown column, an output that is an input, a directory, or in a
            directory that does not exist.
        TextFormatError: an input that is missing, lacks the format's columns,
            has rows with the wrong number of fields, or values that are not numbers where numbers belong.

    Example:
        >>> spec, rows = convert_text("criteo_sample.txt", "criteo.parquet", "criteo", buckets=2**18)  # doctest: +SKIP
        >>> ds = parquet_dataset("criteo.parquet", spec=spec, batch_size=64)  # doctest: +SKIP
    """
    if format not in FORMATS:
        raise DataValueError(f"unknown text format {format!r}; choose one of {sorted(FORMATS)}.")
    fmt = FORMATS[format]
    ids = fmt.one_hot + fmt.sequences
    if isinstance(buckets, Mapping):
        unknown = sorted(set(buckets) - set(ids))
        if unknown:
            raise DataValueError(f"buckets for {unknown}, which are not {format} id columns ({', '.join(ids)}).")
        per_column = {c: check_buckets(buckets.get(c, DEFAULT_BUCKETS), f"buckets[{c!r}]") for c in ids}
    else:
        n = check_buckets(buckets)
        per_column = dict.fromkeys(ids, n)
    if not 1 <= row_group_rows <= INT64_MAX:
        raise DataValueError(f"row_group_rows must be in [1, 2**63 - 1], got {row_group_rows}.")
    paths = [os.fspath(inputs)] if isinstance(inputs, (str, os.PathLike)) else [os.fspath(p) for p in inputs]
    if not paths:
        raise DataValueError("convert_text needs at least one input file.")
    for p in paths:
        if not os.path.isfile(p):
            raise TextFormatError(f"text input {p!r} does not exist or is not a file.")
    output = os.fspath(output)
    _check_output(output, paths, compression)
    spec = fmt.spec(per_column)
    # Written to a temporary file next to the output and renamed when complete: a failure (a bad
    # row in the last input, a full disk) leaves no partial file that a training job would read.
    partial = os.path.join(os.path.dirname(output) or ".", f".{os.path.basename(output)}.partial-{os.getpid()}")
    try:
        rows = _write(paths, partial, fmt, spec, per_column, row_group_rows, compression, block_bytes)
        os.replace(partial, output)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return spec, rows


_COMPRESSIONS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")


def _check_output(output: str, inputs: Sequence[str], compression: str) -> None:
    """Refuses an output that would overwrite an input, a missing output directory and an unknown codec."""
    if not output:
        raise DataValueError("the output path is empty; give the Parquet file to write, e.g. train.parquet.")
    target = os.path.realpath(output)
    clash = [p for p in inputs if os.path.realpath(p) == target]
    if clash:
        raise DataValueError(f"the output {output!r} is also an input ({clash[0]!r}); write to another file.")
    if os.path.isdir(output):
        raise DataValueError(f"the output {output!r} is a directory; give a file name, e.g. {output}/part-0.parquet.")
    directory = os.path.dirname(output) or "."
    if not os.path.isdir(directory):
        raise DataValueError(f"the output's directory {directory!r} does not exist; create it first.")
    if not isinstance(compression, str) or compression.lower() not in _COMPRESSIONS:
        raise DataValueError(f"unknown compression {compression!r}; choose one of {', '.join(_COMPRESSIONS)}.")


def _write(paths, output, fmt, spec, per_column, row_group_rows, compression, block_bytes) -> int:
    """Converts the text ``paths`` into the Parquet file ``output``; returns the number of rows."""
    pa, pq = pyarrow_modules()
    import pyarrow.csv as pcsv

    schema = _output_schema(spec)
    rows = 0
    pending: list = []
    pending_rows = 0
    with pq.ParquetWriter(
        output, schema, compression=compression, dictionary_pagesize_limit=DICTIONARY_PAGESIZE_LIMIT
    ) as writer:

        def flush(final: bool):
            nonlocal pending, pending_rows
            if not pending:
                return
            table = pa.concat_tables(pending)
            full = table.num_rows if final else table.num_rows - table.num_rows % row_group_rows
            for a in range(0, full, row_group_rows):
                writer.write_table(table.slice(a, min(row_group_rows, full - a)), row_group_size=row_group_rows)
            rest = table.slice(full)
            pending, pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

        for path in paths:
            names, header, delimiter = _layout(path, fmt)
            convert = _BlockConverter(fmt, names, per_column, path)
            keys = [f"f{i}" for i in range(len(names))]
            codec, _ = compression_of(path)
            try:
                reader = pcsv.open_csv(
                    pa.input_stream(path, compression=codec),
                    read_options=pcsv.ReadOptions(column_names=keys, skip_rows=int(header), block_size=block_bytes),
                    parse_options=pcsv.ParseOptions(delimiter=delimiter),
                    convert_options=pcsv.ConvertOptions(
                        column_types=dict.fromkeys(keys, pa.string()),
                        strings_can_be_null=False,
                        quoted_strings_can_be_null=False,
                    ),
                )
            except (pa.ArrowInvalid, OSError) as e:  # the first block failed to parse
                if header and only_one_line(path):  # a header without a final newline and no rows
                    continue
                raise _parse_error(e, path, fmt, delimiter, names, header, None) from None
            first_record = 0  # of the block, among the data records
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError) as e:
                    line = line_of_record(path, delimiter, header, first_record) if first_record else None
                    raise _parse_error(e, path, fmt, delimiter, names, header, line) from None
                columns = convert(batch, RecordWhere(path, delimiter, header, first_record))
                arrays = [pa.array(columns[f.name], type=f.type) for f in schema]
                pending.append(pa.Table.from_arrays(arrays, schema=schema))
                pending_rows += batch.num_rows
                rows += batch.num_rows
                first_record += batch.num_rows
                if pending_rows >= row_group_rows:
                    flush(final=False)
        flush(final=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hybridtf.data convert --format criteo --input X --output Y.parquet [--buckets N]``,
    ``python -m hybridtf.data check PATH...``."""
    parser = argparse.ArgumentParser(prog="python -m hybridtf.data", description="hybridtf data tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert", help="convert Criteo / Avazu / Alimama text to Parquet for parquet_dataset")
    conv.add_argument("--format", required=True, choices=sorted(FORMATS))
    conv.add_argument("--input", required=True, action="append", help="text file (repeat for several; .gz ok)")
    conv.add_argument("--output", required=True, help="Parquet file to write")
    conv.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS, help="id space per categorical column")
    conv.add_argument("--row-group-rows", type=int, default=DEFAULT_ROW_GROUP_ROWS)
    conv.add_argument("--compression", default="lz4")
    check = sub.add_parser(
        "check", help="decode every row group of Parquet files: list every damaged file before training"
    )
    check.add_argument("paths", nargs="+", help="Parquet files, directories or glob patterns")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.command == "check":
        try:
            rows = check_parquet(args.paths, keep_going=True)
        except (ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"ok: {rows} rows decoded in {time.perf_counter() - start:.1f}s")
        return 0
    try:
        spec, rows = convert_text(
            args.input,
            args.output,
            args.format,
            buckets=args.buckets,
            row_group_rows=args.row_group_rows,
            compression=args.compression,
        )
    except (TextFormatError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {rows} rows to {args.output} in {time.perf_counter() - start:.1f}s: label, "
        f"{len(spec.dense)} dense, {len(spec.one_hot)} one-hot, {len(spec.multi_hot)} multi-hot columns "
        f"(ids in [0, {args.buckets}), 0 = missing)"
    )
    return 0
