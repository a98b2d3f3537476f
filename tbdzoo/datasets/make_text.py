"""Translation data sets made offline, in IWSLT'15 layout (tbdzoo/datasets/parallel_text.py).

- ``numbers-en-vi``, ``numbers-en-de``: numbers written out in words by num2words, English on
  the source side; the numbers of the dev and test sets never occur in the training set.
- ``gettext-en-vi``, ``gettext-en-de``: the human-translated user-interface messages of the
  gettext catalogs (``.mo``) that installed Debian packages put in
  ``/usr/share/locale/<lang>/LC_MESSAGES``; an English message is in one split only.

Each writes ``train``, ``tst2012`` (dev) and ``tst2013`` (test) ``.en`` / ``.<lang>`` files and
``vocab.en`` / ``vocab.<lang>`` (the training words, TF NMT's format), one pre-tokenised
sentence a line (words, and punctuation split off), and depends only on its seed (and, for
gettext, on the catalogs installed). Each maker is ``function(out_dir, seed, progress)`` ->
dict of facts; ``progress(what, done, total)`` is called as the work advances when given
(tbdzoo/datasets/makers.py).
"""
import functools
import gettext
import glob
import os
import re
import warnings

import numpy as np

from .errors import DatasetError
from .parallel_text import IWSLT15, word_vocabulary, write_parallel, write_vocab

__all__ = ["MAKERS", "make_numbers", "make_gettext", "tokenize", "read_catalogs",
           "number_splits", "LOCALE_DIR"]

LOCALE_DIR = "/usr/share/locale"
SPLIT_SIZES = {"train": 2000, "dev": 200, "test": 200}
GETTEXT_SIZES = {"train": 4000, "dev": 500, "test": 500}
# printf and format placeholders (%s, %1$d, %(name)s, {0}) stay whole, as do words with inner
# hyphens or apostrophes; any other punctuation mark is a token of its own.
_TOKEN = re.compile(r"%(?:\(\w+\))?[-+#0-9.$]*[a-zA-Z]|\{\w*\}|\w+(?:[-'\u2019]\w+)*|[^\w\s]",
                    re.UNICODE)


def tokenize(text):
    """Words (hyphen and apostrophe compounds kept whole) and punctuation, space-separated."""
    return " ".join(_TOKEN.findall(text))


def _report(progress, what, done, total):
    if progress is not None:
        progress(what, done, total)


def number_splits(seed, sizes, largest):
    """{split: sorted numbers}: distinct numbers in [0, largest], the digit count drawn
    uniformly first (so small numbers are as common as large ones), no number in two splits."""
    total = sum(sizes.values())
    if total > largest + 1:
        raise DatasetError("{} distinct numbers asked for ({}), but only {} lie in [0, {}]; "
                           "raise largest or lower the sizes".format(
                               total, sizes, largest + 1, largest))
    rng = np.random.RandomState(seed)
    digits = len(str(largest))
    chosen, seen = [], set()
    while len(chosen) < total:
        d = rng.randint(1, digits + 1)
        low, high = (0 if d == 1 else 10 ** (d - 1)), min(10 ** d - 1, largest)
        if low > high:
            continue
        n = int(rng.randint(low, high + 1))
        if n not in seen:
            seen.add(n)
            chosen.append(n)
    out, start = {}, 0
    for split in ("train", "dev", "test"):
        out[split] = chosen[start:start + sizes[split]]
        start += sizes[split]
    return out


def _num2words():
    try:
        from num2words import num2words
    except ImportError:
        raise DatasetError("the numbers data sets need num2words: install it (pip install "
                           "num2words==0.5.14, pinned in requirements/main.txt)") from None
    return num2words


def make_numbers(out_dir, seed=0, progress=None, lang="vi", train=SPLIT_SIZES["train"],
                 dev=SPLIT_SIZES["dev"], test=SPLIT_SIZES["test"], largest=999999):
    """English number words to ``lang`` number words (num2words), IWSLT'15 layout."""
    num2words = _num2words()
    sizes = {"train": train, "dev": dev, "test": test}
    numbers = number_splits(seed, sizes, largest)
    total, done, pairs = sum(sizes.values()), 0, {}
    for split in ("train", "dev", "test"):
        pairs[split] = []
        for n in numbers[split]:
            pairs[split].append((tokenize(num2words(n, lang="en")),
                                 tokenize(num2words(n, lang=lang))))
            done += 1
            if done % 500 == 0:
                _report(progress, "pairs", done, total)
    _report(progress, "pairs", total, total)
    facts = _write(out_dir, pairs, lang)
    facts.update(source="num2words cardinals, English to {}".format(lang),
                 largest_number=largest,
                 test_numbers_disjoint_from_train=not (set(numbers["train"]) &
                                                       set(numbers["test"] + numbers["dev"])))
    return facts


def _write(out_dir, pairs, lang):
    write_parallel(out_dir, pairs, "en", lang)
    for code, side in (("en", 0), (lang, 1)):
        write_vocab(os.path.join(out_dir, "vocab." + code),
                    word_vocabulary(p[side] for p in pairs["train"]))
    return {"layout": "IWSLT'15", "languages": ["en", lang],
            "files": {split: IWSLT15[split] for split in pairs},
            "pairs": {split: len(p) for split, p in pairs.items()}}


