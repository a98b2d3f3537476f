"""Speech recognition (Deep Speech 2) on LibriSpeech-layout folders (spoken-numbers from
`tbd data make`): spectrograms of the training subset computed once, batches drawn each epoch
in a permutation of (seed, epoch), and the held-out subset (test-clean: voices not heard in
training) scored by greedy CTC decoding (the argmax class of each output step, repeats merged,
blanks dropped): ``cer``, characters' edit distance over the references' characters, and
``wer``, the same over words. Utterances longer than the proxy's max_frames are left out of
both, and counted in the record."""
import os
import warnings

import numpy as np

from ..datasets.errors import DatasetError
from ..datasets.librispeech import LibriSpeech, make_batch
from ..models import deepspeech2 as ds2
from .errors import TrainingError
from .image_task import dataset_name
from .shards import rank_slice

__all__ = ["SpeechTask", "LAYOUT", "DATA_COMMAND", "greedy_ctc", "edit_distance"]

LAYOUT = ("LibriSpeech layout: DIR/train-clean[-100]/<speaker>/<chapter>/*.flac with "
          "<speaker>-<chapter>.trans.txt, and DIR/test-clean/ likewise")
# The command that writes the proxy's data in this layout.
DATA_COMMAND = "tbd data make spoken-numbers --out DIR --set utterances=16"
TRAIN_SUBSETS = ("train-clean", "train-clean-100", "train-clean-360", "train-other-500")
HELD_OUT_SUBSETS = ("test-clean", "dev-clean")
EVAL_BATCH = 32
SPACE = 1


def _subset(data_dir, names):
    for name in names:
        if os.path.isdir(os.path.join(data_dir, name)):
            return name
    raise TrainingError("{}: no {} folder; expected {}; make one with: {}".format(
        data_dir, " or ".join(names), LAYOUT, DATA_COMMAND))


def open_subsets(data_dir):
    if not os.path.isdir(data_dir or ""):
        raise TrainingError("{}: no such folder; expected {}; make one with: {}".format(
            data_dir, LAYOUT, DATA_COMMAND))
    try:
        return (LibriSpeech(data_dir, _subset(data_dir, TRAIN_SUBSETS)),
                LibriSpeech(data_dir, _subset(data_dir, HELD_OUT_SUBSETS)))
    except DatasetError as e:
        raise TrainingError("{}: not a data set Deep Speech 2 trains from ({}); expected {}; "
                            "make one with: {}".format(data_dir, e, LAYOUT, DATA_COMMAND)) from e


def greedy_ctc(classes, steps):
    """The labels of one utterance's argmax classes over its first ``steps`` output steps."""
    out, previous = [], None
    for c in classes[:steps]:
        c = int(c)
        if c != previous and c != 0:
            out.append(c)
        previous = c
    return out


def edit_distance(a, b):
    """Levenshtein distance of two sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


def _words(labels):
    words, word = [], []
    for c in list(labels) + [SPACE]:
        if c == SPACE:
            if word:
                words.append(tuple(word))
            word = []
        else:
            word.append(c)
    return words


class SpeechTask:
    metric_names = ("cer", "wer")

    layout, data_command = LAYOUT, DATA_COMMAND   # what a missing --data is told

    @staticmethod
    def check_data(data_dir):
        """Open the folder's subsets, so that a wrong layout fails before a model is built."""
        open_subsets(data_dir)

    def __init__(self, model, data_dir, seed=0, workers=0, rank=0, world_size=1):
        self.model, self.seed, self.hp = model, seed, model.hparams
        self.rank, self.world_size = rank, world_size   # a data-parallel rank: see batches()
        self._output_steps = ds2.output_steps
        train, held_out = open_subsets(data_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # the counts go into the record instead
            keep, test_keep = train.fitting(self.hp, ds2, "skip"), held_out.fitting(self.hp, ds2, "skip")
        if len(keep) < self.hp["batch_size"] * world_size:
            raise TrainingError("{}: {} training utterances fit max_frames {}; a batch needs {}"
                                .format(data_dir, len(keep), self.hp["max_frames"],
                                        self.hp["batch_size"] * world_size))
        self.train = [(train.spectrogram(i, self.hp), train.utterances[i].labels) for i in keep]
        test = [(held_out.spectrogram(i, self.hp), held_out.utterances[i].labels)
                for i in test_keep]
        self._held_out = [make_batch(self.hp, ds2, [s for s, _ in test[i:i + EVAL_BATCH]],
                                     [l for _, l in test[i:i + EVAL_BATCH]])
                          for i in range(0, len(test), EVAL_BATCH)]
        self.pipeline = "spectrograms computed once, NumPy batches (librispeech.make_batch)"
        self.dataset = dataset_name(data_dir)
        self.examples = {"train": len(keep), "test": len(test_keep),
                         "left_out_too_long": len(train) - len(keep) +
                         len(held_out) - len(test_keep)}

    def batches(self):
        """Batches without end, each epoch a permutation of (seed, epoch). A data-parallel
        rank draws the global batch and trains on its contiguous slice (shards.py), as the
        translation task does."""
        size, epoch = self.hp["batch_size"] * self.world_size, 0
        while True:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
            for start in range(0, len(order) - size + 1, size):
                rows = [self.train[i] for i in order[start:start + size]]
                batch = make_batch(self.hp, ds2, [s for s, _ in rows], [l for _, l in rows])
                yield rank_slice(self.model, batch, self.rank, self.world_size)
            epoch += 1

    def close(self):
        pass

    def evaluate(self, metrics=None):
        """CER and WER of one decoding pass; both come from it, so ``metrics`` changes nothing."""
        char_errors = chars = word_errors = words = 0
        for batch in self._held_out:
            classes = np.argmax(np.asarray(self.model.predict(batch)), axis=-1)
            steps = self._output_steps(self.hp, batch["spectrogram_lengths"])
            for row in range(len(classes)):
                guess = greedy_ctc(classes[row], int(steps[row]))
                truth = [int(c) for c in batch["labels"][row, :batch["label_lengths"][row]]]
                char_errors += edit_distance(guess, truth)
                chars += len(truth)
                word_errors += edit_distance(_words(guess), _words(truth))
                words += len(_words(truth))
        return {"cer": char_errors / float(chars), "wer": word_errors / float(words)}
