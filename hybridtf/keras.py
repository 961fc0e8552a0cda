"""hybridtf for Keras: ``optimize`` a model to train with packed, fused embeddings.

Example:
    >>> import hybridtf as htf
    >>> model = htf.keras.optimize(build_model())     # or @htf.keras.optimize on the builder
    >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
    >>> model.fit(dataset)
"""

from hybridtf._src.caching.metrics import HybridHashMetrics
from hybridtf._src.caching.optimizer import dynamic_optimizer
from hybridtf._src.integrations.keras_model import is_optimized, optimize
from hybridtf._src.integrations.keras_optimizers import LazyAdam
from hybridtf._src.integrations.keras_variables import layer_variables

__all__ = ["HybridHashMetrics", "LazyAdam", "dynamic_optimizer", "is_optimized", "layer_variables", "optimize"]
