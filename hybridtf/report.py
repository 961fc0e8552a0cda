"""What hybridtf did to a model, PICASSO Table V style: training-step op counts, plan, tables.

Example:
    >>> import hybridtf as htf
    >>> import hybridtf.report
    >>> plain, model = build_model(), htf.keras.optimize(build_model())
    >>> for m in (plain, model):
    ...     m.compile(optimizer="adagrad", loss="binary_crossentropy")
    >>> print(hybridtf.report.report(model, (features, labels), baseline=plain))
    >>> hybridtf.report.count_ops(model, (features, labels))["total"]
    >>> hybridtf.report.dynamic_tables(model)["user"]["hit_ratio"]     # DynamicEmbedding / Tables statistics

Command line (needs the repository checkout: it builds the models of ``benchmarks/``)::

    python -m hybridtf.report --model wdl|deepfm|dlrm|din|none --fields criteo|200 [--dynamic STEPS] [--json]
"""

if __name__ == "__main__":  # the command: quiet TensorFlow's C++ logs (a library import changes nothing)
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from hybridtf._src.report import (
    COUNTING_RULE,
    PLUMBING_OPS,
    Report,
    TableStats,
    count_graph_ops,
    count_ops,
    main,
    report,
)
from hybridtf._src.report_dynamic import DynamicSection, dynamic_section, dynamic_tables

__all__ = [
    "COUNTING_RULE",
    "PLUMBING_OPS",
    "DynamicSection",
    "Report",
    "TableStats",
    "count_graph_ops",
    "count_ops",
    "dynamic_section",
    "dynamic_tables",
    "main",
    "report",
]

if __name__ == "__main__":
    raise SystemExit(main())
