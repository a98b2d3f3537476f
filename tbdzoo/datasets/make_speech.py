"""Spoken numbers made offline by espeak-ng, in LibriSpeech layout
(tbdzoo/datasets/librispeech.py).

``spoken-numbers``: each utterance is a number (num2words' English words) spoken by espeak-ng,
resampled from its 22,050 Hz to 16 kHz (scipy's polyphase filter) and written as 16-bit mono
FLAC (soundfile) with LibriSpeech's transcripts (upper case, hyphens and commas as spaces).
A speaker is a voice: an accent (en-us, en-gb, en-gb-scotland...), a voice variant (m1..m8,
f1..f5), a speed and a pitch, all drawn from the seed. The variants are split three ways, so
the dev and test speakers speak with variants never heard in training (held-out voices), and
the numbers of the three subsets are disjoint. Subsets: ``train-clean``, ``dev-clean``,
``test-clean``; ``SPEAKERS.TXT`` at the top says who is who, as LibriSpeech's does.
"""
import io
import os
import shutil
import subprocess

import numpy as np

from .errors import DatasetError
from .librispeech import _soundfile
from .make_text import _num2words, number_splits

__all__ = ["MAKERS", "make_spoken_numbers", "speak", "ACCENTS", "VARIANTS", "SUBSETS",
           "transcript_of"]

ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan",
           "en-gb-x-gbcwmd", "en-029", "en-us-nyc")
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5")
SUBSETS = {"train": "train-clean", "dev": "dev-clean", "test": "test-clean"}
ESPEAK_RATE = 22050
SAMPLE_RATE = 16000
INSTALL = "apt-get install espeak-ng"


def transcript_of(words):
    """LibriSpeech's transcript of number words: upper case, hyphens and commas to spaces."""
    return " ".join(words.replace("-", " ").replace(",", " ").split()).upper()


def _espeak():
    path = shutil.which("espeak-ng")
    if path is None:
        raise DatasetError("spoken-numbers needs espeak-ng, which is not installed: {} (as "
                           "root)".format(INSTALL))
    return path


