"""The public API is what the docs show, and the planner stays TensorFlow-free."""

from __future__ import annotations

import subprocess
import sys

import hybridtf as htf


def test_public_modules_and_names():
    for module, names in {
        "keras": ["optimize", "is_optimized", "LazyAdam"],
        "ops": ["unique_partition", "stitch_combine", "even_range_bounds", "stock_tf_unique_partition"],
        "native": ["unique_partition"],
        "plan": ["PackingPlan", "TableSpec", "plan_packing", "collect_stats"],
        "errors": ["HybridTFError", "OpLibraryError", "CheckpointLayoutError", "CaptureError", "PlanKeyError"],
        "embedding": ["Tables", "TableConfig", "lookup"],
        "layers": ["EmbeddingBag"],
        "report": ["count_ops", "report"],
    }.items():
        mod = getattr(htf, module)
        missing = [n for n in names if not hasattr(mod, n)]
        assert not missing, f"hybridtf.{module} lacks {missing}"
    assert callable(htf.function)


def test_plan_and_native_do_not_import_tensorflow():
    code = (
        "import sys, numpy as np, hybridtf as h\n"
        "p = h.plan.plan_packing([h.plan.TableSpec('a', 10, 4), h.plan.TableSpec('b', 20, 4)])\n"
        "h.native.unique_partition(np.array([3, 1, 3]), 2)\n"
        "assert h.plan.PackingPlan.from_json(p.to_json()) == p\n"
        "print('tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
