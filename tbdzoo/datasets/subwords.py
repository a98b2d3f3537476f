"""Subword vocabularies for the translation models: sentencepiece models trained to a config's
vocabulary size, and padded int32 batches in the inputs Seq2Seq and the Transformer read.

The ids follow the models' conventions (tbdzoo/models/seq2seq/, transformer/): ``pad_id``,
``bos_id`` and ``eos_id`` from the config (0, 1, 2), ``<unk>`` on the lowest id left (3), the
pieces after. Training is deterministic: one thread, every sentence used in order
(``input_sentence_size`` 0, no shuffling), so the same text gives the same model byte for byte.

Seq2Seq has two vocabularies (``src_vocab``, ``tgt_vocab``): one model per language. The
Transformer shares one (``vocab``): one model trained on both sides. A batch is what the model's
synthetic batch is: ``src`` (N, src_len) the source pieces (reversed within each sentence's
length when ``reverse_source``, as TF NMT's ``source_reverse`` did), ``tgt_in`` (N, tgt_len)
BOS then the target pieces, ``labels`` (N, tgt_len) the target pieces then EOS, all padded with
``pad_id`` at the end; Seq2Seq's also hold ``src_lengths`` and ``tgt_lengths``.
"""
import io
import os
import warnings

import numpy as np

from .epochs import epoch_rows
from .errors import DatasetError

__all__ = ["Subwords", "train_for_model", "encode_pairs", "make_batch", "iterate_batches",
           "vocab_keys", "TOO_LONG_POLICIES"]

TOO_LONG_POLICIES = ("error", "skip", "truncate")


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise DatasetError("subword vocabularies need sentencepiece: install it (pip install "
                           "sentencepiece==0.2.3, pinned in requirements/main.txt)") from None
    return sentencepiece


def _unk_id(pad_id, bos_id, eos_id):
    return min(set(range(4)) - {pad_id, bos_id, eos_id})


class Subwords:
    """A trained sentencepiece model: ``encode(text)`` gives ids, ``decode(ids)`` text."""

    def __init__(self, model_proto, name="subwords"):
        spm = _sentencepiece()
        self.name = name
        self.model_proto = bytes(model_proto)
        self.processor = spm.SentencePieceProcessor(model_proto=self.model_proto)
        self.vocab_size = self.processor.get_piece_size()
        self.pad_id, self.bos_id = self.processor.pad_id(), self.processor.bos_id()
        self.eos_id, self.unk_id = self.processor.eos_id(), self.processor.unk_id()

    @classmethod
    def train(cls, sentences, vocab_size, pad_id=0, bos_id=1, eos_id=2, model_type="bpe",
              character_coverage=1.0, name="subwords"):
        """Train on ``sentences`` (strings) to exactly ``vocab_size`` pieces, specials
        included. ``model_type`` "bpe" (byte-pair encoding, as the Transformer paper's
        vocabulary) or "unigram"; ``character_coverage`` 1.0 keeps every character seen."""
        spm = _sentencepiece()
        sentences = [s for s in sentences if s.strip()]
        if not sentences:
            raise DatasetError("{}: no text to train a subword vocabulary on".format(name))
        ids = (pad_id, bos_id, eos_id)
        if len(set(ids)) < 3 or min(ids) < 0 or max(ids) > 3:
            raise DatasetError("{}: pad_id, bos_id, eos_id = {} must be three different ids in "
                               "0..3 (<unk> takes the fourth)".format(name, ids))
        writer = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=writer, vocab_size=int(vocab_size),
                model_type=model_type, character_coverage=character_coverage,
                pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
                unk_id=_unk_id(pad_id, bos_id, eos_id), num_threads=1, input_sentence_size=0,
                shuffle_input_sentence=False, minloglevel=2,
                # sentencepiece leaves out longer sentences (4,192 bytes by default) quietly
                max_sentence_length=max(4192, max(len(s.encode("utf-8")) for s in sentences) + 1))
        except RuntimeError as e:
            raise DatasetError(_training_error(name, vocab_size, len(sentences), str(e))) from e
        return cls(writer.getvalue(), name)

    @classmethod
    def load(cls, path):
        if not os.path.isfile(path):
            raise DatasetError("{}: no such sentencepiece model".format(path))
        with open(path, "rb") as f:
            data = f.read()
        try:
            return cls(data, os.path.basename(path))
        except RuntimeError as e:
            raise DatasetError("{}: not a sentencepiece model ({})".format(path, e)) from e

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self.model_proto)
        return path

    def encode(self, text):
        return self.processor.encode(text)

    def pieces(self, text):
        return self.processor.encode(text, out_type=str)

    def decode(self, ids):
        return self.processor.decode([int(i) for i in ids])

    def check_ids(self, pad_id, bos_id, eos_id, vocab_size, key):
        """Raise unless this model's ids are the config's: its size ``vocab_size`` (the
        config's ``key``) and its pad, bos and eos ids."""
        if self.vocab_size != vocab_size:
            raise DatasetError("{}: {} pieces, but the config's {} is {}; train it to that size"
                               .format(self.name, self.vocab_size, key, vocab_size))
        ours, theirs = (self.pad_id, self.bos_id, self.eos_id), (pad_id, bos_id, eos_id)
        if ours != theirs:
            raise DatasetError("{}: pad, bos, eos ids are {}, the config's are {}; train it "
                               "with the config's ids".format(self.name, ours, theirs))


