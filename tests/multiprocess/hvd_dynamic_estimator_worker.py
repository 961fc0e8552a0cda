"""Builds a wrapped model_fn with a DynamicEmbedding under Horovod; writes what the wrapper said (JSON per rank).

horovodrun -np 2 -H localhost:2 --gloo python hvd_dynamic_estimator_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the checkout

import horovod.tensorflow as hvd
import tensorflow as tf

import hybridtf as htf
import hybridtf.estimator as htf_estimator
from hybridtf._src.capture.context import CaptureError


def model_fn(features, labels, mode):
    emb = htf.layers.DynamicEmbedding(4, hot_rows=8, name="items")(features["ids"], training=True)
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, axis=1, keepdims=True) - labels))
    opt = htf.keras.dynamic_optimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(loss))


def main():
    hvd.init()
    result = {"rank": hvd.rank(), "size": hvd.size(), "error": None}
    with tf.Graph().as_default():
        features = {"ids": tf.constant([1, 2, 3], tf.int64)}
        try:
            htf_estimator.model_fn(model_fn)(features, tf.zeros([3, 1]), tf.estimator.ModeKeys.TRAIN)
        except CaptureError as err:
            result["error"] = str(err)
    out = pathlib.Path(sys.argv[1]) / f"dynamic_{hvd.size()}_{hvd.rank()}.json"
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
