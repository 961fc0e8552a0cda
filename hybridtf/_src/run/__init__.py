"""Run stage: the compiled op library, its loader and the Python op wrappers.

The last stage of capture -> plan -> rewrite -> run. Kernels live in the
top-level ``kernels/`` folder; this package loads them (``loader``) and wraps
each op family with a documented Python function (``unique_partition``).
"""
