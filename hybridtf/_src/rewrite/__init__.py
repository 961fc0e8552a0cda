"""Rewrite stage: graph passes from captured lookups to packed, fused op chains.

Filled by the packing issue: one pass per module (graph in, graph out,
"changed?"), a pass pipeline and an invariant verifier. See docs/architecture.md.
"""