def _training_error(name, vocab_size, count, message):
    if "too high" in message:
        most = message.rsplit("<=", 1)[-1].strip(" .")
        return ("{}: the {} training sentences support at most {} subword pieces, fewer than "
                "the {} asked; lower the vocabulary size in the config or give more text"
                .format(name, count, most, vocab_size))
    if "required_chars" in message:
        need = message.split(" vs ", 1)[-1].split(".", 1)[0].strip()
        return ("{}: a vocabulary of {} is too small: the text's distinct characters and the "
                "special ids take {}; raise the vocabulary size to at least that, or lower "
                "character_coverage to map rare characters to <unk>".format(
                    name, vocab_size, need))
    return "{}: sentencepiece could not train on {} sentences: {}".format(name, count, message)


def vocab_keys(hp):
    """The config's vocabulary keys: ("src_vocab", "tgt_vocab") for Seq2Seq,
    ("vocab", "vocab") for the Transformer's shared vocabulary."""
    if "src_vocab" in hp and "tgt_vocab" in hp:
        return "src_vocab", "tgt_vocab"
    if "vocab" in hp:
        return "vocab", "vocab"
    raise DatasetError("the config has neither src_vocab and tgt_vocab (Seq2Seq) nor vocab "
                       "(the Transformer); give a translation model's hyperparameters")


def _with_lengths(hp):
    return vocab_keys(hp)[0] == "src_vocab"


def train_for_model(hp, pairs, model_type="bpe", character_coverage=1.0):
    """(source Subwords, target Subwords) trained on ``pairs`` ((source, target) strings) to
    the config's vocabulary sizes and ids; the same object twice when the vocabulary is shared."""
    src_key, tgt_key = vocab_keys(hp)
    ids = dict(pad_id=hp["pad_id"], bos_id=hp["bos_id"], eos_id=hp["eos_id"],
               model_type=model_type, character_coverage=character_coverage)
    pairs = list(pairs)
    if src_key == tgt_key:
        text = [s for s, _ in pairs] + [t for _, t in pairs]
        shared = Subwords.train(text, hp[src_key], name="shared vocabulary ({})".format(src_key),
                                **ids)
        return shared, shared
    return (Subwords.train([s for s, _ in pairs], hp[src_key],
                           name="source vocabulary ({})".format(src_key), **ids),
            Subwords.train([t for _, t in pairs], hp[tgt_key],
                           name="target vocabulary ({})".format(tgt_key), **ids))


