"""LibriSpeech layout: FLAC utterances with per-chapter transcripts, read into Deep Speech 2's
batches (spectrograms by tbdzoo/datasets/spectrogram.py, characters of the model's alphabet).

The layout (one folder per subset: train-clean-100, dev-clean, test-clean, ...)::

    <subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utterance>.flac     16 kHz mono
    <subset>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt            ID TRANSCRIPT a line

Transcripts are upper case; they become Deep Speech 2's classes: 0 CTC's blank, 1 space,
2 apostrophe, 3..28 a-z. The reader checks the whole subset when it is made: every folder,
every transcript line, and every FLAC's header (soundfile), so a broken file is an error at
once naming it (a missing or extra FLAC, a malformed line, a character outside the alphabet,
a file that is not mono audio). Audio is read when an utterance is; a file at another rate
than the model's is resampled (scipy's polyphase filter). Names starting with "." are ignored;
anything else unexpected is an error.
"""
import collections
import os
import re
import warnings
from math import gcd

import numpy as np

from ..spec.losses import ctc_required_frames
from . import spectrogram as front
from .epochs import epoch_rows
from .errors import DatasetError

__all__ = ["ALPHABET", "LibriSpeech", "Utterance", "transcript_labels", "labels_text",
           "read_transcripts", "make_batch", "TOO_LONG_POLICIES"]

# Deep Speech 2's classes (tbdzoo/models/deepspeech2/ ALPHABET): blank "_", space,
# apostrophe, a-z. Kept here too so that the reader needs no model import.
ALPHABET = "_ '" + "abcdefghijklmnopqrstuvwxyz"
TOO_LONG_POLICIES = ("error", "skip")
_ID = re.compile(r"^(\d+)-(\d+)-(\d+)$")

Utterance = collections.namedtuple(
    "Utterance", "id path transcript labels speaker chapter samples sample_rate")


def _soundfile():
    try:
        import soundfile
    except ImportError:
        raise DatasetError("reading FLAC needs soundfile: install it (pip install "
                           "soundfile==0.14.0, pinned in requirements/main.txt)") from None
    return soundfile


def transcript_labels(text, where="transcript"):
    """Deep Speech 2's class ids of a transcript (any case; runs of spaces count as one).
    A character outside space, apostrophe and a-z is an error naming it and ``where``."""
    text = " ".join(text.split()).lower()
    labels = []
    for position, char in enumerate(text):
        index = ALPHABET.find(char)
        if index < 1:
            raise DatasetError(
                "{}: character {!r} (U+{:04X}) at position {} of {!r} is outside Deep Speech "
                "2's alphabet (space, apostrophe, a-z); write it out in letters".format(
                    where, char, ord(char), position + 1, text))
        labels.append(index)
    return np.array(labels, np.int32)


def labels_text(labels):
    """The transcript (lower case) of class ids; 0 (blank or padding) is dropped."""
    return "".join(ALPHABET[int(i)] for i in labels if int(i) != 0)


def _visible(folder):
    return sorted(name for name in os.listdir(folder) if not name.startswith("."))


def read_transcripts(path, speaker, chapter):
    """{utterance id: (line number, transcript)} of one ``<speaker>-<chapter>.trans.txt``."""
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise DatasetError("{}, line {}: not UTF-8 ({})".format(path, number, e.reason)) from e
        if not line:
            raise DatasetError("{}, line {}: empty line; each line is 'ID TRANSCRIPT'".format(
                path, number))
        fields = line.split(None, 1)
        match = _ID.match(fields[0])
        if not match or (match.group(1), match.group(2)) != (speaker, chapter):
            raise DatasetError(
                "{}, line {}: {!r} is not an utterance id of this chapter ({}-{}-NNNN)".format(
                    path, number, fields[0], speaker, chapter))
        if len(fields) < 2:
            raise DatasetError("{}, line {}: {} has no transcript".format(path, number,
                                                                          fields[0]))
        if fields[0] in out:
            raise DatasetError("{}, line {}: {} is listed again (first on line {})".format(
                path, number, fields[0], out[fields[0]][0]))
        out[fields[0]] = (number, fields[1])
    if not out:
        raise DatasetError("{}: no transcripts".format(path))
    return out


