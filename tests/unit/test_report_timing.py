"""The report's timing section: where the step's time goes, with and without interleaving."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
import hybridtf.report as htf_report
from hybridtf._src.report_timing import StepTiming, TimingSection


def _model(**options):
    ids = tf.keras.Input(shape=(), dtype=tf.int64, name="ids")
    x = tf.keras.layers.Embedding(50, 4, name="emb")(ids)
    out = tf.keras.layers.Dense(1, activation="sigmoid", name="out")(x)
    model = htf.keras.optimize(tf.keras.Model(ids, out), **options)
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    return model


def test_cli_times_the_step_with_and_without_interleaving(capsys):
    argv = ["--model", "wdl", "--batch", "64", "--ranks", "0", "--micro-batches", "2", "--timing", "1", "--json"]
    assert htf_report.main(argv) == 0
    timing = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["timing"]["timings"]
    assert [(t["label"], t["micro_batches"]) for t in timing] == [("interleaved", 2), ("not interleaved", 1)]
    for t in timing:
        assert t["step_seconds"] > 0 and t["rest_seconds"] > 0
        assert set(t["chain_seconds"]) == {"packed_16d_float32_model", "packed_1d_float32_model"}


def test_step_timing_of_one_model_and_its_text():
    x = np.arange(32, dtype=np.int64) % 50
    y = (x % 2).astype(np.float32)[:, None]
    section = htf_report.timing_section(_model(), (x, y), steps=2)
    (t,) = section.timings
    assert (t.label, t.micro_batches, t.groups, t.steps) == ("as optimized", 1, 1, 2)
    assert t.step_seconds > 0
    text = str(section)
    assert "where the step's time goes (ms)" in text and "op time: packed chains" in text


def test_text_lines_up_two_timings():
    a = StepTiming("interleaved", 0.010, 3, {"t": 0.002}, 0.005, micro_batches=2)
    b = StepTiming("not interleaved", 0.012, 3, {"t": 0.003}, 0.006)
    lines = str(TimingSection([a, b])).splitlines()
    assert "2 x 1" in lines[1] and lines[1].endswith("1 x 1")
    assert lines[2].split()[-2:] == ["10.00", "12.00"]
    assert len({len(line) for line in lines}) == 1


def test_step_timing_refuses_bad_arguments():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        htf_report.step_timing(_model(), (np.zeros(4, np.int64), np.zeros((4, 1), np.float32)), steps=0)
    plain = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"hybridtf\.keras\.optimize"):
        htf_report.step_timing(plain, (np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32)))
