"""DIN on multi-hot behaviour sequences from Parquet: plain vs ``htf.keras.optimize``, loss, AUC and examples/s.

An Alimama-format text file (user profile, target ad, and per-user behaviour histories of up to 50
categories / brands / behaviour types with a padding mask) is converted to Parquet with
``hybridtf.data.convert_text(..., "alimama")``: ``his_cate``, ``his_brand`` and ``cont_btag`` become
multi-hot columns (read as ``tf.RaggedTensor`` ids, padding dropped), the 15 profile / ad columns
one-hot ids, ``price`` the dense feature. The model is ``hybridtf.models.din_like``, built from
the converted feature spec: ``his_cate`` and ``his_brand`` are pooled by DIN's attention with the
target ad's ``cate_id`` / ``brand`` as query and share the target's embedding table (the converter
hashes without a per-column salt, so a category has the same id in both columns); ``cont_btag`` is
mean-pooled. It is built twice with the same seed (identical initial weights, checked) and trained
on identical batches, as it is and wrapped with ``htf.keras.optimize`` (ragged lookups included).

    python examples/din_multihot.py                                        # generated data (20,000 rows, 2 epochs)
    python examples/din_multihot.py --data ../shared/data/alimama_sample.txt --batch 16 --epochs 3 --eval-fraction 0
    python examples/din_multihot.py --data ali.parquet   # written by python -m hybridtf.data convert --format alimama

``--data`` takes an Alimama CSV with the header ``cont_btag`` x50, ``his_cate`` x50, ``his_brand`` x50,
``mask`` x50, ``match_mask`` x50, ``uid ... price, pid, target`` (see docs/data_guide.md) or a Parquet
file converted from one. Without ``--data`` a synthetic file of that schema is generated: users with a
few favourite categories, Zipf-skewed categories and brands, variable-length left-padded histories
(a few empty); clicks depend on the target category or brand being in the history (what the
attention can find), on the category, the placement (``pid``), gender and age.

The last ``--eval-fraction`` of the rows is held out; "eval" numbers are ``model.evaluate`` on them,
"train" numbers Keras' running values over the last epoch, AUC ``tf.keras.metrics.AUC``. Examples/s
counts the steps after the first of each epoch (see ``examples/wdl_keras_parquet.py``, whose helpers
this example uses). The 99-row sample has 2 clicks (both in its first 80 rows): evaluate it on the training data
(``--eval-fraction 0``); its AUC says little beyond plain == hybridtf.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # hybridtf of the checkout when not installed
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # wdl_keras_parquet.py (helpers)

import numpy as np
from wdl_keras_parquet import (
    compare,
    describe_split,
    example_parser,
    fields_from_spec,
    make_dataset,
    prepare_or_exit,
    print_comparison,
)

from hybridtf import models
from hybridtf._src.data.synthetic import zipf_ids

SEQ_LEN = 50
PROFILE = (
    "uid cms_segid cms_group_id final_gender_code age_level pvalue_level shopping_level occupation "
    "new_user_class_level".split()
)
AD = "mid cate_id campaign_id customer brand price pid".split()
ATTENTION_PAIRS = {"his_cate": "cate_id", "his_brand": "brand"}


def write_alimama_text(path: str | os.PathLike, rows: int, seed: int = 0) -> str:
    """Writes a synthetic Alimama-format CSV (the header of ``alimama_sample.txt``, 250 sequence columns).

    Args:
        path: the file to write.
        rows: number of examples.
        seed: data seed.

    Returns:
        ``path`` as a string.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xA11A]))
    n_users, n_cates, brands_per_cate = 20_000, 5_000, 7

    def zipf(n, vocab, alpha=1.1):
        return zipf_ids(n, vocab, alpha=alpha, seed=int(rng.integers(2**31)), scatter=False)

    # Per user: profile values and 3 favourite categories.
    profile = {
        "cms_segid": np.where(rng.random(n_users) < 0.8, 0, rng.integers(1, 97, n_users)),
        "cms_group_id": rng.integers(0, 13, n_users),
        "final_gender_code": rng.integers(1, 3, n_users),
        "age_level": rng.integers(0, 7, n_users),
        "pvalue_level": rng.integers(0, 4, n_users),
        "shopping_level": rng.integers(1, 4, n_users),
        "occupation": (rng.random(n_users) < 0.06).astype(np.int64),
        "new_user_class_level": rng.integers(0, 5, n_users),
    }
    favourites = zipf(n_users * 3, n_cates).reshape(n_users, 3)

    users = zipf(rows, n_users, alpha=0.6)
    lengths = np.where(rng.random(rows) < 0.03, 0, np.clip(rng.poisson(25, rows), 1, SEQ_LEN))
    # History: 70% of the behaviours on the user's favourite categories.
    own = rng.random((rows, SEQ_LEN)) < 0.7
    his_cate = np.where(own, favourites[users[:, None], rng.integers(0, 3, (rows, SEQ_LEN))], 0)
    his_cate = np.where(own, his_cate, zipf(rows * SEQ_LEN, n_cates).reshape(rows, SEQ_LEN))
    his_brand = his_cate * brands_per_cate + zipf(rows * SEQ_LEN, brands_per_cate).reshape(rows, SEQ_LEN)
    btag = rng.choice(np.arange(1, 5), p=[0.85, 0.05, 0.05, 0.05], size=(rows, SEQ_LEN))
    mask = np.arange(SEQ_LEN)[None, :] >= SEQ_LEN - lengths[:, None]  # left padding
    # Target ad: 40% on a favourite category.
    cate = np.where(rng.random(rows) < 0.4, favourites[users, rng.integers(0, 3, rows)], zipf(rows, n_cates))
    brand = cate * brands_per_cate + zipf(rows, brands_per_cate)
    mid = zipf(rows, 200_000, alpha=0.9)
    in_cate = ((his_cate == cate[:, None]) & mask).any(axis=1)
    in_brand = ((his_brand == brand[:, None]) & mask).any(axis=1)
    pid = rng.integers(1, 3, rows)
    cate_effect = np.random.default_rng(0xCA7E).normal(0, 0.7, n_cates)[cate]  # fixed per-category CTRs
    logit = -3.0 + 1.6 * in_cate + 0.8 * in_brand + cate_effect + 0.8 * (pid == 2)
    logit += 0.5 * (profile["final_gender_code"][users] == 2) - 0.2 * (profile["age_level"][users] - 3)
    target = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)

    def seq(values):
        return np.where(mask, values, 0).astype(str)

    columns = [seq(btag), seq(his_cate), seq(his_brand), mask.astype(np.int64).astype(str)]
    columns.append((mask & (his_cate == cate[:, None])).astype(np.int64).astype(str))  # match_mask
    tail = {"uid": users + 1_000_000, **{k: v[users] for k, v in profile.items()}}
    tail.update(mid=mid, cate_id=cate, campaign_id=mid // 3, customer=mid // 11, brand=brand)
    tail.update(price=np.round(rng.beta(20, 1, rows), 6), pid=pid, target=target)
    columns += [np.asarray(tail[c]).astype(str)[:, None] for c in (*PROFILE, *AD, "target")]
    header = [name for name in ("cont_btag", "his_cate", "his_brand", "mask", "match_mask") for _ in range(SEQ_LEN)]
    header += [*PROFILE, *AD, "target"]
    table = np.concatenate(columns, axis=1)
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        f.writelines(",".join(row) + "\n" for row in table)
    return os.fspath(path)


def main():
    parser = example_parser(
        __doc__, "Alimama", batch=256, epochs=2, lr=0.1, dim_help="embedding width (equal for all fields: attention)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="din_parquet_") as workdir:
        spec, source, train_path, eval_path, n_train = prepare_or_exit(
            parser, args, workdir, "alimama", lambda p: write_alimama_text(p, args.rows, args.seed)
        )
        train_desc, eval_desc = describe_split(spec, train_path, eval_path)
        fields = fields_from_spec(spec, args.dim)
        pairs = {s: t for s, t in ATTENTION_PAIRS.items() if s in spec.multi_hot and t in spec.one_hot}
        shared = [f"{s}->{t}" for s, t in pairs.items() if spec.buckets[s] == spec.buckets[t]]
        print(
            f"data: {source}: {train_desc}, {len(spec.dense)} dense, {len(spec.one_hot)} one-hot, "
            f"{len(spec.multi_hot)} multi-hot columns ({', '.join(spec.multi_hot)})"
        )
        print(
            f"DIN: attention {pairs} (shared tables: {', '.join(shared) or 'none'}), dim {args.dim}, "
            f"batch {args.batch}, {args.epochs} epoch(s), Adagrad({args.lr})"
        )
        result = compare(
            lambda: models.din_like(
                fields, len(spec.dense), hidden=(64, 32), attention_hidden=(32,), attention_pairs=pairs, seed=args.seed
            ),
            lambda: make_dataset(train_path, spec, args.batch, not args.no_shuffle, args.seed),
            lambda: make_dataset(eval_path, spec, args.batch, False, None),
            epochs=args.epochs,
            lr=args.lr,
            train_rows=n_train,
            batch_size=args.batch,
        )
        print_comparison(result, eval_desc, train_rows=n_train, batch_size=args.batch)


if __name__ == "__main__":
    main()
