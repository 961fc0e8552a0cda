"""Data side: synthetic CTR-like id streams, and the tensorflow-io Parquet input pipeline (``hybridtf.data``)."""
