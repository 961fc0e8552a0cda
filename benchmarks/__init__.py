"""Benchmarks and the plain Keras CTR models / synthetic data they run on."""
