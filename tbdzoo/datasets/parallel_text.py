"""Parallel text in IWSLT'15 / WMT layout: one folder, one file per split and language.

The layout (IWSLT'15 English-Vietnamese as TF NMT's tutorial prepares it)::

    train.en   train.vi        training pairs, one pre-tokenised sentence a line
    tst2012.en tst2012.vi      development set
    tst2013.en tst2013.vi      test set
    vocab.en   vocab.vi        word vocabularies, one word a line (<unk>, <s>, </s> first)

WMT sets use the same scheme with other file names (``newstest2013.de``...): the split names are
a mapping from tbdzoo's split ("train", "dev", "test") to the file's prefix, IWSLT15 by default.
Line i of the source file translates line i of the target file, so the two must have the same
number of lines; an empty line, undecodable UTF-8 or a missing file is an error naming the file
(and line). Nothing is skipped unless asked, and what is skipped is counted.
"""
import collections
import os
import warnings

from .errors import DatasetError

__all__ = ["IWSLT15", "WMT14", "SPLITS", "ParallelText", "read_lines", "read_vocab",
           "write_parallel", "write_vocab", "word_vocabulary", "SPECIAL_WORDS"]

IWSLT15 = {"train": "train", "dev": "tst2012", "test": "tst2013"}
# WMT'14 English-German as the Transformer paper evaluated it: newstest2013 for development,
# newstest2014 for test; the training file's name varies with how it was prepared.
WMT14 = {"train": "train", "dev": "newstest2013", "test": "newstest2014"}
SPLITS = ("train", "dev", "test")
EMPTY_POLICIES = ("error", "skip")
SPECIAL_WORDS = ("<unk>", "<s>", "</s>")   # TF NMT's vocabulary files start with these


def read_lines(path):
    """The lines of a UTF-8 text file without their line ends; errors name the file (and line)."""
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        present = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        raise DatasetError("{}: no such file; files in {}: {}".format(
            path, folder, ", ".join(present[:20]) or "(none)"))
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()                              # the last line's end, not an empty line
    out = []
    for number, raw in enumerate(lines, 1):
        try:
            out.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise DatasetError("{}, line {}: not UTF-8 ({}); convert the file to UTF-8".format(
                path, number, e.reason)) from e
    return out


class ParallelText:
    """The sentence pairs of one split: ``pairs[i]`` is (source, target), two strings.

    ``root`` holds ``<prefix>.<lang>`` files, the prefix given by ``prefixes[split]``
    (IWSLT15 by default; WMT14 or any mapping for other layouts). ``empty`` says what to do with
    a pair whose source or target line is empty (blank): "error" (the default, naming the file
    and line) or "skip" (the pair is left out, its line number added to ``skipped`` and a
    warning gives the count).
    """

    def __init__(self, root, split="train", src_lang="en", tgt_lang="vi", prefixes=None,
                 empty="error"):
        prefixes = IWSLT15 if prefixes is None else prefixes
        if split not in prefixes:
            raise DatasetError("split {!r} is not one of this layout's splits: {}; pass "
                               "prefixes={{{!r}: 'file prefix', ...}} for another".format(
                                   split, ", ".join(sorted(prefixes)), split))
        if empty not in EMPTY_POLICIES:
            raise DatasetError("empty={!r}: give one of {}".format(empty,
                                                                  ", ".join(EMPTY_POLICIES)))
        if not os.path.isdir(root):
            raise DatasetError("{}: no such folder; give the folder holding {}.{} and {}.{}"
                               .format(root, prefixes[split], src_lang, prefixes[split],
                                       tgt_lang))
        self.root, self.split = root, split
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.src_path = os.path.join(root, "{}.{}".format(prefixes[split], src_lang))
        self.tgt_path = os.path.join(root, "{}.{}".format(prefixes[split], tgt_lang))
        src, tgt = read_lines(self.src_path), read_lines(self.tgt_path)
        if len(src) != len(tgt):
            raise DatasetError(
                "{} has {} lines but {} has {}: line i of one must translate line i of the "
                "other; the pair of files is truncated or misaligned".format(
                    self.src_path, len(src), self.tgt_path, len(tgt)))
        self.pairs, self.line_numbers, self.skipped = [], [], []
        for number, (s, t) in enumerate(zip(src, tgt), 1):
            blank = [path for path, text in ((self.src_path, s), (self.tgt_path, t))
                     if not text.strip()]
            if blank:
                if empty == "error":
                    raise DatasetError(
                        "{}, line {}: empty line (a sentence pair needs both sides); remove "
                        "the pair from both files, or pass empty='skip' to leave such pairs "
                        "out".format(" and ".join(blank), number))
                self.skipped.append(number)
                continue
            self.pairs.append((s.strip(), t.strip()))
            self.line_numbers.append(number)
        if self.skipped:
            warnings.warn("{}: left out {} pair(s) with an empty line (empty='skip'); their line "
                          "numbers are in .skipped".format(self.src_path, len(self.skipped)), stacklevel=2)
        if not self.pairs:
            raise DatasetError("{} and {}: no sentence pairs".format(self.src_path,
                                                                     self.tgt_path))

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]

    def where(self, i):
        """'file, line n' of pair i, for messages about it."""
        return "{}, line {}".format(self.src_path, self.line_numbers[i])

    @property
    def sources(self):
        return [s for s, _ in self.pairs]

    @property
    def targets(self):
        return [t for _, t in self.pairs]

    def vocabulary(self, lang):
        """The words of ``vocab.<lang>`` beside the split's files (read_vocab)."""
        return read_vocab(os.path.join(self.root, "vocab." + lang))


def read_vocab(path):
    """A word vocabulary file, one word a line: the list of words. An empty line or a word
    listed twice is an error naming the file and line."""
    words, seen = [], {}
    for number, word in enumerate(read_lines(path), 1):
        word = word.strip()
        if not word:
            raise DatasetError("{}, line {}: empty line in a vocabulary".format(path, number))
        if word in seen:
            raise DatasetError("{}, line {}: {!r} is listed again (first on line {})".format(
                path, number, word, seen[word]))
        seen[word] = number
        words.append(word)
    return words


def word_vocabulary(sentences):
    """TF NMT's vocabulary of pre-tokenised sentences: <unk>, <s>, </s>, then the words by
    falling frequency (ties in code-point order)."""
    counts = collections.Counter(w for s in sentences for w in s.split())
    for word in SPECIAL_WORDS:
        counts.pop(word, None)
    return list(SPECIAL_WORDS) + sorted(counts, key=lambda w: (-counts[w], w))


def _write(path, lines):
    for number, line in enumerate(lines, 1):
        if not line.strip() or "\n" in line or "\r" in line:
            raise DatasetError("{}: line {} to write, {!r}, is empty or holds a line break"
                               .format(path, number, line))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


def write_parallel(root, split_pairs, src_lang, tgt_lang, prefixes=None):
    """Write ``{split: [(source, target), ...]}`` as ``<prefix>.<lang>`` files under ``root``;
    returns the paths written."""
    prefixes = IWSLT15 if prefixes is None else prefixes
    if not os.path.isdir(root):
        os.makedirs(root)
    written = []
    for split in sorted(split_pairs):
        pairs = split_pairs[split]
        for lang, side in ((src_lang, 0), (tgt_lang, 1)):
            path = os.path.join(root, "{}.{}".format(prefixes[split], lang))
            _write(path, [pair[side] for pair in pairs])
            written.append(path)
    return written


def write_vocab(path, words):
    _write(path, words)
    return path
