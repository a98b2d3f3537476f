"""Spoken numbers made by espeak-ng in LibriSpeech layout and read back: the layout, 16 kHz
FLAC, held-out voices and seeds; every broken file refused by name; Deep Speech 2's batches
from the real front-end, which train on torch."""
import os
import shutil

import numpy as np
import pytest

import tbdzoo
from tbdzoo.datasets import DatasetError, make_speech, spectrogram
from tbdzoo.datasets.librispeech import ALPHABET, LibriSpeech, labels_text, make_batch, transcript_labels
from tbdzoo.models import deepspeech2

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None,
    reason="espeak-ng is not installed: apt-get install espeak-ng")
SMALL = dict(train_speakers=2, dev_speakers=1, test_speakers=1, chapters=1, utterances=3,
             largest=99)
# Deep Speech 2's tiny network on 8 kHz audio (81 bins) and up to 2.5 s utterances.
HP = dict(deepspeech2.TINY, sample_rate=8000, max_frames=250)


def files(folder):
    out = {}
    for base, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(base, name), "rb") as f:
                out[os.path.relpath(os.path.join(base, name), folder)] = f.read()
    return out


@pytest.fixture(scope="module")
def spoken(tmp_path_factory):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed: apt-get install espeak-ng")
    folder = str(tmp_path_factory.mktemp("speech") / "spoken")
    return folder, make_speech.make_spoken_numbers(folder, 5, None, **SMALL)


def copy(spoken, tmp_path):
    target = str(tmp_path / "copy")
    shutil.copytree(spoken[0], target)
    return target


def chapter_of(root, subset="train-clean"):
    speaker = sorted(os.listdir(os.path.join(root, subset)))[0]
    chapter = sorted(os.listdir(os.path.join(root, subset, speaker)))[0]
    return os.path.join(root, subset, speaker, chapter), "{}-{}".format(speaker, chapter)


# --- the maker ------------------------------------------------------------------------------

@needs_espeak
def test_layout_flac_and_transcripts(spoken):
    import soundfile
    from num2words import num2words
    root, facts = spoken
    assert sorted(os.listdir(root)) == ["SPEAKERS.TXT", "dev-clean", "test-clean", "train-clean"]
    assert facts["subsets"]["train-clean"]["utterances"] == 6
    data = LibriSpeech(root, "train-clean")
    assert len(data) == 6 and len(data.speakers) == 2
    words = {make_speech.transcript_of(num2words(n, lang="en")) for n in range(100)}
    for utt in data:
        assert os.path.basename(utt.path) == utt.id + ".flac"
        assert utt.id.startswith("{}-{}-".format(utt.speaker, utt.chapter))
        assert utt.transcript in words and utt.transcript == utt.transcript.upper()
        assert labels_text(utt.labels) == utt.transcript.lower()
        info = soundfile.info(utt.path)
        assert (info.samplerate, info.channels, info.format, info.subtype) == \
            (16000, 1, "FLAC", "PCM_16")
        assert 0.3 < info.duration < 3.0
        audio = data.audio(0)
        assert audio.dtype == np.float32 and 0.05 < np.abs(audio).max() <= 1.0


@needs_espeak
def test_dev_and_test_voices_are_held_out_and_numbers_disjoint(spoken):
    root, facts = spoken
    voices = facts["voices"]
    train_variants = {v.split("+")[1] for v in voices["train-clean"]}
    for subset in ("dev-clean", "test-clean"):
        assert not {v.split("+")[1] for v in voices[subset]} & train_variants
    with open(os.path.join(root, "SPEAKERS.TXT")) as f:
        lines = [l for l in f if not l.startswith(";")]
    assert len(lines) == 4 and all(voice in "".join(lines) for v in voices.values()
                                   for voice in v)
    said = {s: {u.transcript for u in LibriSpeech(root, s)} for s in make_speech.SUBSETS.values()}
    assert not said["train-clean"] & (said["dev-clean"] | said["test-clean"])


@needs_espeak
def test_the_data_depends_on_the_seed_alone(spoken, tmp_path):
    root, _ = spoken
    make_speech.make_spoken_numbers(str(tmp_path / "again"), 5, None, **SMALL)
    assert files(str(tmp_path / "again")) == files(root)
    calls = []
    make_speech.make_spoken_numbers(str(tmp_path / "other"), 6,
                                    lambda what, done, total: calls.append((done, total)), **SMALL)
    assert calls == [(k, 12) for k in range(1, 13)]
    assert len(LibriSpeech(str(tmp_path / "other"), "test-clean")) == 3
    assert files(str(tmp_path / "other"))["SPEAKERS.TXT"] != files(root)["SPEAKERS.TXT"]


def test_a_missing_espeak_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(make_speech.shutil, "which", lambda name: None)
    with pytest.raises(DatasetError, match="espeak-ng, which is not installed: apt-get install "
                                           "espeak-ng"):
        make_speech.make_spoken_numbers(str(tmp_path / "x"), 0, None)


# --- the reader names what is wrong ---------------------------------------------------------

def test_transcripts_outside_the_alphabet_are_named():
    assert "".join(ALPHABET) == deepspeech2.ALPHABET
    assert list(transcript_labels("IT'S  A b")) == [11, 22, 2, 21, 1, 3, 1, 4]
    with pytest.raises(DatasetError, match=r"here: character '7' \(U\+0037\) at position 4"):
        transcript_labels("ON 7 DAYS", "here")


