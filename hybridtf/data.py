"""Parquet input pipelines and text-to-Parquet conversion (public API).

``parquet_dataset`` reads Parquet files with tensorflow-io into batches of
dense, one-hot and multi-hot (ragged) features, sharded by rows over ranks;
``convert_text`` (``python -m hybridtf.data convert ...``) turns Criteo,
Avazu and Alimama text files into such Parquet files, hashing categorical
strings into id space; ``check_parquet`` (``python -m hybridtf.data check
...``) decodes whole files to find damaged ones. See ``docs/data_guide.md``.

Example:
    >>> import hybridtf as htf
    >>> spec, rows = htf.data.convert_text("criteo_sample.txt", "criteo.parquet", "criteo")  # doctest: +SKIP
    >>> ds = htf.data.parquet_dataset("criteo.parquet", spec=spec, batch_size=4096)  # doctest: +SKIP
"""

import sys

from hybridtf._src.data.convert import FORMATS, TextFormat, convert_text, main
from hybridtf._src.data.errors import (
    ColumnTypeError,
    DataError,
    DataValueError,
    ParquetFileError,
    ParquetSchemaError,
    TextFormatError,
)
from hybridtf._src.data.hashing import DEFAULT_BUCKETS, MISSING_ID, hash_strings
from hybridtf._src.data.layout import (
    FeatureSpec,
    decode_multi_hot,
    encode_multi_hot,
    write_parquet,
)
from hybridtf._src.data.parquet import parquet_dataset, shard_rows
from hybridtf._src.data.schema import check_parquet, read_feature_spec

__all__ = [
    "DEFAULT_BUCKETS",
    "FORMATS",
    "MISSING_ID",
    "ColumnTypeError",
    "DataError",
    "DataValueError",
    "FeatureSpec",
    "ParquetFileError",
    "ParquetSchemaError",
    "TextFormat",
    "TextFormatError",
    "check_parquet",
    "convert_text",
    "decode_multi_hot",
    "encode_multi_hot",
    "hash_strings",
    "parquet_dataset",
    "read_feature_spec",
    "shard_rows",
    "write_parquet",
]

if __name__ == "__main__":
    sys.exit(main())
