"""What hybridtf did to a model, PICASSO Table V style: training-step op counts, plan, tables, fusions.

Example:
    >>> import hybridtf as htf
    >>> import hybridtf.report
    >>> plain, model = build_model(), htf.keras.optimize(build_model())
    >>> for m in (plain, model):
    ...     m.compile(optimizer="adagrad", loss="binary_crossentropy")
    >>> print(hybridtf.report.report(model, (features, labels), baseline=plain))
    >>> print(hybridtf.report.report(model))  # a synthetic batch of the model's inputs
    >>> hybridtf.report.count_ops(model, (features, labels))["total"]
    >>> hybridtf.report.dynamic_tables(model)["user"]["hit_ratio"]     # DynamicEmbedding / Tables statistics

Command line (a built-in example by short name, or your own builder of a built Keras model)::

    python -m hybridtf.report --model wdl|deepfm|dlrm|din|none --fields criteo|200 [--dynamic STEPS] [--json]
    python -m hybridtf.report --model wdl --micro-batches 2 --timing 5   # step time with and without interleaving
    python -m hybridtf.report --model my_pkg.my_module:build_model
    python -m hybridtf.report --model path/to/my_model.py:build_model
"""

if __name__ == "__main__":  # the command: quiet TensorFlow's C++ logs (a library import changes nothing)
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from hybridtf._src.op_count import COUNTING_RULE, PLUMBING_OPS, count_graph_ops, count_ops, synthetic_batch
from hybridtf._src.report import Report, TableStats, report
from hybridtf._src.report_cli import main
from hybridtf._src.report_dynamic import DynamicSection, dynamic_section, dynamic_tables
from hybridtf._src.report_timing import StepTiming, TimingSection, step_timing, timing_section

__all__ = [
    "COUNTING_RULE",
    "PLUMBING_OPS",
    "DynamicSection",
    "Report",
    "StepTiming",
    "TableStats",
    "TimingSection",
    "count_graph_ops",
    "count_ops",
    "dynamic_section",
    "dynamic_tables",
    "main",
    "report",
    "step_timing",
    "synthetic_batch",
    "timing_section",
]

if __name__ == "__main__":
    raise SystemExit(main())
