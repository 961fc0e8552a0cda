"""``first_time``: a notice said once per object, without entering Keras's tracked state."""

import tensorflow as tf

from hybridtf._src.once import first_time


def test_true_once_per_object_and_flag():
    a, b = tf.keras.layers.Dense(1), tf.keras.layers.Dense(1)
    assert first_time(a, "_htf_test_told")
    assert not first_time(a, "_htf_test_told")
    assert first_time(a, "_htf_other_told")  # another notice of the same object
    assert first_time(b, "_htf_test_told")  # another object


def test_the_mark_stays_out_of_a_layers_checkpoint(tmp_path):
    layer = tf.keras.layers.Dense(1)
    layer.build((None, 2))
    first_time(layer, "_htf_test_told")
    names = [name for name, _ in tf.train.list_variables(tf.train.Checkpoint(layer=layer).write(str(tmp_path / "ck")))]
    assert not any("_htf_test_told" in name for name in names)


def test_hybridtf_errors_keep_their_class_through_autograph():
    from hybridtf._src.errors import InterleavingError

    @tf.function
    def step(x):
        if x.shape[0] == 3:  # a trace-time check, as hybridtf's are
            raise InterleavingError("named problem and fix")
        return x

    try:
        step(tf.zeros([3]))
    except InterleavingError as e:  # AutoGraph made a StagingError of it before
        assert "named problem and fix" in str(e)
    else:
        raise AssertionError("no error")
