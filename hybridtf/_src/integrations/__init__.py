"""Integrations: how the pipeline plugs into Keras (and later Estimator, Horovod, data)."""
