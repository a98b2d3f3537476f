"""Greedy decoding of the translation models (tbdzoo/training/decoding.py) and its metrics.

Greedy decoding writes a sentence exactly when every teacher-forced position of it is right
(the fed-back words are then the reference's), so ``exact_match`` must equal the teacher-forced
``sentence_accuracy`` on any model; and with the same weights two backends decode the same
words."""
import numpy as np
import pytest

from conftest import require_backend
from tbdzoo.datasets.makers import make
from tbdzoo.training import train_to_target
from tbdzoo.training.decoding import greedy_decode
from tbdzoo.training.loop import build_proxy
from tbdzoo.training.translation_task import TranslationTask


@pytest.fixture(scope="module")
def numbers(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("text") / "numbers")
    make("numbers-en-vi", out, seed=0, options={"train": 600, "dev": 50, "test": 100})
    return out


@pytest.fixture(scope="module")
def trained(numbers, one_torch_thread):
    """The Transformer's proxy on PyTorch after 400 steps: some held-out sentences right."""
    model = build_proxy("transformer", "torch", 0, None)
    train_to_target(model, data_dir=numbers, target="sentence_accuracy=0.99", max_steps=400,
                    eval_every=400)
    return model


def test_exact_match_is_the_teacher_forced_sentence_accuracy(numbers, trained):
    scores = TranslationTask(trained, numbers).evaluate()
    assert 0.0 < scores["sentence_accuracy"] < 1.0, scores
    assert scores["exact_match"] == scores["sentence_accuracy"]
    assert 0.0 < scores["bleu"] < 100.0
    only = TranslationTask(trained, numbers).evaluate(("bleu",))
    assert set(only) == {"exact_match", "bleu"} and only["bleu"] == scores["bleu"]


def test_bleu_is_sacrebleus_on_the_decoded_words(numbers, trained):
    import sacrebleu
    task = TranslationTask(trained, numbers)
    decoded = []
    for batch in task._held_out:
        decoded.extend(greedy_decode(trained, batch, trained.hparams))
    # each decoded id feeds back: predicting on [BOS] + the words so far gives the next one
    batch = task._held_out[0]
    rows = decoded[:len(batch["src"])]
    length = trained.hparams["tgt_len"]
    tgt_in = np.zeros((len(rows), length), np.int32)
    for r, ids in enumerate(rows):
        written = [trained.hparams["bos_id"]] + ids[:length - 1]
        tgt_in[r, :len(written)] = written
    guess = np.argmax(np.asarray(trained.predict(dict(batch, tgt_in=tgt_in))), axis=-1)
    for r, ids in enumerate(rows):
        assert list(guess[r, :len(ids)]) == ids
    hypotheses = [" ".join(task._words.get(i, "<unk>") for i in ids) for ids in decoded]
    references = task._references
    want = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none").score
    assert task.evaluate(("bleu",))["bleu"] == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("backend", ["tensorflow", "mxnet", "cntk"])
def test_another_backend_decodes_the_same_words(numbers, trained, backend):
    require_backend(backend)
    other = build_proxy("transformer", backend, 0, None)
    other.set_weights(trained.get_weights())
    batch = TranslationTask(trained, numbers)._held_out[0]
    assert greedy_decode(other, batch, other.hparams) == \
        greedy_decode(trained, batch, trained.hparams)
