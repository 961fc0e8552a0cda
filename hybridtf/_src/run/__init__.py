"""Run stage: the compiled op library, its loader and the Python op wrappers.

The last stage of capture -> plan -> rewrite -> run. Kernels live in the top-level ``kernels/``
folder (one folder per op family); ``loader`` loads the library once, on first use, and checks the
TensorFlow it was built for. One wrapper module per op family, with its gradient where it has one:
``pack_ids``, ``unique_partition``, ``unique_subset``, ``gather_rows``, ``stitch_combine``,
``stitch_concat`` (StitchConcat and StitchConcatMatMul), ``sparse_apply`` and
``regularized_apply`` (fused optimizer updates). ``results`` holds the result types the ops and
the NumPy binding (``hybridtf.native``) share.
"""