def _installed_variants(espeak):
    out = subprocess.run([espeak, "--voices=variant"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, check=True).stdout.decode("utf-8", "replace")
    return set(line.split()[4].split("/")[-1] for line in out.splitlines()[1:]
               if len(line.split()) >= 5)


def speak(text, voice, speed, pitch, espeak=None):
    """espeak-ng's rendering of ``text``: float32 samples at 22,050 Hz."""
    soundfile = _soundfile()
    espeak = espeak or _espeak()
    result = subprocess.run([espeak, "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout",
                             text], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if result.returncode != 0 or not result.stdout:
        raise DatasetError("espeak-ng -v {} failed on {!r}: {}".format(
            voice, text, result.stderr.decode("utf-8", "replace").strip() or "no audio"))
    audio, rate = soundfile.read(io.BytesIO(result.stdout), dtype="float32")
    if rate != ESPEAK_RATE:
        raise DatasetError("espeak-ng wrote {} Hz audio, expected {}".format(rate, ESPEAK_RATE))
    return audio


def _to_16k(audio):
    from scipy.signal import resample_poly
    # 16,000 / 22,050 = 320 / 441
    return np.clip(resample_poly(audio, 320, 441), -1.0, 1.0).astype(np.float32)


def _speakers(rng, counts):
    """{split: [(speaker id, voice, speed, pitch)]}: the variants dealt out so that no split's
    variant is heard in another; accents, speeds and pitches drawn freely."""
    variants = list(rng.permutation(VARIANTS))
    held = max(1, min(counts["dev"], counts["test"], len(VARIANTS) // 4))
    pools = {"dev": variants[:held], "test": variants[held:2 * held],
             "train": variants[2 * held:]}
    out, next_id = {}, 100
    for split in ("train", "dev", "test"):
        out[split] = []
        for k in range(counts[split]):
            variant = pools[split][k % len(pools[split])]
            accent = ACCENTS[rng.randint(len(ACCENTS))]
            out[split].append((next_id, "{}+{}".format(accent, variant),
                               int(rng.randint(130, 191)), int(rng.randint(30, 71))))
            next_id += 1
    return out


def make_spoken_numbers(out_dir, seed=0, progress=None, train_speakers=6, dev_speakers=2,
                        test_speakers=2, chapters=2, utterances=8, largest=9999):
    """Numbers spoken by espeak-ng voices in LibriSpeech layout (module docstring): each
    speaker reads ``chapters`` chapters of ``utterances`` numbers in [0, largest]."""
    soundfile, num2words, espeak = _soundfile(), _num2words(), _espeak()
    counts = {"train": train_speakers, "dev": dev_speakers, "test": test_speakers}
    if min(counts.values()) < 1 or not 1 <= chapters <= 999 or utterances < 1:
        raise DatasetError("every subset needs a speaker, each speaker 1 to 999 chapters and "
                           "an utterance in each: got speakers {}, chapters {}, utterances {}"
                           .format(counts, chapters, utterances))
    rng = np.random.RandomState(seed)
    speakers = _speakers(rng, counts)
    missing = set(v.split("+")[1] for s in speakers.values() for _, v, _, _ in s) \
        - _installed_variants(espeak)
    if missing:
        raise DatasetError("espeak-ng lacks the voice variants {}; reinstall it: {}".format(
            ", ".join(sorted(missing)), INSTALL))
    per_speaker = chapters * utterances
    numbers = number_splits(seed, {s: counts[s] * per_speaker for s in counts}, largest)
    total, done, seconds = sum(counts.values()) * per_speaker, 0, {}
    lines = []
    for split in ("train", "dev", "test"):
        subset, seconds[split] = SUBSETS[split], 0.0
        for k, (speaker, voice, speed, pitch) in enumerate(speakers[split]):
            start, spoken = k * per_speaker, 0.0
            for c in range(chapters):
                chapter = speaker * 1000 + c          # unique across speakers, as LibriSpeech's
                folder = os.path.join(out_dir, subset, str(speaker), str(chapter))
                os.makedirs(folder)
                trans = []
                for u in range(utterances):
                    words = num2words(numbers[split][start + c * utterances + u], lang="en")
                    audio = _to_16k(speak(words, voice, speed, pitch, espeak))
                    utt_id = "{}-{}-{:04d}".format(speaker, chapter, u)
                    soundfile.write(os.path.join(folder, utt_id + ".flac"), audio, SAMPLE_RATE,
                                    subtype="PCM_16", format="FLAC")
                    trans.append("{} {}\n".format(utt_id, transcript_of(words)))
                    spoken += len(audio) / float(SAMPLE_RATE)
                    done += 1
                    if progress is not None:
                        progress("utterances", done, total)
                with open(os.path.join(folder, "{}-{}.trans.txt".format(speaker, chapter)),
                          "w") as f:
                    f.write("".join(trans))
            seconds[split] += spoken
            lines.append("{:<5}| {} | {:<12}| {:.2f} | {} speed {} pitch {}".format(
                speaker, "F" if "+f" in voice else "M", subset, spoken / 60.0, voice, speed,
                pitch))
    with open(os.path.join(out_dir, "SPEAKERS.TXT"), "w") as f:
        f.write("; espeak-ng voices (accent+variant), speed (words a minute) and pitch (0-99)\n"
                "; ID  | SEX | SUBSET      | MINUTES | VOICE\n" + "\n".join(lines) + "\n")
    return {"layout": "LibriSpeech", "sample_rate": SAMPLE_RATE, "format": "FLAC, 16-bit mono",
            "subsets": {SUBSETS[s]: {"speakers": counts[s], "utterances": counts[s] *
                                     per_speaker, "seconds": round(seconds[s], 2)}
                        for s in counts},
            "voices": {SUBSETS[s]: sorted(set(v for _, v, _, _ in speakers[s])) for s in counts},
            "held_out_variants": sorted(set(v.split("+")[1] for s in ("dev", "test")
                                            for _, v, _, _ in speakers[s])),
            "largest_number": largest,
            "source": "espeak-ng speaking num2words' English numbers"}


MAKERS = {
    "spoken-numbers": ("English numbers spoken by espeak-ng voices, LibriSpeech layout (16 kHz "
                       "FLAC); dev and test voices held out from training", make_spoken_numbers),
}
