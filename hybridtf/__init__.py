"""hybridtf: packed, fused, hybrid-parallel embedding training for TensorFlow.

Public modules:
    hybridtf.ops:    fused TensorFlow ops (``unique_partition``).
    hybridtf.native: the same algorithms on NumPy arrays (pybind11), no graph.
"""

from hybridtf import native, ops

__version__ = "0.1.0"
__all__ = ["__version__", "native", "ops"]
