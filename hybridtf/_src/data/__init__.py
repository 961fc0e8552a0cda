"""Data side (``hybridtf.data``): the tensorflow-io Parquet input pipeline and text-to-Parquet conversion.

* ``layout``: the on-disk layout of the Parquet inputs and the ``FeatureSpec`` stored with them.
* ``schema``: finding Parquet inputs and checking their columns before any data is read.
* ``parquet``: the input pipeline (tensorflow-io reads, per-rank row shards, exact batches).
* ``convert``, ``hashing``: Criteo / Avazu / Alimama text to Parquet, strings hashed into id space.
* ``errors``: the exception classes.
* ``synthetic``: Zipf-skewed synthetic id streams (used by ``hybridtf.models``' synthetic data).
"""