@needs_espeak
@pytest.mark.parametrize("damage,message", [
    ("delete flac", r"{chapter}/{stem}-0001.flac: missing, but .*{stem}.trans.txt line 2 "
                    r"transcribes it"),
    ("extra flac", r"{chapter}/{stem}-0099.flac: no transcript for it in .*{stem}.trans.txt"),
    ("delete trans", r"{chapter}/{stem}.trans.txt: missing"),
    ("bad id", r"{stem}.trans.txt, line 2: '1-2-3' is not an utterance id of this chapter"),
    ("digit", r"{stem}.trans.txt, line 3: character '9' \(U\+0039\) at position \d+"),
    ("no transcript", r"{stem}.trans.txt, line 1: {stem}-0000 has no transcript"),
    ("repeated", r"{stem}.trans.txt, line 4: {stem}-0000 is listed again \(first on line 1\)"),
    ("not audio", r"{chapter}/{stem}-0002.flac: not readable audio"),
    ("stereo", r"{chapter}/{stem}-0002.flac: 2 channels; LibriSpeech's utterances are mono"),
    ("stray file", r"{chapter}/notes.txt: unexpected file"),
    ("stray folder", r"train-clean/extra: not a speaker folder"),
])
def test_broken_files_are_named(spoken, tmp_path, damage, message):
    import soundfile
    root = copy(spoken, tmp_path)
    chapter, stem = chapter_of(root)
    trans = os.path.join(chapter, stem + ".trans.txt")
    with open(trans) as f:
        lines = f.read().splitlines()
    if damage == "delete flac":
        os.remove(os.path.join(chapter, stem + "-0001.flac"))
    elif damage == "extra flac":
        shutil.copy(os.path.join(chapter, stem + "-0001.flac"),
                    os.path.join(chapter, stem + "-0099.flac"))
    elif damage == "delete trans":
        os.remove(trans)
    elif damage == "not audio":
        with open(os.path.join(chapter, stem + "-0002.flac"), "wb") as f:
            f.write(b"fLaC but not really")
    elif damage == "stereo":
        soundfile.write(os.path.join(chapter, stem + "-0002.flac"), np.zeros((800, 2)), 16000)
    elif damage == "stray file":
        open(os.path.join(chapter, "notes.txt"), "w").close()
    elif damage == "stray folder":
        os.makedirs(os.path.join(root, "train-clean", "extra"))
    else:
        if damage == "bad id":
            lines[1] = "1-2-3 " + lines[1].split(" ", 1)[1]
        elif damage == "digit":
            lines[2] = lines[2] + " 9"
        elif damage == "no transcript":
            lines[0] = lines[0].split(" ", 1)[0]
        elif damage == "repeated":
            lines.append(lines[0])
        with open(trans, "w") as f:
            f.write("\n".join(lines) + "\n")
    pattern = message.format(chapter=chapter.replace(root + os.sep, ".*"), stem=stem)
    with pytest.raises(DatasetError, match=pattern):
        LibriSpeech(root, "train-clean")


def test_an_unknown_subset_lists_the_present_ones(tmp_path):
    (tmp_path / "dev-clean").mkdir()
    with pytest.raises(DatasetError, match=r"train-clean-100: no such subset folder; folders in "
                                           r".*: dev-clean"):
        LibriSpeech(str(tmp_path))


# --- Deep Speech 2's batches ----------------------------------------------------------------

@needs_espeak
def test_batches_are_the_models_inputs_from_the_real_front_end(spoken):
    root, _ = spoken
    data = LibriSpeech(root, "train-clean")
    batches = list(data.batches(HP, deepspeech2, 4, seed=1))
    assert [len(b["labels"]) for b in batches] == [4, 2]
    for batch in batches:
        deepspeech2.check_batch(HP, batch)
        assert batch["spectrogram"].shape[1:] == (250, 81)
        assert batch["labels"].shape[1] == deepspeech2.max_label_length(HP)
    first = np.random.RandomState(1).permutation(6)[0]
    spect = spectrogram.spectrogram(data.audio(first, 8000), 8000)
    n = batches[0]["spectrogram_lengths"][0]
    assert n == len(spect) == data.frames(first, HP)
    np.testing.assert_array_equal(batches[0]["spectrogram"][0, :n], spect)
    assert (batches[0]["spectrogram"][0, n:] == 0).all()
    assert labels_text(batches[0]["labels"][0]) == data[first].transcript.lower()


@needs_espeak
def test_utterances_longer_than_the_config_are_named_or_skipped(spoken):
    root, _ = spoken
    data = LibriSpeech(root, "train-clean")
    longest = max(range(len(data)), key=lambda i: data.frames(i, HP))
    short = dict(HP, max_frames=data.frames(longest, HP) - 1)
    with pytest.raises(DatasetError, match=r"{}.flac: \d+ frames, more than max_frames".format(
            data[longest].id)):
        list(data.batches(short, deepspeech2, 4))
    with pytest.warns(UserWarning, match=r"left out \d of 6 utterances"):
        kept = data.fitting(short, deepspeech2, too_long="skip")
    assert longest not in kept and len(kept) >= 1
    with pytest.raises(DatasetError, match="num_classes is 30"):
        data.fitting(dict(HP, num_classes=30), deepspeech2)


@needs_espeak
def test_deep_speech_2_trains_on_the_spoken_numbers(spoken):
    root, _ = spoken
    data = LibriSpeech(root, "train-clean")
    model = tbdzoo.build("deepspeech2", backend="torch", config="tiny", sample_rate=8000,
                         max_frames=250)
    batch = next(data.batches(model.hparams, deepspeech2, 3, seed=0))
    assert set(batch) == set(model.synthetic_batch(seed=0))
    losses = [model.train_step(batch) for _ in range(4)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert make_batch(model.hparams, deepspeech2, [], [])["spectrogram"].shape == (0, 250, 81)