class LibriSpeech:
    """The utterances of one subset: ``dataset[i]`` is an Utterance (id, FLAC path, transcript,
    labels int32, speaker, chapter, samples and sample rate from the file's header);
    ``audio(i, sample_rate)`` its samples, ``spectrogram(i, hp)`` Deep Speech 2's input.
    Utterances are in id order (speaker, chapter, utterance)."""

    def __init__(self, root, subset="train-clean-100"):
        sf = _soundfile()
        self.folder = os.path.join(root, subset)
        if not os.path.isdir(self.folder):
            present = _visible(root) if os.path.isdir(root) else []
            raise DatasetError("{}: no such subset folder; folders in {}: {}".format(
                self.folder, root, ", ".join(p for p in present
                                             if os.path.isdir(os.path.join(root, p)))
                or "(none)"))
        self.subset = subset
        self.utterances = []
        for speaker in _visible(self.folder):
            speaker_dir = os.path.join(self.folder, speaker)
            if not (speaker.isdigit() and os.path.isdir(speaker_dir)):
                raise DatasetError("{}: not a speaker folder (LibriSpeech's are numbers); a "
                                   "subset holds only <speaker>/<chapter>/".format(speaker_dir))
            for chapter in _visible(speaker_dir):
                chapter_dir = os.path.join(speaker_dir, chapter)
                if not (chapter.isdigit() and os.path.isdir(chapter_dir)):
                    raise DatasetError("{}: not a chapter folder (LibriSpeech's are numbers)"
                                       .format(chapter_dir))
                self._read_chapter(sf, chapter_dir, speaker, chapter)
        if not self.utterances:
            raise DatasetError("{}: no utterances (<speaker>/<chapter>/*.flac)".format(
                self.folder))

    def _read_chapter(self, sf, folder, speaker, chapter):
        trans = "{}-{}.trans.txt".format(speaker, chapter)
        trans_path = os.path.join(folder, trans)
        if not os.path.isfile(trans_path):
            raise DatasetError("{}: missing; every chapter folder holds its transcripts"
                               .format(trans_path))
        lines = read_transcripts(trans_path, speaker, chapter)
        flacs = set()
        for name in _visible(folder):
            if name == trans:
                continue
            stem, ext = os.path.splitext(name)
            if ext != ".flac":
                raise DatasetError("{}: unexpected file; a chapter folder holds <id>.flac and "
                                   "{}".format(os.path.join(folder, name), trans))
            if stem not in lines:
                raise DatasetError("{}: no transcript for it in {}".format(
                    os.path.join(folder, name), trans_path))
            flacs.add(stem)
        for utt_id in sorted(lines):
            number, text = lines[utt_id]
            path = os.path.join(folder, utt_id + ".flac")
            if utt_id not in flacs:
                raise DatasetError("{}: missing, but {} line {} transcribes it".format(
                    path, trans_path, number))
            try:
                info = sf.info(path)
            except (RuntimeError, sf.LibsndfileError) as e:
                raise DatasetError("{}: not readable audio ({})".format(path, e)) from e
            if info.channels != 1:
                raise DatasetError("{}: {} channels; LibriSpeech's utterances are mono".format(
                    path, info.channels))
            if info.frames < 1:
                raise DatasetError("{}: no samples".format(path))
            labels = transcript_labels(text, "{}, line {}".format(trans_path, number))
            self.utterances.append(Utterance(utt_id, path, text, labels, speaker, chapter,
                                             int(info.frames), int(info.samplerate)))

    def __len__(self):
        return len(self.utterances)

    def __getitem__(self, i):
        return self.utterances[i]

    @property
    def speakers(self):
        return sorted(set(u.speaker for u in self.utterances))

    def audio(self, i, sample_rate=front.SAMPLE_RATE):
        """Utterance i's samples, float32 in [-1, 1], at ``sample_rate`` (resampled when the
        file's rate differs)."""
        utt = self.utterances[i]
        sf = _soundfile()
        try:
            samples, rate = sf.read(utt.path, dtype="float32", always_2d=False)
        except (RuntimeError, sf.LibsndfileError) as e:
            raise DatasetError("{}: not readable audio ({})".format(utt.path, e)) from e
        return _resample(samples, rate, sample_rate)

    def frames(self, i, hp):
        """Spectrogram frames of utterance i under the config, from its header alone."""
        utt = self.utterances[i]
        samples = _resampled_length(utt.samples, utt.sample_rate, hp["sample_rate"])
        return front.num_frames(samples, hp["sample_rate"], hp["hop_ms"])

    def spectrogram(self, i, hp):
        """Deep Speech 2's input for utterance i: (frames, bins) float32 as the config's
        sample_rate, window_ms and hop_ms say."""
        audio = self.audio(i, hp["sample_rate"])
        try:
            return front.spectrogram(audio, hp["sample_rate"], hp["window_ms"], hp["hop_ms"])
        except ValueError as e:
            raise DatasetError("{}: {}".format(self.utterances[i].path, e)) from e

    def fitting(self, hp, rules, too_long="error"):
        """Indices of the utterances that fit the config: at most ``max_frames`` frames, the
        transcript within the padded label length and alignable by CTC after the
        convolutions. Others are an error naming the file, or with ``too_long='skip'`` left
        out and counted in a warning. ``rules``: the model's shape rules, ``min_frames(hp)``,
        ``output_steps(hp, frames)`` and ``max_label_length(hp)`` (tbdzoo.models.deepspeech2)."""
        if too_long not in TOO_LONG_POLICIES:
            raise DatasetError("too_long={!r}: give one of {}".format(
                too_long, ", ".join(TOO_LONG_POLICIES)))
        if hp["num_classes"] != len(ALPHABET):
            raise DatasetError("num_classes is {}, but LibriSpeech's transcripts use Deep "
                               "Speech 2's {} classes (blank, space, apostrophe, a-z)".format(
                                   hp["num_classes"], len(ALPHABET)))
        keep, skipped = [], []
        max_labels, low = rules.max_label_length(hp), rules.min_frames(hp)
        for i, utt in enumerate(self.utterances):
            frames = self.frames(i, hp)
            problem = None
            if frames > hp["max_frames"]:
                problem = ("{} frames, more than max_frames {}; raise max_frames or pass "
                           "too_long='skip'".format(frames, hp["max_frames"]))
            elif frames < low:
                problem = "{} frames, fewer than the {} the convolutions read".format(frames, low)
            elif len(utt.labels) > max_labels:
                problem = ("{} transcript characters, more than the padded {} (max_frames x "
                           "hop x chars_per_second); raise chars_per_second or max_frames"
                           .format(len(utt.labels), max_labels))
            else:
                need, steps = ctc_required_frames(utt.labels), int(rules.output_steps(hp, frames))
                if need > steps:
                    problem = ("{} characters need {} output steps for CTC, but its {} frames "
                               "give {}".format(len(utt.labels), need, frames, steps))
            if problem is None:
                keep.append(i)
            elif too_long == "error":
                raise DatasetError("{}: {}".format(utt.path, problem))
            else:
                skipped.append(i)
        if skipped:
            warnings.warn("{}: left out {} of {} utterances that do not fit the config "
                          "(too_long='skip'), e.g. {}".format(
                              self.folder, len(skipped), len(self.utterances),
                              self.utterances[skipped[0]].id), stacklevel=2)
        if not keep:
            raise DatasetError("{}: no utterance fits max_frames {}".format(self.folder,
                                                                           hp["max_frames"]))
        return keep

    def batches(self, hp, rules, batch_size, seed=None, too_long="error", drop_last=False):
        """One epoch of Deep Speech 2 batches (make_batch): shuffled by ``seed`` (in id order
        when None); the last, smaller batch kept unless ``drop_last``."""
        for rows in epoch_rows(self.fitting(hp, rules, too_long), batch_size, seed, drop_last):
            yield make_batch(hp, rules, [self.spectrogram(i, hp) for i in rows],
                             [self.utterances[i].labels for i in rows])


