"""hybridtf.data.convert_text: Criteo / Avazu / Alimama text to Parquet, with stable hashing of categoricals."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from hybridtf import data as hd

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
B = 1000  # buckets used in most tests


def h(value: str, buckets: int = B) -> int:
    return int(hd.hash_strings([value], buckets)[0])


def read_table(path):
    table = pq.read_table(path)
    return {name: table.column(name).to_pylist() for name in table.column_names}


# ----------------------------------------------------------------------------- hashing


def test_hash_is_farmhash_fingerprint64_with_reserved_zero():
    # farmhash Fingerprint64("") = 0x9ae16a3b2f90404f; to_hash_bucket_fast is Fingerprint64 mod n.
    assert int(tf.strings.to_hash_bucket_fast([""], 2**62)[0]) == 0x9AE16A3B2F90404F % 2**62
    ids = hd.hash_strings(["", "05db9164", "68fd1e64", "a", "é", "1", "0"], 2**20)
    assert ids.tolist() == [0, 602404, 743074, 595615, 215576, 117775, 320411]  # golden: must never change
    assert hd.hash_strings(["", "05db9164", "68fd1e64", "a"], 1000).tolist() == [0, 718, 712, 958]
    assert hd.hash_strings([b"a", b"1"], 1000).tolist() == [958, 766]  # bytes hash like their utf-8 text
    fp = tf.strings.to_hash_bucket_fast(["05db9164"], 999)
    assert h("05db9164") == 1 + int(fp[0])


def test_hash_is_the_same_in_another_process():
    values = ["05db9164", "x", "", "hello world"]
    code = f"import hybridtf.data as d; print(d.hash_strings({values!r}, 12345).tolist())"
    env = {**os.environ, "PYTHONHASHSEED": "123", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == str(hd.hash_strings(values, 12345).tolist())


def test_hash_inputs_and_errors():
    import pyarrow as pa

    strings = pa.chunked_array([["b", "a", ""], ["a"]])
    assert hd.hash_strings(strings, 50).tolist() == hd.hash_strings(["b", "a", "", "a"], 50).tolist()
    assert hd.hash_strings(np.array([["a", ""], ["b", "a"]]), 50).shape == (2, 2)
    assert hd.hash_strings([], 50).shape == (0,)
    ids = hd.hash_strings([str(i) for i in range(2000)], 7)
    assert ids.min() >= 1 and ids.max() <= 6 and len(set(ids.tolist())) == 6
    with pytest.raises(ValueError, match=r"buckets must be in \[2, 2\*\*62\]"):
        hd.hash_strings(["a"], 1)
    with pytest.raises(TypeError, match="needs strings"):
        hd.hash_strings(tf.constant([1, 2]), 10)


# ----------------------------------------------------------------------------- formats

CRITEO_TSV = (
    "1\t5\t\t-1\t3.5\t0\t1\t2\t3\t4\t5\t6\t7\t8\t05db9164\t\tabc\t" + "\t".join(f"c{i}" for i in range(4, 27)) + "\n"
    "0\t\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t68fd1e64\tx\t\t" + "\t".join([""] * 23) + "\n"
)


def test_criteo_tsv_without_header(tmp_path):
    src = tmp_path / "day_0.txt"
    src.write_text(CRITEO_TSV)
    spec, rows = hd.convert_text(src, tmp_path / "out.parquet", "criteo", buckets=B)
    assert rows == 2
    assert spec.label == "label" and spec.dense == tuple(f"I{i}" for i in range(1, 14))
    assert spec.one_hot == tuple(f"C{i}" for i in range(1, 27)) and spec.multi_hot == ()
    assert spec.buckets == {f"C{i}": B for i in range(1, 27)}
    assert hd.read_feature_spec(tmp_path / "out.parquet") == spec
    t = read_table(tmp_path / "out.parquet")
    assert t["label"] == [1.0, 0.0]
    assert [t[f"I{i}"][0] for i in range(1, 14)] == [5, 0, -1, 3.5, 0, 1, 2, 3, 4, 5, 6, 7, 8]  # missing -> 0
    assert [t[f"I{i}"][1] for i in range(1, 14)] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert t["C1"] == [h("05db9164"), h("68fd1e64")]
    assert t["C2"] == [0, h("x")]  # missing categorical -> id 0
    assert t["C3"] == [h("abc"), 0]
    assert t["C26"] == [h("c26"), 0]
    schema = pq.read_schema(tmp_path / "out.parquet")
    assert str(schema.field("I1").type) == "float" and str(schema.field("C1").type) == "int64"


def test_criteo_csv_with_header_and_gzip(tmp_path):
    header = ",".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))])
    row = ",".join(["1", "2.5", *[""] * 12, "05db9164", *[f"v{i}" for i in range(2, 27)]])
    src = tmp_path / "sample.txt.gz"
    with gzip.open(src, "wt") as f:
        f.write(header + "\n" + row + "\n" + row + "\n")
    _, rows = hd.convert_text([src, src], tmp_path / "out.parquet", "criteo", buckets={"C1": 50})
    t = read_table(tmp_path / "out.parquet")
    assert rows == 4 and t["label"] == [1.0] * 4 and t["I1"] == [2.5] * 4 and t["I13"] == [0.0] * 4
    assert t["C1"] == [h("05db9164", 50)] * 4
    assert t["C2"] == [h("v2", hd.DEFAULT_BUCKETS)] * 4  # columns not named in buckets get the default


def test_avazu(tmp_path):
    cats = [f"v{i}" for i in range(21)]
    src = tmp_path / "avazu.csv"
    src.write_text(
        "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,device_id,"
        "device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21\n"
        f"1000009418151094273,0,14102100,{','.join(cats)}\n"
        f"10000169349117863715,1,14102623,{','.join(cats[:-1])},\n"
    )
    spec, rows = hd.convert_text(src, tmp_path / "out.parquet", "avazu", buckets=B)
    t = read_table(tmp_path / "out.parquet")
    assert rows == 2 and "id" not in t and "hour" not in t and spec.dense == ()
    assert t["label"] == [0.0, 1.0]
    assert t["C1"] == [h("v0")] * 2 and t["site_id"] == [h("v2")] * 2
    assert t["C21"] == [h("v20"), 0]
    # 2014-10-21 is a Tuesday (1), 2014-10-26 a Sunday (6)
    assert t["hour_of_day"] == [h("00"), h("23")]
    assert t["day_of_week"] == [h("1"), h("6")]
    assert spec.one_hot[-2:] == ("hour_of_day", "day_of_week")


def alimama_text(k=3):
    """A two-row Alimama file with k history positions (left-padded, masked)."""
    groups = ["cont_btag", "his_cate", "his_brand", "mask", "match_mask"]
    tail = "uid,cms_segid,cms_group_id,final_gender_code,age_level,pvalue_level,shopping_level,occupation,"
    tail += "new_user_class_level,mid,cate_id,campaign_id,customer,brand,price,pid,target"
    header = ",".join([g for g in groups for _ in range(k)]) + "," + tail
    row1 = ["1", "2", "1", "6426", "384", "6426", "b1", "b2", "b1", "1", "1", "1", "1", "0", "1"]
    row1 += ["1000017", "0", "4", "2", "4", "", "3", "0", "4", "716752", "6426", "182412", "114408", "b1", "0.99", "1"]
    row1 += ["1"]
    row2 = ["0", "0", "3", "0", "0", "77", "0", "0", "b9", "0", "0", "1", "0", "0", "1"]
    row2 += ["1000027", "0", "4", "2", "4", "0", "3", "0", "0", "624108", "6261", "113396", "33842", "b9", "", "0"]
    row2 += ["0"]
    return header + "\n" + ",".join(row1) + "\n" + ",".join(row2) + "\n"


def test_alimama_sequences_become_masked_multi_hot(tmp_path):
    src = tmp_path / "alimama.txt"
    src.write_text(alimama_text())
    spec, rows = hd.convert_text(src, tmp_path / "out.parquet", "alimama", buckets=B)
    assert spec.multi_hot == ("his_cate", "his_brand", "cont_btag") and spec.dense == ("price",)
    t = read_table(tmp_path / "out.parquet")
    assert rows == 2 and t["label"] == [1.0, 0.0]
    assert t["price"] == [pytest.approx(0.99), 0.0]
    assert t["pvalue_level"] == [0, h("0")]  # empty -> 0; the string "0" is a real value
    bags = {c: [b.tolist() for b in hd.decode_multi_hot(t[c])] for c in spec.multi_hot}
    assert bags["his_cate"] == [[h("6426"), h("384"), h("6426")], [h("77")]]
    assert bags["his_brand"] == [[h("b1"), h("b2"), h("b1")], [h("b9")]]
    assert bags["cont_btag"] == [[h("1"), h("2"), h("1")], [h("3")]]
    # no per-column salt: the ad's category and the history's categories share ids
    assert t["cate_id"][0] == bags["his_cate"][0][0] and t["brand"][1] == bags["his_brand"][1][0]


def test_converted_file_round_trips_through_parquet_dataset_with_two_ranks(tmp_path):
    src = tmp_path / "alimama.txt"
    text = alimama_text()
    lines = text.splitlines()
    src.write_text("\n".join([lines[0], *(lines[1:] * 9)]) + "\n")  # 18 rows
    spec, rows = hd.convert_text(src, tmp_path / "out.parquet", "alimama", buckets=B, row_group_rows=4)
    t = read_table(tmp_path / "out.parquet")
    got = []
    for rank in range(2):
        for features, labels in hd.parquet_dataset(
            tmp_path / "out.parquet", spec=spec, batch_size=4, rank=rank, size=2
        ):
            for j in range(int(labels.shape[0])):
                got.append((labels[j].numpy(), features["uid"][j].numpy(), features["his_cate"][j].numpy().tolist()))
    want = [(t["label"][i], t["uid"][i], hd.decode_multi_hot([t["his_cate"][i]])[0].tolist()) for i in range(rows)]
    assert got == want


def test_row_groups_and_blocks(tmp_path):
    src = tmp_path / "day.txt"
    src.write_text(CRITEO_TSV * 5)
    whole_spec, _ = hd.convert_text(src, tmp_path / "whole.parquet", "criteo", buckets=B)
    spec, rows = hd.convert_text(
        src, tmp_path / "parts.parquet", "criteo", buckets=B, row_group_rows=4, block_bytes=300
    )
    meta = pq.ParquetFile(tmp_path / "parts.parquet").metadata
    assert rows == 10 and [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [4, 4, 2]
    assert read_table(tmp_path / "parts.parquet") == read_table(tmp_path / "whole.parquet") and spec == whole_spec


def test_bad_row_in_a_later_block(tmp_path):
    src = tmp_path / "day.txt"
    src.write_text(CRITEO_TSV * 5 + "1\t2\n" + CRITEO_TSV * 3)
    # the reader parses blocks ahead, so the failing block's start is not the line: the line is found exactly
    with pytest.raises(hd.TextFormatError, match=r"not a valid criteo file: line 11 has 2 fields, not 40 .*Expected"):
        hd.convert_text(src, tmp_path / "out.parquet", "criteo", block_bytes=300)


def test_a_failed_conversion_leaves_no_partial_output_and_keeps_an_older_one(tmp_path):
    """Rows of the first blocks were already written when a later block fails: nothing of them is left."""
    src = tmp_path / "day.txt"
    src.write_text(CRITEO_TSV * 5 + "x" + CRITEO_TSV[1:])  # a bad label after 10 good rows
    out = tmp_path / "train" / "day.parquet"
    out.parent.mkdir()
    with pytest.raises(hd.TextFormatError, match="column 'label' must be a number"):
        hd.convert_text(src, out, "criteo", row_group_rows=2, block_bytes=300)
    assert os.listdir(out.parent) == []  # no partial file, not even the temporary one
    good = tmp_path / "good.txt"
    good.write_text(CRITEO_TSV)
    hd.convert_text(good, out, "criteo", buckets=B)
    before = out.read_bytes()
    with pytest.raises(hd.TextFormatError):
        hd.convert_text(src, out, "criteo", row_group_rows=2, block_bytes=300)
    assert out.read_bytes() == before and os.listdir(out.parent) == ["day.parquet"]


def test_output_that_is_an_input_a_directory_or_in_a_missing_directory_is_refused(tmp_path, monkeypatch):
    src = tmp_path / "day.txt"
    src.write_text(CRITEO_TSV)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"the output '\./day.txt' is also an input \('day.txt'\)"):
        hd.convert_text("day.txt", "./day.txt", "criteo")
    assert src.read_text() == CRITEO_TSV  # untouched
    with pytest.raises(ValueError, match="is a directory; give a file name"):
        hd.convert_text(src, tmp_path, "criteo")
    with pytest.raises(ValueError, match=r"directory '.*nodir' does not exist; create it first"):
        hd.convert_text(src, tmp_path / "nodir" / "x.parquet", "criteo")
    with pytest.raises(ValueError, match=r"unknown compression 'bogus'; choose one of none, snappy"):
        hd.convert_text(src, tmp_path / "x.parquet", "criteo", compression="bogus")
    assert not (tmp_path / "x.parquet").exists()


def test_cli(tmp_path, capsys):
    src = tmp_path / "day.txt"
    src.write_text(CRITEO_TSV)
    out = tmp_path / "cli.parquet"
    code = hd.main(["convert", "--format", "criteo", "--input", str(src), "--output", str(out), "--buckets", "77"])
    assert code == 0 and "wrote 2 rows" in capsys.readouterr().out
    assert hd.read_feature_spec(out).buckets["C5"] == 77
    assert read_table(out)["C1"] == [h("05db9164", 77), h("68fd1e64", 77)]
    code = hd.main(["convert", "--format", "avazu", "--input", str(src), "--output", str(out)])
    assert code == 2 and "lacks the avazu columns" in capsys.readouterr().err
    bad = ["convert", "--format", "criteo", "--input", str(src), "--output", str(tmp_path / "no" / "x.parquet")]
    assert hd.main(bad) == 2 and "does not exist; create it first" in capsys.readouterr().err


def test_cli_as_module(tmp_path):
    src = tmp_path / "day.txt"
    src.write_text(CRITEO_TSV)
    out = tmp_path / "m.parquet"
    cmd = [sys.executable, "-m", "hybridtf.data", "convert", "--format", "criteo", "--input", str(src)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    res = subprocess.run([*cmd, "--output", str(out)], capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 0, res.stderr
    assert pq.read_metadata(out).num_rows == 2


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("fmt", "text", "match"),
    [
        ("criteo", "1\t2\t3\n", r"first row has 3 fields, but a criteo row without header has 40"),
        ("criteo", CRITEO_TSV.replace("3.5", "abc", 1), r"line 1 \('abc'\): column 'I4' must be a number or empty"),
        ("criteo", CRITEO_TSV + CRITEO_TSV.replace("\t12\t68", "\t1x2\t68", 1), r"line 4 \('1x2'\): column 'I13'"),
        # not finite in float32: it would train as inf or NaN
        (
            "criteo",
            CRITEO_TSV.replace("1\t5\t", "nan\t5\t", 1),
            r"line 1: column 'label' holds 'nan', which is not a finite",
        ),
        (
            "criteo",
            CRITEO_TSV.replace("3.5", "1e39", 1),
            r"line 1: column 'I4' holds '1e39', which is not a finite float32",
        ),
        ("criteo", CRITEO_TSV + CRITEO_TSV.replace("3.5", "-inf", 1), r"line 3: column 'I4' holds '-inf'"),
        # every format's label is a click: 0 or 1 (a 2 or -1 is a damaged row, not a label)
        ("criteo", CRITEO_TSV + CRITEO_TSV.replace("1\t5\t", "2\t5\t", 1), r"line 3: label column 'label' holds '2'"),
        ("criteo", CRITEO_TSV.replace("1\t5\t", " 0.5\t5\t", 1), r"line 1: .*holds ' 0.5'; a criteo label is a click"),
        ("criteo", "\t" + CRITEO_TSV.split("\n", 1)[1].split("\t", 1)[1], r"lacks the criteo columns"),
        ("criteo", CRITEO_TSV.replace("\n0\t", "\n\t", 1), r"column 'label' must be a number"),
        ("criteo", CRITEO_TSV + "1\t2\n", r"not a valid criteo file: line 3 has 2 fields, not 40 .*got 2"),
        ("avazu", "id,click,C1\n1,0,x\n", r"lacks the avazu columns \['banner_pos', .*'hour'\]"),
        ("avazu", "", r"is empty"),
        ("alimama", "a,b\n1,2\n", r"lacks the alimama columns \['target'"),
    ],
)
def test_text_errors(tmp_path, fmt, text, match):
    src = tmp_path / "in.txt"
    src.write_text(text)
    with pytest.raises(hd.TextFormatError, match=match) as info:
        hd.convert_text(src, tmp_path / "out.parquet", fmt)
    assert isinstance(info.value, ValueError)


def test_gzip_input_under_another_name_and_a_truncated_gzip_are_named(tmp_path):
    import gzip

    data = gzip.compress(CRITEO_TSV.encode())
    (tmp_path / "day.txt").write_bytes(data)
    with pytest.raises(hd.TextFormatError, match=r"'.*day.txt' is gzip-compressed .*\.gz suffix"):
        hd.convert_text(tmp_path / "day.txt", tmp_path / "out.parquet", "criteo")
    (tmp_path / "cut.gz").write_bytes(gzip.compress((CRITEO_TSV * 200).encode())[:-40])
    with pytest.raises(hd.TextFormatError, match=r"cut.gz: not a valid criteo file: .*"):
        hd.convert_text(tmp_path / "cut.gz", tmp_path / "out.parquet", "criteo")
    with pytest.raises(hd.DataValueError, match=r"row_group_rows must be in \[1, 2\*\*63 - 1\]"):
        hd.convert_text(tmp_path / "cut.gz", tmp_path / "out.parquet", "criteo", row_group_rows=2**70)


AVAZU_HEADER = (
    "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
    "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21"
)


def _avazu_row(hour, click="0"):
    return f"1,{click},{hour}," + ",".join(["x"] * 21) + "\n"


@pytest.mark.parametrize(
    "hour", ["14109900", "-4102100", "1410 100", "\u0661\u0664\u0661\u0660\u0662\u0661\u0660\u0660", "14102124"]
)
def test_avazu_bad_hour_names_file_and_line(tmp_path, hour):
    """Only 8 ASCII digits pass (int() took signs, spaces and other scripts' digits: a wrong weekday)."""
    src = tmp_path / "avazu.csv"
    src.write_text(AVAZU_HEADER + "\n" + _avazu_row("14102100") * 3 + "\n" + _avazu_row(hour), encoding="utf-8")
    with pytest.raises(
        hd.TextFormatError, match=rf"avazu.csv, line 6: avazu column 'hour' holds {re.escape(repr(hour))}"
    ):
        hd.convert_text(src, tmp_path / "out.parquet", "avazu")


def test_lines_in_messages_count_blank_lines_and_quoted_newlines(tmp_path):
    """The reader skips blank lines and a quoted field spans lines: the message gives the file's own line."""
    src = tmp_path / "avazu.csv"
    quoted = '1,0,14102100,"two\nlines",' + ",".join(["x"] * 20) + "\n"
    src.write_text(AVAZU_HEADER + "\n\n" + quoted + "\n" + _avazu_row("14102100") + _avazu_row("14102100", click="7"))
    with pytest.raises(hd.TextFormatError, match=r"avazu.csv, line 7: label column 'click' holds '7'"):
        hd.convert_text(src, tmp_path / "out.parquet", "avazu")


def test_invalid_utf8_names_its_line_and_a_header_only_file_is_zero_rows_with_or_without_newline(tmp_path):
    src = tmp_path / "avazu.csv"
    src.write_bytes(
        (AVAZU_HEADER + "\n" + _avazu_row("14102100") * 2).encode() + b"1,0,14102100,\xff\xfe" + b",x" * 20 + b"\n"
    )
    with pytest.raises(hd.TextFormatError, match=r"avazu.csv: line 4 is not valid UTF-8 text .*re-encode the file"):
        hd.convert_text(src, tmp_path / "out.parquet", "avazu")
    for end in ("", "\n"):
        only = tmp_path / f"header{len(end)}.csv"
        only.write_text(AVAZU_HEADER + end)
        _, rows = hd.convert_text(only, tmp_path / "o.parquet", "avazu")
        assert rows == 0 and read_table(tmp_path / "o.parquet")["label"] == []


def test_a_tiny_non_zero_mask_keeps_its_history_position(tmp_path):
    """The mask is read as float64: 1e-50 (0 in float32) marks a present position."""
    src = tmp_path / "alimama.txt"
    text = alimama_text().split("\n")
    row = text[2].split(",")
    row[9:12] = ["1e-50", "0", "1"]  # row 2's mask: positions 1 and 3
    src.write_text("\n".join([text[0], text[1], ",".join(row)]) + "\n")
    hd.convert_text(src, tmp_path / "out.parquet", "alimama", buckets=B)
    bags = [b.tolist() for b in hd.decode_multi_hot(read_table(tmp_path / "out.parquet")["his_cate"])]
    assert bags[1] == [h("0"), h("77")]


def test_compressed_inputs_damaged_or_of_other_codecs_are_named(tmp_path, capsys):
    import bz2
    import gzip

    text = (CRITEO_TSV * 3000).encode()
    (tmp_path / "day.txt.GZ").write_bytes(gzip.compress(text))  # any case
    (tmp_path / "day.bz2").write_bytes(bz2.compress(text))
    for name in ("day.txt.GZ", "day.bz2"):
        assert hd.convert_text(tmp_path / name, tmp_path / "out.parquet", "criteo")[1] == 6000
    (tmp_path / "bz.txt").write_bytes(bz2.compress(text))
    with pytest.raises(hd.TextFormatError, match=r"bz.txt' is bzip2-compressed .*\.bz2 suffix"):
        hd.convert_text(tmp_path / "bz.txt", tmp_path / "out.parquet", "criteo")
    (tmp_path / "day.zst").write_bytes(b"whatever")
    with pytest.raises(hd.TextFormatError, match=r"compressed with zst, which the converter does not read"):
        hd.convert_text(tmp_path / "day.zst", tmp_path / "out.parquet", "criteo")
    # damaged gzip: zlib's error (not an OSError) was a raw traceback, at the first line and on the error path
    data = bytearray(gzip.compress(text))
    early, late = bytearray(data), bytearray(data)
    for k in range(40, 80):
        early[k] ^= 0x55
    for k in range(len(data) * 2 // 3, len(data) * 2 // 3 + 64):
        late[k] ^= 0x55
    for name, damaged in (("early.gz", early), ("late.gz", late)):
        (tmp_path / name).write_bytes(bytes(damaged))
        with pytest.raises(hd.TextFormatError, match=name):
            hd.convert_text(tmp_path / name, tmp_path / "out.parquet", "criteo", block_bytes=4096)
        code = hd.main(
            ["convert", "--format", "criteo", "--input", str(tmp_path / name), "--output", str(tmp_path / "o.parquet")]
        )
        assert code == 2 and "error: " in capsys.readouterr().err
    (tmp_path / "mac.txt").write_bytes(CRITEO_TSV.replace("\n", "\r").encode())
    with pytest.raises(hd.TextFormatError, match=r"mac.txt' ends its lines with a lone carriage return"):
        hd.convert_text(tmp_path / "mac.txt", tmp_path / "out.parquet", "criteo")
    with pytest.raises(hd.DataValueError, match="the output path is empty"):
        hd.convert_text(tmp_path / "day.bz2", "", "criteo")


def test_argument_errors(tmp_path):
    src = tmp_path / "day.txt"
    src.write_text(CRITEO_TSV)
    with pytest.raises(ValueError, match=r"unknown text format 'movielens'; choose one of \['alimama', 'avazu'"):
        hd.convert_text(src, tmp_path / "o.parquet", "movielens")
    with pytest.raises(ValueError, match=r"buckets must be in \[2, 2\*\*62\]"):
        hd.convert_text(src, tmp_path / "o.parquet", "criteo", buckets=1)
    with pytest.raises(ValueError, match=r"buckets for \['I1'\], which are not criteo id columns"):
        hd.convert_text(src, tmp_path / "o.parquet", "criteo", buckets={"I1": 10})
    with pytest.raises(hd.TextFormatError, match="does not exist"):
        hd.convert_text(tmp_path / "missing.txt", tmp_path / "o.parquet", "criteo")


# ----------------------------------------------------------------------------- shipped samples


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data")
@pytest.mark.parametrize(("fmt", "rows"), [("criteo", 200), ("avazu", 100), ("alimama", 99)])
def test_shared_samples(tmp_path, fmt, rows):
    spec, n = hd.convert_text(SHARED / f"{fmt}_sample.txt", tmp_path / "s.parquet", fmt, buckets=2**18)
    assert n == rows
    ds = hd.parquet_dataset(tmp_path / "s.parquet", spec=spec, batch_size=64)
    batches = list(ds)
    assert sum(int(labels.shape[0]) for _, labels in batches) == rows
    features, labels = batches[0]
    assert set(np.unique(labels.numpy())) <= {0.0, 1.0}
    for c in spec.one_hot:
        assert 0 <= int(tf.reduce_min(features[c])) and int(tf.reduce_max(features[c])) < 2**18
    if fmt == "criteo":  # first row: 0,,3,260.0,,17668.0,... C1 = 05db9164
        assert features["dense"][0, :5].numpy().tolist() == [0.0, 3.0, 260.0, 0.0, 17668.0]
        assert int(features["C1"][0]) == h("05db9164", 2**18) and int(features["C19"][0]) == 0
    if fmt == "alimama":
        lengths = features["his_cate"].row_lengths().numpy()
        assert lengths.max() == 50 and lengths.min() >= 1
