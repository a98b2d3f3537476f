"""Translation data made offline and read back: the makers write IWSLT'15 layout
deterministically with test sentences unseen in training, the reader refuses broken files by
name, sentencepiece vocabularies follow the models' ids, and the batches train the models."""
import os
import struct

import numpy as np
import pytest

import tbdzoo
from tbdzoo.datasets import DatasetError, make_text, subwords
from tbdzoo.datasets.parallel_text import WMT14, ParallelText, read_vocab, word_vocabulary, write_parallel
from tbdzoo.models import seq2seq, transformer

SIZES = dict(train=120, dev=15, test=15)


def files(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


@pytest.fixture(scope="module")
def numbers_vi(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("numbers") / "en-vi")
    facts = make_text.make_numbers(folder, 3, None, lang="vi", **SIZES)
    return folder, facts


# --- makers ---------------------------------------------------------------------------------

def test_numbers_are_written_in_iwslt_layout_and_read_back(numbers_vi):
    folder, facts = numbers_vi
    assert sorted(os.listdir(folder)) == ["train.en", "train.vi", "tst2012.en", "tst2012.vi",
                                          "tst2013.en", "tst2013.vi", "vocab.en", "vocab.vi"]
    assert facts["pairs"] == SIZES and facts["test_numbers_disjoint_from_train"]
    train = ParallelText(folder, "train", "en", "vi")
    test = ParallelText(folder, "test", "en", "vi")
    assert len(train) == 120 and len(test) == 15 and train.skipped == []
    from num2words import num2words
    numbers = make_text.number_splits(3, SIZES, 999999)["test"]
    assert test.pairs == [(make_text.tokenize(num2words(n, lang="en")), num2words(n, lang="vi"))
                          for n in numbers]
    assert any(" , " in s for s in train.sources)          # punctuation split off, as IWSLT's
    dev = ParallelText(folder, "dev", "en", "vi")
    assert not set(train.sources) & (set(test.sources) | set(dev.sources))
    assert not set(test.sources) & set(dev.sources)
    vocab = train.vocabulary("vi")
    assert vocab[:3] == ["<unk>", "<s>", "</s>"] and "mươi" in vocab
    assert set(vocab[3:]) == set(w for t in train.targets for w in t.split())


def test_the_numbers_depend_on_the_seed_alone(numbers_vi, tmp_path):
    folder, _ = numbers_vi
    make_text.make_numbers(str(tmp_path / "again"), 3, None, lang="vi", **SIZES)
    make_text.make_numbers(str(tmp_path / "other"), 4, None, lang="vi", **SIZES)
    assert files(str(tmp_path / "again")) == files(folder)
    assert files(str(tmp_path / "other"))["train.en"] != files(folder)["train.en"]


def test_german_numbers_and_progress(tmp_path):
    calls = []
    make_text.MAKERS["numbers-en-de"][1](str(tmp_path / "de"), 0,
                                        lambda what, done, total: calls.append((done, total)))
    data = ParallelText(str(tmp_path / "de"), "test", "en", "de")
    assert len(data) == make_text.SPLIT_SIZES["test"]
    assert calls[-1] == (2400, 2400) and all(t == 2400 for _, t in calls)
    assert any("tausend" in t for t in data.targets)


def test_too_many_numbers_for_the_range_is_refused(tmp_path):
    with pytest.raises(DatasetError, match=r"150 distinct numbers.*only 100 lie in \[0, 99\]"):
        make_text.make_numbers(str(tmp_path / "x"), 0, None, train=100, dev=25, test=25,
                               largest=99)


def write_mo(path, messages, charset="UTF-8"):
    """A gettext catalog in GNU's binary format: the header (msgid "") and ``messages``,
    {msgid or (msgid, plural): msgstr or [msgstrs]}, keys sorted as msgfmt sorts them."""
    entries = {"": "Content-Type: text/plain; charset={}\n".format(charset)}
    for key, value in messages.items():
        if isinstance(key, tuple):
            entries["\0".join(key)] = "\0".join(value)
        else:
            entries[key] = value
    keys = sorted(entries)
    ids = [k.encode("utf-8") for k in keys]
    strs = [entries[k].encode("utf-8") if charset == "UTF-8" else entries[k].encode("latin-1")
            for k in keys]
    n, start = len(keys), 7 * 4
    offsets, data = [], b""
    base = start + 16 * n
    for chunk in ids + strs:
        offsets.append((len(chunk), base + len(data)))
        data += chunk + b"\0"
    header = struct.pack("<7I", 0x950412de, 0, n, start, start + 8 * n, 0, 0)
    table = b"".join(struct.pack("<2I", *o) for o in offsets)
    with open(path, "wb") as f:
        f.write(header + table + data)


def test_gettext_catalogs_give_pairs_and_bad_catalogs_are_counted(tmp_path):
    folder = tmp_path / "locale" / "vi" / "LC_MESSAGES"
    folder.mkdir(parents=True)
    messages = {"Open file %s": "Mở tập tin %s", "Save": "Lưu", "Quit": "Thoát",
                "Two\nlines": "Hai\ndòng", "42": "42", "Untranslated": "",
                "menu\x04Close": "Đóng", ("%d file", "%d files"): ["%d tập tin"]}
    messages.update({"Message number {}".format(i): "Thông điệp số {}".format(i)
                     for i in range(20)})
    write_mo(str(folder / "app.mo"), messages)
    write_mo(str(folder / "other.mo"), {"Save": "Cất", "Help": "Trợ giúp"})
    (folder / "broken.mo").write_bytes(b"not a catalog at all")
    write_mo(str(folder / "latin.mo"), {"Yes": "Ja\u00e4"}, charset="UTF-8")
    with open(str(folder / "latin.mo"), "r+b") as f:      # a byte that is not UTF-8
        data = f.read().replace("Ja\u00e4".encode("utf-8"), b"Ja\xe4 ")
        f.seek(0)
        f.write(data)
    with pytest.warns(UserWarning, match="skipped 2 of 4 gettext catalogs.*broken.mo, latin.mo"):
        found, facts = make_text.read_catalogs("vi", str(tmp_path / "locale"))
    assert facts["catalogs"] == 2 and sorted(facts["catalogs_skipped"]) == ["broken.mo",
                                                                             "latin.mo"]
    assert found["Open file %s"] == "Mở tập tin %s"
    assert found["Save"] == "Lưu"                 # app.mo comes first in name order
    assert found["Close"] == "Đóng" and found["%d file"] == "%d tập tin"
    assert "Untranslated" not in found and "42" not in found and "Two\nlines" not in found
    assert facts["messages_multiline_left_out"] == 1
    assert facts["messages_without_letters_left_out"] == 1
    out = str(tmp_path / "made")
    with pytest.warns(UserWarning):
        made = make_text.make_gettext(out, 0, None, lang="vi", train=100, dev=3, test=3,
                                      locale_dir=str(tmp_path / "locale"))
    assert made["pairs"] == {"train": len(found) - 6, "dev": 3, "test": 3}
    train, test = ParallelText(out, "train", "en", "vi"), ParallelText(out, "test", "en", "vi")
    assert not set(train.sources) & set(test.sources)
    assert all(found[s] == t for s, t in train.pairs + test.pairs)


def test_missing_catalogs_say_where_they_come_from(tmp_path):
    with pytest.raises(DatasetError, match="no gettext catalogs.*Debian packages"):
        make_text.read_catalogs("vi", str(tmp_path))


@pytest.mark.skipif(not os.path.isdir("/usr/share/locale/de/LC_MESSAGES"),
                    reason="no German gettext catalogs installed")
def test_the_installed_german_catalogs(tmp_path):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        facts = make_text.MAKERS["gettext-en-de"][1](str(tmp_path / "de"), 0, None)
    assert facts["pairs"] == {"train": 4000, "dev": 500, "test": 500}
    data = ParallelText(str(tmp_path / "de"), "dev", "en", "de")
    assert len(data) == 500 and all(s and t for s, t in data.pairs)


# --- the reader refuses broken files by name ------------------------------------------------

def test_line_counts_must_match(numbers_vi, tmp_path):
    _folder, _ = numbers_vi
    write_parallel(str(tmp_path), {"test": [("a b", "x"), ("c", "y")]}, "en", "vi")
    with open(str(tmp_path / "tst2013.vi"), "a") as f:
        f.write("z\n")
    with pytest.raises(DatasetError, match=r"tst2013.en has 2 lines but .*tst2013.vi has 3"):
        ParallelText(str(tmp_path), "test", "en", "vi")


def test_empty_lines_are_named_or_skipped_and_counted(tmp_path):
    write_parallel(str(tmp_path), {"train": [("a", "x"), ("b", "y"), ("c", "z")]}, "en", "vi")
    with open(str(tmp_path / "train.vi"), "w") as f:
        f.write("x\n  \nz\n")
    with pytest.raises(DatasetError, match=r"train.vi, line 2: empty line"):
        ParallelText(str(tmp_path), "train", "en", "vi")
    with pytest.warns(UserWarning, match="left out 1 pair"):
        data = ParallelText(str(tmp_path), "train", "en", "vi", empty="skip")
    assert data.pairs == [("a", "x"), ("c", "z")] and data.skipped == [2]
    assert data.where(1).endswith("train.en, line 3")


def test_missing_files_undecodable_text_and_unknown_splits(tmp_path):
    with pytest.raises(DatasetError, match=r"train.en: no such file"):
        ParallelText(str(tmp_path), "train", "en", "vi")
    write_parallel(str(tmp_path), {"train": [("a", "x")]}, "en", "vi")
    with pytest.raises(DatasetError, match=r"train.de: no such file; files in .*train.en"):
        ParallelText(str(tmp_path), "train", "en", "de")
    with open(str(tmp_path / "train.vi"), "wb") as f:
        f.write(b"\xff\xfe\n")
    with pytest.raises(DatasetError, match=r"train.vi, line 1: not UTF-8"):
        ParallelText(str(tmp_path), "train", "en", "vi")
    with pytest.raises(DatasetError, match=r"split 'valid' is not one of .*dev, test, train"):
        ParallelText(str(tmp_path), "valid", "en", "vi")


def test_wmt_names_and_vocabulary_files(tmp_path):
    write_parallel(str(tmp_path), {"dev": [("Hallo Welt", "hello world")]}, "de", "en",
                   prefixes=WMT14)
    data = ParallelText(str(tmp_path), "dev", "de", "en", prefixes=WMT14)
    assert data.src_path.endswith("newstest2013.de") and data[0] == ("Hallo Welt", "hello world")
    (tmp_path / "vocab.en").write_text("<unk>\n<s>\n</s>\nthe\nof\nthe\n")
    with pytest.raises(DatasetError, match=r"vocab.en, line 6: 'the' is listed again \(first "
                                           r"on line 4\)"):
        read_vocab(str(tmp_path / "vocab.en"))
    assert word_vocabulary(["b a b", "c b"]) == ["<unk>", "<s>", "</s>", "b", "a", "c"]


# --- subwords and batches -------------------------------------------------------------------

SEQ2SEQ = dict(seq2seq.TINY, src_vocab=48, tgt_vocab=44, src_len=30, tgt_len=30)
TRANSFORMER = dict(transformer.TINY, vocab=64, src_len=40, tgt_len=40)


def test_sentencepiece_is_deterministic_with_the_models_ids(numbers_vi):
    folder, _ = numbers_vi
    train = ParallelText(folder, "train", "en", "vi")
    src, tgt = subwords.train_for_model(SEQ2SEQ, train.pairs)
    again, _ = subwords.train_for_model(SEQ2SEQ, train.pairs)
    assert src.model_proto == again.model_proto
    assert (src.vocab_size, tgt.vocab_size) == (48, 44)
    assert (tgt.pad_id, tgt.bos_id, tgt.eos_id, tgt.unk_id) == (0, 1, 2, 3)
    for sentence in train.targets[:10]:
        assert tgt.decode(tgt.encode(sentence)) == sentence
    shared, same = subwords.train_for_model(TRANSFORMER, train.pairs)
    assert shared is same and shared.vocab_size == 64
    assert shared.decode(shared.encode(train.sources[0])) == train.sources[0]


def test_vocabulary_sizes_the_text_cannot_fill_are_refused(numbers_vi):
    folder, _ = numbers_vi
    pairs = ParallelText(folder, "train", "en", "vi").pairs
    with pytest.raises(DatasetError, match=r"target vocabulary \(tgt_vocab\): the 120 training "
                                           r"sentences support at most \d+ subword pieces, "
                                           r"fewer than the 5000 asked"):
        subwords.train_for_model(dict(SEQ2SEQ, tgt_vocab=5000), pairs)
    with pytest.raises(DatasetError, match=r"source vocabulary \(src_vocab\): a vocabulary of 19 "
                                           r"is too small: the text's distinct characters and "
                                           r"the special ids take 26"):
        subwords.train_for_model(seq2seq.TINY, pairs)


def test_seq2seq_batches_match_the_models_inputs_and_decode_back(numbers_vi):
    folder, _ = numbers_vi
    train, test = ParallelText(folder, "train", "en", "vi"), ParallelText(folder, "test", "en",
                                                                          "vi")
    src, tgt = subwords.train_for_model(SEQ2SEQ, train.pairs)
    encoded, skipped = subwords.encode_pairs(SEQ2SEQ, src, tgt, test.pairs, where=test.where)
    assert skipped == [] and len(encoded) == 15
    batches = list(subwords.iterate_batches(SEQ2SEQ, encoded, 4, seed=0))
    assert [len(b["src"]) for b in batches] == [4, 4, 4, 3]
    model = tbdzoo.build("seq2seq", backend="torch", config="tiny",
                         **{k: SEQ2SEQ[k] for k in ("src_vocab", "tgt_vocab", "src_len", "tgt_len")})
    reference = model.synthetic_batch(seed=0)
    rows = set()
    for batch in batches:
        assert set(batch) == set(reference)
        for key in batch:
            assert batch[key].dtype == np.int32 and batch[key].shape[1:] == reference[key].shape[1:]
        seq2seq.check_batch(SEQ2SEQ, batch)
        for row in range(len(batch["src"])):
            n, m = batch["src_lengths"][row], batch["tgt_lengths"][row]
            source = src.decode(batch["src"][row, :n][::-1])     # reverse_source
            target = tgt.decode(batch["labels"][row, :m - 1])
            assert batch["labels"][row, m - 1] == 2 and batch["tgt_in"][row, 0] == 1
            assert (batch["tgt_in"][row, 1:m] == batch["labels"][row, :m - 1]).all()
            assert (batch["src"][row, n:] == 0).all() and (batch["labels"][row, m:] == 0).all()
            rows.add((source, target))
    assert rows == set(test.pairs)
    losses = [model.train_step(batches[0]) for _ in range(4)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_transformer_batches_share_one_vocabulary(numbers_vi):
    folder, _ = numbers_vi
    train = ParallelText(folder, "train", "en", "vi")
    words, _ = subwords.train_for_model(TRANSFORMER, train.pairs)
    encoded, _ = subwords.encode_pairs(TRANSFORMER, words, words, train.pairs[:8])
    batch = subwords.make_batch(TRANSFORMER, encoded)
    model = tbdzoo.build("transformer", backend="torch", config="tiny",
                         **{k: TRANSFORMER[k] for k in ("vocab", "src_len", "tgt_len")})
    assert set(batch) == set(model.synthetic_batch(seed=0)) == {"src", "tgt_in", "labels"}
    assert words.decode(batch["src"][0][batch["src"][0] != 0]) == train.sources[0]
    losses = [model.train_step(batch) for _ in range(4)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_pairs_too_long_for_the_config(numbers_vi):
    folder, _ = numbers_vi
    test = ParallelText(folder, "test", "en", "vi")
    src, tgt = subwords.train_for_model(SEQ2SEQ, ParallelText(folder, "train", "en", "vi").pairs)
    short = dict(SEQ2SEQ, src_len=6, tgt_len=6)
    longest = max(range(len(test)), key=lambda i: len(src.encode(test[i][0])))
    with pytest.raises(DatasetError, match=r"tst2013.en, line \d+: \d+ source and \d+ target "
                                           r"pieces; the config holds 6 \(src_len\) and 5"):
        subwords.encode_pairs(short, src, tgt, [test[longest]], where=lambda i: test.where(longest))
    with pytest.warns(UserWarning, match="left out"):
        kept, skipped = subwords.encode_pairs(short, src, tgt, test.pairs, too_long="skip")
    assert len(kept) + len(skipped) == len(test) and skipped
    assert all(len(s) <= 6 and len(t) <= 5 for s, t in kept)
    cut, _ = subwords.encode_pairs(short, src, tgt, test.pairs, too_long="truncate")
    assert len(cut) == len(test)
    seq2seq.check_batch(short, subwords.make_batch(short, cut))
    with pytest.raises(DatasetError, match=r"tgt_vocab.*44 pieces, but the config's src_vocab"):
        subwords.encode_pairs(SEQ2SEQ, tgt, tgt, test.pairs)
