"""Translation (Seq2Seq, the Transformer) on parallel text in IWSLT'15 layout (numbers-en-vi
from `tbd data make`): batches of the word vocabularies in DIR/vocab.<lang>, the held-out split
tst2013 (test numbers disjoint from training), and two teacher-forced metrics: the model reads
the reference's previous words, so these measure next-word prediction, not free decoding.

- ``token_accuracy``: the fraction of reference words (and end-of-sentence marks) that are
  the argmax of the model's output at their position;
- ``sentence_accuracy``: the fraction of sentences whose every position is right.

and two of free (greedy) decoding, where the model reads its own previous words (decoding.py):

- ``exact_match``: the fraction of held-out sentences decoded word for word;
- ``bleu``: corpus BLEU (0-100) of the decoded sentences against the references, by sacrebleu
  on the data set's own words (``tokenize="none"``: the text is tokenized already, as the
  NMT papers' tokenized BLEU).

Ids: the config's pad (0), BOS (1) and EOS (2), unknown 3, then the vocabulary file's words
after its own <unk>, <s>, </s>."""

import numpy as np

from ..datasets.errors import DatasetError
from ..datasets.parallel_text import SPECIAL_WORDS, ParallelText
from ..datasets.subwords import make_batch, vocab_keys
from .decoding import greedy_decode
from .errors import TrainingError
from .image_task import dataset_name
from .shards import rank_slice

__all__ = ["TranslationTask", "LAYOUT", "DATA_COMMAND"]

LAYOUT = ("IWSLT'15 layout: DIR/train.en, DIR/train.vi, DIR/tst2013.en, DIR/tst2013.vi, "
          "DIR/vocab.en, DIR/vocab.vi")
# The command that writes the proxy's data in this layout.
DATA_COMMAND = "tbd data make numbers-en-vi --out DIR"
UNKNOWN = 3
EVAL_BATCH = 100


def open_pairs(data_dir, split):
    try:
        return ParallelText(data_dir, split)
    except DatasetError as e:
        raise TrainingError("{}: not a data set the translation models train from ({}); "
                            "expected {}; make one with: {}".format(data_dir, e, LAYOUT,
                                                                     DATA_COMMAND)) from e


def word_ids(words):
    """{word: id}: the vocabulary's words after the special ids 0-3."""
    return {w: i + 4 for i, w in enumerate(w for w in words if w not in SPECIAL_WORDS)}


class TranslationTask:
    metric_names = ("token_accuracy", "sentence_accuracy", "exact_match", "bleu")
    decoded_metrics = ("exact_match", "bleu")

    layout, data_command = LAYOUT, DATA_COMMAND   # what a missing --data is told

    @staticmethod
    def check_data(data_dir):
        """Open both splits, so that a wrong layout fails before a model is built."""
        open_pairs(data_dir, "train")
        open_pairs(data_dir, "test")

    def __init__(self, model, data_dir, seed=0, workers=0, rank=0, world_size=1):
        hp = self.hp = model.hparams
        self.model, self.seed = model, seed
        self.rank, self.world_size = rank, world_size   # a data-parallel rank: see batches()
        train, test = open_pairs(data_dir, "train"), open_pairs(data_dir, "test")
        src_ids, tgt_ids = word_ids(train.vocabulary("en")), word_ids(train.vocabulary("vi"))
        src_key, tgt_key = vocab_keys(hp)
        needed = {src_key: max(src_ids.values()) + 1, tgt_key: max(tgt_ids.values()) + 1}
        if src_key == tgt_key:      # a shared vocabulary: the target's ids follow the source's
            tgt_ids = {w: i + needed[src_key] - 4 for w, i in tgt_ids.items()}
            needed = {src_key: max(tgt_ids.values()) + 1}
        for key, size in needed.items():
            if hp[key] < size:
                raise TrainingError("{}: the vocabularies need {}={} (4 special ids and the "
                                    "words); set --set {}={}".format(data_dir, key, size, key,
                                                                     size))
        self.train = self._encode(train, src_ids, tgt_ids)
        self.test = self._encode(test, src_ids, tgt_ids)
        self._references = [t for _, t in test.pairs]
        self._words = dict((i, w) for w, i in tgt_ids.items())
        self.pipeline = "word vocabularies, NumPy batches (tbdzoo.datasets.subwords.make_batch)"
        self.dataset = dataset_name(data_dir)
        self.examples = {"train": len(self.train), "test": len(self.test)}
        self._held_out = [make_batch(hp, self.test[i:i + EVAL_BATCH])
                          for i in range(0, len(self.test), EVAL_BATCH)]

    def _encode(self, text, src_ids, tgt_ids):
        hp, out = self.hp, []
        for i, (s, t) in enumerate(text.pairs):
            src = [src_ids.get(w, UNKNOWN) for w in s.split()]
            tgt = [tgt_ids.get(w, UNKNOWN) for w in t.split()]
            if len(src) > hp["src_len"] or len(tgt) > hp["tgt_len"] - 1:
                raise TrainingError("{}: {} source and {} target words; the config holds "
                                    "src_len {} and tgt_len - 1 {}; raise them with --set".format(
                                        text.where(i), len(src), len(tgt), hp["src_len"],
                                        hp["tgt_len"] - 1))
            out.append((src, tgt))
        return out

    def batches(self):
        """Training batches without end: each epoch a permutation drawn from (seed, epoch).
        A data-parallel rank draws the global batch (W times its own) and trains on its
        contiguous slice, weighing its gradient by its share of the global batch's target
        tokens (tbdzoo.distributed.world.gradient_weight): shards hold different numbers of
        tokens, and only the global batch tells the weight (shards.py)."""
        size, epoch = self.hp["batch_size"] * self.world_size, 0
        while True:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
            for start in range(0, len(order) - size + 1, size):
                batch = make_batch(self.hp, [self.train[i] for i in order[start:start + size]])
                yield rank_slice(self.model, batch, self.rank, self.world_size)
            epoch += 1

    def close(self):
        pass

    def evaluate(self, metrics=None):
        """The held-out metrics named in ``metrics`` (all when None): the teacher-forced ones
        cost one forward pass a batch, the decoded ones ``tgt_len`` (decoding.py)."""
        wanted = set(self.metric_names if metrics is None else metrics)
        out = {}
        if wanted - set(self.decoded_metrics):
            out.update(self._teacher_forced())
        if wanted & set(self.decoded_metrics):
            out.update(self._decoded())
        return out

    def _teacher_forced(self):
        right = words = sentences_right = sentences = 0
        for batch in self._held_out:
            logits = np.asarray(self.model.predict(batch))
            guess = np.argmax(logits, axis=-1)
            labels = batch["labels"]
            inside = labels != self.hp["pad_id"]     # the words and the end-of-sentence mark
            hits = (guess == labels) & inside
            right += int(hits.sum())
            words += int(inside.sum())
            sentences_right += int((hits.sum(1) == inside.sum(1)).sum())
            sentences += len(labels)
        return {"token_accuracy": right / float(words),
                "sentence_accuracy": sentences_right / float(sentences)}

    def _decoded(self):
        import sacrebleu
        decoded = []
        for batch in self._held_out:
            decoded.extend(greedy_decode(self.model, batch, self.hp))
        exact = sum(ids == tgt for ids, (_, tgt) in zip(decoded, self.test))
        hypotheses = [" ".join(self._words.get(i, "<unk>") for i in ids) for ids in decoded]
        bleu = sacrebleu.corpus_bleu(hypotheses, [self._references], tokenize="none")
        return {"exact_match": exact / float(len(decoded)), "bleu": float(bleu.score)}