def read_catalogs(lang, locale_dir=LOCALE_DIR):
    """The English -> ``lang`` messages of every readable gettext catalog.

    Returns (messages, facts): messages a dict of one-line English message to its translation
    (the first catalog in name order wins a message found in several; plural entries give
    their singular), facts counting the catalogs read and, by name, those skipped for a bad
    header or encoding. Messages that span lines, or have no letter, are left out and counted.
    """
    paths = sorted(glob.glob(os.path.join(locale_dir, lang, "LC_MESSAGES", "*.mo")))
    if not paths:
        raise DatasetError(
            "{}: no gettext catalogs (*.mo) for {!r}; they come with installed Debian packages' "
            "translations (for example apt-get install coreutils, or any package with a "
            "locale), and are absent when locales were purged".format(
                os.path.join(locale_dir, lang, "LC_MESSAGES"), lang))
    messages, bad, multiline, no_letters = {}, {}, 0, 0
    for path in paths:
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)
        except (OSError, ValueError, UnicodeDecodeError, KeyError) as e:
            bad[os.path.basename(path)] = "{}: {}".format(type(e).__name__, e)
            continue
        # GNUTranslations keeps the parsed table in ``_catalog`` and has no public way to list
        # it: keys are msgids (with "context\x04" before them) or (msgid, n) for plurals.
        for key, text in sorted(catalog._catalog.items(), key=lambda kv: repr(kv[0])):
            if isinstance(key, tuple):
                if key[1] != 0:
                    continue
                key = key[0]
            source = key.split("\x04", 1)[-1].strip()
            text = text.strip()
            if not source or not text:
                continue                      # the header (msgid "") and untranslated entries
            if "\n" in source or "\n" in text:
                multiline += 1
                continue
            source, text = tokenize(source), tokenize(text)
            if not re.search(r"[^\W\d_]", source) or not re.search(r"[^\W\d_]", text):
                no_letters += 1
                continue
            messages.setdefault(source, text)
    if bad:
        warnings.warn("{}: skipped {} of {} gettext catalogs with a bad header or encoding: {}"
                      .format(lang, len(bad), len(paths), ", ".join(sorted(bad))), stacklevel=2)
    facts = {"catalogs": len(paths) - len(bad), "catalogs_skipped": bad,
             "messages_multiline_left_out": multiline, "messages_without_letters_left_out":
             no_letters, "messages": len(messages)}
    return messages, facts


def make_gettext(out_dir, seed=0, progress=None, lang="vi", train=GETTEXT_SIZES["train"],
                 dev=GETTEXT_SIZES["dev"], test=GETTEXT_SIZES["test"], max_words=30,
                 locale_dir=LOCALE_DIR):
    """Installed gettext catalogs' English -> ``lang`` messages, IWSLT'15 layout: messages of
    at most ``max_words`` tokens on each side, drawn by ``seed``; dev and test first, so they
    keep their sizes, and training takes up to ``train`` of the rest."""
    _report(progress, "stages", 0, 3)
    messages, facts = read_catalogs(lang, locale_dir)
    _report(progress, "stages", 1, 3)
    pool = sorted((s, t) for s, t in messages.items()
                  if len(s.split()) <= max_words and len(t.split()) <= max_words)
    facts["messages_longer_than_max_words"] = len(messages) - len(pool)
    if len(pool) < dev + test + 1:
        raise DatasetError("{}: only {} usable messages in the installed catalogs, fewer than "
                           "dev {} + test {} + one for training; lower the sizes or install "
                           "more translated packages".format(lang, len(pool), dev, test))
    order = np.random.RandomState(seed).permutation(len(pool))
    picked = [pool[i] for i in order]
    pairs = {"train": picked[dev + test:dev + test + train], "dev": picked[:dev],
             "test": picked[dev:dev + test]}
    if len(pairs["train"]) < train:
        warnings.warn("{}: {} training pairs, fewer than the {} asked: the installed catalogs "
                      "hold no more".format(lang, len(pairs["train"]), train), stacklevel=2)
    _report(progress, "stages", 2, 3)
    out = _write(out_dir, pairs, lang)
    _report(progress, "stages", 3, 3)
    out.update(facts, source="gettext catalogs in {}".format(
        os.path.join(locale_dir, lang, "LC_MESSAGES")), max_words=max_words,
        train_requested=train)
    return out


MAKERS = {
    "numbers-en-vi": ("English to Vietnamese number words (num2words), IWSLT'15 layout; test "
                      "numbers disjoint from training", functools.partial(make_numbers, lang="vi")),
    "numbers-en-de": ("English to German number words (num2words), IWSLT'15 layout; test "
                      "numbers disjoint from training", functools.partial(make_numbers, lang="de")),
    "gettext-en-vi": ("English to Vietnamese user-interface messages from the installed gettext "
                      "catalogs, IWSLT'15 layout", functools.partial(make_gettext, lang="vi")),
    "gettext-en-de": ("English to German user-interface messages from the installed gettext "
                      "catalogs, IWSLT'15 layout", functools.partial(make_gettext, lang="de")),
}
