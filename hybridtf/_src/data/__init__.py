"""Data side: synthetic CTR-like inputs today; Parquet input pipelines join later."""
