"""Exception classes of ``hybridtf.data``.

Each also derives from the built-in exception a caller would expect
(``OSError`` for files, ``ValueError`` for contents, ``TypeError`` for column
types), so ``except ValueError`` keeps working; ``except DataError`` catches
them all. Messages name the file and the column and say what to do.
"""

from __future__ import annotations

from hybridtf._src.errors import HybridTFError


class DataError(HybridTFError):
    """Base class of the errors raised by ``hybridtf.data``."""


class DataValueError(DataError, ValueError):
    """A bad argument (batch size, rank, paths, buckets, ...) or a value the inputs cannot hold."""


class ParquetFileError(DataError, OSError):
    """A Parquet input is missing, unreadable, or not a Parquet file."""


class ParquetSchemaError(DataError, ValueError):
    """A requested column is missing, holds nulls, or differs between files."""


class ColumnTypeError(DataError, TypeError):
    """A column's type does not fit the role it was requested for (e.g. strings as one-hot ids)."""


class TextFormatError(DataError, ValueError):
    """A text input (Criteo, Avazu, Alimama) does not have the expected columns or values."""
