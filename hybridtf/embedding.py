"""The functional embedding API: tables and lookups without Keras layers.

``Tables`` owns a set of embedding tables packed into a few variables; its
lookups (one-hot, or multi-hot bags with sum/mean/sqrtn) work eagerly, in
``tf.function`` and in TF1-style graphs (Estimator model_fns). Inside
``hybridtf.function`` all lookups of a step run as one fused chain per packed
table. Checkpoints keep one entry per table. A ``DynamicTableConfig`` declares
a dynamic table (no vocabulary, any int64 id, a HybridHash store); train it
with an optimizer passed through ``hybridtf.keras.dynamic_optimizer``.

Example:
    >>> import hybridtf as htf
    >>> tables = htf.embedding.Tables(
    ...     [htf.embedding.TableConfig("user", 1000, 8), htf.embedding.TableConfig("item", 5000, 8)]
    ... )
    >>> user = tables.lookup("user", tf.constant([3, 7]))                                 # [2, 8]
    >>> items = htf.embedding.lookup(tables, "item", tf.ragged.constant([[1, 2], []]), "mean")
    >>> hashed = htf.embedding.Tables([htf.embedding.DynamicTableConfig("user_hash", 8, hot_rows=10_000)])
    >>> rows = hashed.lookup("user_hash", tf.constant([2**62, 7]), training=True)
"""

from hybridtf._src.caching.dynamic_table import DynamicTableConfig
from hybridtf._src.capture.lookup_api import TableConfig, Tables, lookup

__all__ = ["DynamicTableConfig", "TableConfig", "Tables", "lookup"]
