"""The sources of the pybind11 module hybridtf._native: the bindings and the TF-free *_impl layer.

One list for setup.py (the regular build) and tools/sanitize.sh (the ASan/UBSan build).
"""

NATIVE_SOURCES = [
    "kernels/python/native_module.cc",
    "kernels/python/native_layers.cc",
    "kernels/pack_ids/pack_ids_impl.cc",
    "kernels/stitch_combine/stitch_combine_impl.cc",
    "kernels/unique_partition/unique_partition_impl.cc",
    "kernels/unique_partition/unique_subset_impl.cc",
    # HybridHash (kernels/hybrid_hash): its binding and TF-free store
    "kernels/python/hybrid_hash_binding.cc",
    "kernels/hybrid_hash/hybrid_hash_impl.cc",
    "kernels/hybrid_hash/hybrid_hash_config_impl.cc",
    "kernels/hybrid_hash/hybrid_hash_apply_impl.cc",
    "kernels/hybrid_hash/hybrid_hash_flush_impl.cc",
    "kernels/hybrid_hash/hybrid_hash_io_impl.cc",
    "kernels/hybrid_hash/hybrid_hash_lookup_impl.cc",
]

if __name__ == "__main__":
    print(" ".join(NATIVE_SOURCES))