def make_batch(hp, rules, spectrograms, labels):
    """Deep Speech 2's batch: ``spectrogram`` (N, max_frames, bins) float32 zero-padded,
    ``spectrogram_lengths`` (N,), ``labels`` (N, max_label_length) int32 zero-padded,
    ``label_lengths`` (N,); the keys and shapes of the model's synthetic batch. ``rules``
    gives ``max_label_length(hp)`` (tbdzoo.models.deepspeech2)."""
    bins = front.num_bins(hp["sample_rate"], hp["window_ms"])
    n, max_labels = len(spectrograms), rules.max_label_length(hp)
    batch = {"spectrogram": np.zeros((n, hp["max_frames"], bins), np.float32),
             "spectrogram_lengths": np.zeros(n, np.int32),
             "labels": np.zeros((n, max_labels), np.int32),
             "label_lengths": np.zeros(n, np.int32)}
    for row, (spect, text) in enumerate(zip(spectrograms, labels)):
        if spect.shape[0] > hp["max_frames"] or spect.shape[1] != bins or len(text) > max_labels:
            raise DatasetError("example {}: spectrogram {} and {} characters do not fit ({}, "
                               "{}) and {}".format(row, spect.shape, len(text), hp["max_frames"],
                                                   bins, max_labels))
        batch["spectrogram"][row, :len(spect)] = spect
        batch["spectrogram_lengths"][row] = len(spect)
        batch["labels"][row, :len(text)] = text
        batch["label_lengths"][row] = len(text)
    return batch


def _rates(rate, target):
    g = gcd(int(rate), int(target))
    return int(target) // g, int(rate) // g


def _resampled_length(samples, rate, target):
    if rate == target:
        return samples
    up, down = _rates(rate, target)
    return -(-samples * up // down)      # resample_poly's output: ceil(samples * up / down)


def _resample(samples, rate, target):
    if rate == target:
        return samples
    from scipy.signal import resample_poly
    up, down = _rates(rate, target)
    return resample_poly(samples, up, down).astype(np.float32)
