"""Deep Speech 2's front-end: audio samples to a normalised log-magnitude spectrogram.

What deepspeech.pytorch's loader computes, in NumPy and SciPy: a short-time Fourier transform
with a symmetric Hamming window of ``window_ms`` (20 ms), hop ``hop_ms`` (10 ms), ``n_fft`` = the
window's length in samples (320 at 16 kHz, so 161 frequency bins), frames centred on
``t * hop`` (the signal is padded by ``n_fft // 2`` on each side by reflection), then
``log(1 + |STFT|)``, then the utterance's own mean subtracted and its standard deviation
(unbiased, over every bin of every frame) divided out.

librosa (which deepspeech.pytorch calls) is not one of the environments' dependencies, and
it would bring numba and llvmlite into both of them for one transform; NumPy's FFT and SciPy's
window are the same arithmetic. The padding is by reflection, librosa's default when
deepspeech.pytorch was written (librosa 0.10 changed it to zeros). Valid Python 3.6
and NumPy 1.19: the CNTK worker makes synthetic batches too.
"""
import numpy as np

SAMPLE_RATE = 16000    # Hz: LibriSpeech's rate
WINDOW_MS = 20.0       # Deep Speech 2's window
HOP_MS = 10.0          # and hop: one frame is 10 ms of audio


def window_samples(sample_rate=SAMPLE_RATE, window_ms=WINDOW_MS):
    """n_fft: the window's length in samples (320 at 16 kHz and 20 ms)."""
    return int(round(sample_rate * window_ms / 1000.0))


def hop_samples(sample_rate=SAMPLE_RATE, hop_ms=HOP_MS):
    return int(round(sample_rate * hop_ms / 1000.0))


def num_bins(sample_rate=SAMPLE_RATE, window_ms=WINDOW_MS):
    """Frequency bins of the one-sided spectrum: n_fft // 2 + 1 (161 at 16 kHz and 20 ms)."""
    return window_samples(sample_rate, window_ms) // 2 + 1


def num_frames(samples, sample_rate=SAMPLE_RATE, hop_ms=HOP_MS):
    """Frames of a centred STFT of ``samples`` samples: 1 + samples // hop."""
    return 1 + int(samples) // hop_samples(sample_rate, hop_ms)


def hamming(n):
    """The symmetric Hamming window (scipy.signal.hamming's default, which deepspeech.pytorch
    hands to librosa): 0.54 - 0.46 cos(2 pi k / (n - 1))."""
    from scipy.signal import get_window
    return get_window("hamming", n, fftbins=False)


def magnitude(audio, sample_rate=SAMPLE_RATE, window_ms=WINDOW_MS, hop_ms=HOP_MS):
    """|STFT| of one utterance: (frames, bins), float64."""
    audio = np.asarray(audio, dtype=np.float64)
    if audio.ndim != 1:
        raise ValueError("audio must be one channel of samples (a 1-D array), got shape {}"
                         .format(audio.shape))
    n_fft = window_samples(sample_rate, window_ms)
    hop = hop_samples(sample_rate, hop_ms)
    pad = n_fft // 2
    if len(audio) <= pad:
        raise ValueError("an utterance of {} samples is too short for a {}-sample window; it "
                         "needs more than {}".format(len(audio), n_fft, pad))
    padded = np.pad(audio, pad, mode="reflect")
    frames = 1 + (len(padded) - n_fft) // hop
    stride = padded.strides[0]
    windows = np.lib.stride_tricks.as_strided(padded, (frames, n_fft), (hop * stride, stride),
                                              writeable=False)
    return np.abs(np.fft.rfft(windows * hamming(n_fft), axis=1))


def spectrogram(audio, sample_rate=SAMPLE_RATE, window_ms=WINDOW_MS, hop_ms=HOP_MS,
                normalize=True):
    """The network's input for one utterance: (frames, bins) float32, log(1 + |STFT|),
    normalised by the utterance's own mean and (unbiased) standard deviation."""
    spect = np.log1p(magnitude(audio, sample_rate, window_ms, hop_ms))
    if normalize:
        std = spect.std(ddof=1)
        spect = (spect - spect.mean()) / (std if std > 0 else 1.0)
    return spect.astype(np.float32)
