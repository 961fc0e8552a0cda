"""Reading the converter's text inputs (``convert``): compression by suffix, the first line, and the
file's own line of a record for error messages.

pyarrow's CSV reader streams the data; these helpers read the file with Python (``gzip`` / ``bz2`` /
``csv``) only for its first line and, on an error path, to find the physical line of a record (the reader
skips blank lines and a quoted field may span lines, so a record's index is not its line).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import os
import zlib

from hybridtf._src.data.errors import TextFormatError

# Inputs the converter decompresses, by suffix (any case); other compressed suffixes are refused.
DECOMPRESSED = {".gz": ("gzip", gzip.open), ".bz2": ("bz2", bz2.open)}
UNSUPPORTED = (".zst", ".zstd", ".lz4", ".xz", ".lzma", ".zip", ".7z", ".br", ".snappy")
# Errors of reading a damaged compressed input (zlib's is not an OSError).
READ_ERRORS = (OSError, EOFError, zlib.error)


def compression_of(path: str) -> tuple[str | None, object]:
    """``(pyarrow codec or None, Python opener)`` of a text input, by its suffix."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix in UNSUPPORTED:
        raise TextFormatError(
            f"text input {path!r} is compressed with {suffix[1:]}, which the converter does not read; "
            "decompress it first (or compress it with gzip or bzip2: .gz / .bz2 inputs are read compressed)."
        )
    return DECOMPRESSED.get(suffix, (None, open))


def first_line(path: str) -> str:
    codec, opener = compression_of(path)
    try:
        with opener(path, "rb") as f:
            line = f.readline()
    except READ_ERRORS as e:
        raise TextFormatError(f"cannot read text input {path!r} ({type(e).__name__}: {e}); is it damaged?") from e
    if codec is None and line.startswith((b"\x1f\x8b", b"BZh")):
        kind, suffix = ("gzip", ".gz") if line.startswith(b"\x1f\x8b") else ("bzip2", ".bz2")
        raise TextFormatError(
            f"text input {path!r} is {kind}-compressed (it starts with {kind}'s magic bytes); name it with a "
            f"{suffix} suffix, which the converter decompresses, or decompress it first."
        )
    text = line.decode("utf-8-sig", errors="replace").rstrip("\r\n")
    if "\r" in text:
        raise TextFormatError(
            f"text input {path!r} ends its lines with a lone carriage return (\\r, old Mac line ends); the "
            "converter reads \\n or \\r\\n line ends: convert them first (e.g. tr '\\r' '\\n')."
        )
    return text


def records(path: str, delimiter: str):
    """``(first line, fields)`` of each record of ``path`` read with Python's csv module (an error path).

    It counts physical lines (a quoted field may span several); a blank line is a record without
    fields, which the reader skips.
    """
    _, opener = compression_of(path)
    with opener(path, "rt", encoding="utf-8-sig", errors="replace", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        end = 0
        for fields in reader:
            start, end = end + 1, reader.line_num
            yield start, fields


def _data_records(path: str, delimiter: str, header: bool):
    """``records`` without the header and the blank lines: the records the reader turns into rows."""
    for start, fields in records(path, delimiter):
        if fields and not (header and start == 1):
            yield start, fields


def line_of_record(path: str, delimiter: str, header: bool, record: int) -> int | None:
    """The first line of data record ``record`` (0-based, after the header, blank lines not counted)."""
    try:
        for k, (start, _) in enumerate(_data_records(path, delimiter, header)):
            if k == record:
                return start
    except (*READ_ERRORS, csv.Error):
        return None
    return None


class RecordWhere:
    """Names data records of one block of a text input in messages: ``where(i)`` is ``"<path>, line L"``.

    The line is found by reading the file again (only when a message needs it): the reader skips blank
    lines and a quoted field may span lines, so the block's record index alone would not give it.
    """

    def __init__(self, path: str, delimiter: str, header: bool, first_record: int):
        self.path, self.delimiter, self.header, self.first_record = path, delimiter, header, first_record

    def __call__(self, i: int) -> str:
        record = self.first_record + int(i)
        line = line_of_record(self.path, self.delimiter, self.header, record)
        return f"{self.path}, line {line}" if line else f"{self.path}, data row {record + 1}"


def bad_record(path: str, delimiter: str, fields: int, header: bool) -> tuple[int, int] | None:
    """``(line, fields)`` of the first record of ``path`` (after the header) without ``fields`` fields, or None.

    Called after the reader failed (an error path): reads the file again (``records``).
    """
    try:
        for start, record in _data_records(path, delimiter, header):
            if len(record) != fields:
                return start, len(record)
    except (*READ_ERRORS, csv.Error):
        return None
    return None


def first_invalid_utf8_line(path: str) -> int | None:
    """The number of the first line of ``path`` that is not valid UTF-8, or None (an error path)."""
    _, opener = compression_of(path)
    try:
        with opener(path, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    return number
    except READ_ERRORS:
        return None
    return None


def only_one_line(path: str) -> bool:
    """Whether ``path`` holds a single line (a header without rows; its final newline may be missing)."""
    _, opener = compression_of(path)
    try:
        with opener(path, "rb") as f:
            f.readline()
            return not f.read(1)
    except READ_ERRORS:
        return False
