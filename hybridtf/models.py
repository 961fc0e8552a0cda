"""Example CTR models to try hybridtf on, and the synthetic data they train on (public API).

The builders are plain Keras code (stock ``Embedding`` layers, one per field), the kind of model
``hybridtf.keras.optimize`` is meant to wrap unchanged: Wide & Deep, DeepFM, DLRM and a DIN-style
model with target attention over behaviour sequences. Every builder takes ``(fields, n_dense, ...)``
and returns an uncompiled ``tf.keras.Model`` from a feature dict (int64 ids per one-hot field,
ragged int64 ids per multi-hot field, float32 ``"dense"`` features) to click probabilities
``[B, 1]``. The same builders back ``python -m hybridtf.report --model wdl``, the examples and the
benchmarks.

Example:
    >>> import hybridtf as htf
    >>> fields = htf.models.criteo_like_fields(dim=16, max_vocab=10_000)
    >>> data = htf.models.make_dataset(fields, htf.models.CRITEO_NUM_DENSE, batch_size=256, num_batches=20)
    >>> model = htf.keras.optimize(htf.models.wide_and_deep(fields, htf.models.CRITEO_NUM_DENSE))
    >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
    >>> model.fit(data)  # doctest: +SKIP
"""

from hybridtf._src.models.ctr_data import (
    CRITEO_CARDINALITIES,
    CRITEO_NUM_DENSE,
    DENSE_KEY,
    MULTI_HOT,
    ONE_HOT,
    FieldSpec,
    criteo_like_fields,
    din_fields,
    generate_batch,
    generate_batches,
    make_dataset,
    many_fields,
    to_tensors,
)
from hybridtf._src.models.ctr_models import (
    MODELS,
    SUBCLASSED_MODELS,
    DLRMModel,
    WideAndDeepModel,
    deepfm,
    din_like,
    dlrm,
    model_inputs,
    wide_and_deep,
)
from hybridtf._src.models.examples import EXAMPLE_MODELS, FIELD_SETS, build_example, example_batch, example_fields
from hybridtf._src.models.layers import AttentionPooling, DotInteraction, FMInteraction, RaggedPooling, SumFeatures

__all__ = [
    "CRITEO_CARDINALITIES",
    "CRITEO_NUM_DENSE",
    "DENSE_KEY",
    "EXAMPLE_MODELS",
    "FIELD_SETS",
    "MODELS",
    "MULTI_HOT",
    "ONE_HOT",
    "SUBCLASSED_MODELS",
    "AttentionPooling",
    "DLRMModel",
    "DotInteraction",
    "FMInteraction",
    "FieldSpec",
    "RaggedPooling",
    "SumFeatures",
    "WideAndDeepModel",
    "build_example",
    "criteo_like_fields",
    "deepfm",
    "din_fields",
    "din_like",
    "dlrm",
    "example_batch",
    "example_fields",
    "generate_batch",
    "generate_batches",
    "make_dataset",
    "many_fields",
    "model_inputs",
    "to_tensors",
    "wide_and_deep",
]