def encode_pairs(hp, src_words, tgt_words, pairs, too_long="error", where=None):
    """Encode (source, target) strings to id lists that fit the config's padded lengths.

    The source takes up to ``src_len`` pieces, the target up to ``tgt_len - 1`` (``tgt_in``
    adds BOS, ``labels`` EOS). ``too_long`` says what to do with a longer pair: "error"
    (naming it: ``where(i)`` describes pair i, e.g. ParallelText.where), "skip" (left out,
    counted in a warning) or "truncate" (cut to fit, as TF NMT's src_max_len and tgt_max_len
    do). Returns (encoded pairs, indices of the pairs skipped)."""
    if too_long not in TOO_LONG_POLICIES:
        raise DatasetError("too_long={!r}: give one of {}".format(
            too_long, ", ".join(TOO_LONG_POLICIES)))
    src_key, tgt_key = vocab_keys(hp)
    src_words.check_ids(hp["pad_id"], hp["bos_id"], hp["eos_id"], hp[src_key], src_key)
    tgt_words.check_ids(hp["pad_id"], hp["bos_id"], hp["eos_id"], hp[tgt_key], tgt_key)
    src_max, tgt_max = hp["src_len"], hp["tgt_len"] - 1
    if tgt_max < 1:
        raise DatasetError("tgt_len {} leaves no room for a target word after BOS; it must be "
                           "2 or more".format(hp["tgt_len"]))
    where = where or (lambda i: "pair {}".format(i))
    encoded, skipped = [], []
    for i, (source, target) in enumerate(pairs):
        src, tgt = src_words.encode(source), tgt_words.encode(target)
        if not src or not tgt:
            raise DatasetError("{}: the {} encodes to no pieces".format(
                where(i), "source" if not src else "target"))
        if len(src) > src_max or len(tgt) > tgt_max:
            if too_long == "error":
                raise DatasetError(
                    "{}: {} source and {} target pieces; the config holds {} (src_len) and {} "
                    "(tgt_len - 1, after BOS); raise src_len / tgt_len, or pass "
                    "too_long='skip' or 'truncate'".format(where(i), len(src), len(tgt),
                                                           src_max, tgt_max))
            if too_long == "skip":
                skipped.append(i)
                continue
            src, tgt = src[:src_max], tgt[:tgt_max]
        encoded.append((src, tgt))
    if skipped:
        warnings.warn("left out {} of {} sentence pairs longer than src_len {} / tgt_len - 1 {} "
                      "(too_long='skip')".format(len(skipped), len(skipped) + len(encoded),
                                                 src_max, tgt_max), stacklevel=2)
    if not encoded:
        raise DatasetError("no sentence pair fits src_len {} and tgt_len {}".format(
            hp["src_len"], hp["tgt_len"]))
    return encoded, skipped


def make_batch(hp, encoded):
    """One padded batch from encoded pairs, keyed as the model's inputs (module docstring)."""
    n, pad = len(encoded), hp["pad_id"]
    src = np.full((n, hp["src_len"]), pad, np.int32)
    tgt_in = np.full((n, hp["tgt_len"]), pad, np.int32)
    labels = np.full((n, hp["tgt_len"]), pad, np.int32)
    src_lengths = np.zeros(n, np.int32)
    tgt_lengths = np.zeros(n, np.int32)
    reverse = bool(hp.get("reverse_source", False))
    for row, (s, t) in enumerate(encoded):
        if len(s) > hp["src_len"] or len(t) > hp["tgt_len"] - 1:
            raise DatasetError("pair {} of the batch has {} source and {} target pieces, more "
                               "than src_len {} / tgt_len - 1 {}; encode with encode_pairs".format(
                                   row, len(s), len(t), hp["src_len"], hp["tgt_len"] - 1))
        src[row, :len(s)] = s[::-1] if reverse else s
        tgt_in[row, 0] = hp["bos_id"]
        tgt_in[row, 1:len(t) + 1] = t
        labels[row, :len(t)] = t
        labels[row, len(t)] = hp["eos_id"]
        src_lengths[row], tgt_lengths[row] = len(s), len(t) + 1
    batch = {"src": src, "tgt_in": tgt_in, "labels": labels}
    if _with_lengths(hp):
        batch["src_lengths"], batch["tgt_lengths"] = src_lengths, tgt_lengths
    return batch


def iterate_batches(hp, encoded, batch_size, seed=None, drop_last=False):
    """One epoch of batches: shuffled by ``seed`` (in order when None); the last, smaller
    batch is kept unless ``drop_last``."""
    for rows in epoch_rows(np.arange(len(encoded)), batch_size, seed, drop_last):
        yield make_batch(hp, [encoded[i] for i in rows])
