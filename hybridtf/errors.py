"""hybridtf's exception classes (public API). Every message says what was wrong and what to do."""

from hybridtf._src.capture.context import CaptureError
from hybridtf._src.errors import (
    CollectiveAbortedError,
    CollectiveTimeoutError,
    HybridTFError,
    InterleavingError,
    NativeModuleError,
    OpLibraryError,
    PlanKeyError,
)
from hybridtf._src.integrations.keras_slots import OptimizerLayoutError
from hybridtf._src.rewrite.packed_storage import CheckpointLayoutError
from hybridtf._src.run.second_order import SecondOrderGradientError

__all__ = [
    "CaptureError",
    "CheckpointLayoutError",
    "CollectiveAbortedError",
    "CollectiveTimeoutError",
    "HybridTFError",
    "InterleavingError",
    "NativeModuleError",
    "OpLibraryError",
    "OptimizerLayoutError",
    "PlanKeyError",
    "SecondOrderGradientError",
]
