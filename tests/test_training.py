"""tbdzoo.training and `tbd train`: a tiny proxy reaching a low, honest target in seconds, the
record's fields, the MLPerf lines, the errors, and another backend reaching it in about the
same number of steps."""
import json
import os
import pathlib

import pytest

from conftest import require_backend
from tbdzoo.cli import main
from tbdzoo.datasets.makers import make
from tbdzoo.training import TrainingError, parse_target, train_to_target
from tbdzoo.training.mllog import TrainingMllog

# Ten classes, so chance is 0.1: 0.4 top-1 on the held-out split is learnt, not guessed.
TARGET = "top1=0.4"
FAST = {"max_minutes": 2.0, "eval_every": 10, "max_steps": 200}


@pytest.fixture(scope="module")
def fm32(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "fm32")
    make("fashion-mnist-imagenet", out, seed=0,
         options={"size": 32, "train_per_class": 40, "val_per_class": 10})
    return out


@pytest.fixture(scope="module")
def torch_run(fm32, tmp_path_factory, one_torch_thread):
    log = str(tmp_path_factory.mktemp("mllog") / "mllog.txt")
    result = train_to_target("resnet50", "torch", fm32, TARGET, seed=0,
                             mllog=TrainingMllog(log), **FAST)
    return result, log


def test_torch_proxy_reaches_target(torch_run):
    result, log = torch_run
    assert result.reached and result.steps % 10 == 0 and result.steps <= 200
    record = result.record()
    for key in ("model", "backend", "seed", "dataset", "metric", "target", "reached", "steps",
                "seconds", "eval_seconds", "history", "pipeline", "hparams"):
        assert key in record, key
    assert record["metric"] == "top1" and record["target"] == 0.4
    assert record["dataset"].startswith("fashion-mnist-imagenet[")
    assert record["history"][-1]["value"] >= 0.4
    assert all(a["value"] < 0.4 for a in record["history"][:-1])
    assert record["seconds"] > 0 and record["eval_seconds"] > 0
    json.dumps(record)
    lines = [json.loads(l.split(":::MLLOG ", 1)[1])
             for l in pathlib.Path(log).read_text().splitlines() if ":::MLLOG" in l]
    keys = [l["key"] for l in lines]
    assert keys[0] == "submission_benchmark" and "run_start" in keys
    assert keys.count("eval_accuracy") == len(record["history"])
    assert lines[-1]["key"] == "run_stop" and lines[-1]["metadata"]["status"] == "success"


@pytest.mark.parametrize("backend", ["mxnet"])
def test_another_backend_takes_about_the_same_steps(fm32, torch_run, backend):
    require_backend(backend)
    other = train_to_target("resnet50", backend, fm32, TARGET, seed=0, **FAST)
    assert other.reached
    # Same initial weights, example order and crops; the pixels (each framework's decoder and
    # resizer) and the rounding differ, so the steps may differ by an evaluation or three.
    steps = torch_run[0].steps
    assert abs(other.steps - steps) <= 30, (steps, other.steps)


def test_a3c_reaches_a_low_return(tmp_path, one_torch_thread):
    out = str(tmp_path / "runs.jsonl")
    assert main(["train", "a3c", "--backend", "torch", "--target", "return=25",
                 "--max-minutes", "2", "--eval-every", "5", "-o", out]) == 0
    record = json.loads(pathlib.Path(out).read_text().splitlines()[-1])
    assert record["reached"] and record["metric"] == "return" and record["dataset"] == "CartPole-v1"
    assert record["steps"] >= 1 and record["eval_seconds"] == 0.0


def test_cli_appends_records(fm32, tmp_path, capsys, one_torch_thread):
    out = str(tmp_path / "runs.jsonl")
    args = ["train", "resnet50", "--backend", "torch", "--data", fm32, "--target", "top1=0.2",
            "--eval-every", "10", "--max-steps", "100", "-o", out]
    assert main(args) == 0
    assert main(args + ["--seed", "1"]) == 0
    records = [json.loads(l) for l in pathlib.Path(out).read_text().splitlines()]
    assert [r["seed"] for r in records] == [0, 1]
    assert "reached at step" in capsys.readouterr().out


def test_unknown_metric_lists_the_models_metrics():
    with pytest.raises(TrainingError, match="bleu is not a metric of resnet50; its metrics: top1"):
        parse_target("resnet50", "bleu=20")


def test_target_out_of_range():
    with pytest.raises(TrainingError, match="out of range"):
        parse_target("resnet50", "top1=1.5")
    with pytest.raises(TrainingError, match="METRIC=VALUE"):
        parse_target("a3c", "475")


def test_an_unknown_model_lists_the_models_with_a_task():
    with pytest.raises(TrainingError, match="unknown model 'resnet'; tbd train trains a3c, "
                                            "deepspeech2, faster_rcnn, inception_v3, resnet50, "
                                            "seq2seq, transformer, wgan"):
        parse_target("resnet", "top1=0.5")


def test_wrong_layout_names_the_layout_and_the_maker(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    code = main(["train", "resnet50", "--backend", "torch", "--data", str(tmp_path),
                 "-o", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2
    assert "DIR/train/<synset>/*.JPEG" in err and "tbd data make fashion-mnist-imagenet" in err
    assert not os.path.exists(str(tmp_path / "r.jsonl"))


@pytest.mark.parametrize("model,layout,maker", [
    ("resnet50", "DIR/train/<synset>/*.JPEG", "fashion-mnist-imagenet"),
    ("seq2seq", "DIR/train.en", "numbers-en-vi"),
    ("deepspeech2", "*.flac", "spoken-numbers"),
    ("faster_rcnn", "DIR/VOC2007/Annotations/<id>.xml", "voc-composed"),
    ("wgan", "DIR/train_64x64/*.png", "fashion-mnist-64")])
def test_no_data_folder_names_the_model_its_layout_and_maker(tmp_path, capsys, model, layout,
                                                             maker):
    code = main(["train", model, "--backend", "torch", "-o", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2
    assert "{} trains from a data folder (--data DIR)".format(model) in err
    assert layout in err and "tbd data make " + maker in err
    assert not os.path.exists(str(tmp_path / "r.jsonl"))


def test_cli_refuses_an_unknown_metric_before_building(capsys):
    assert main(["train", "resnet50", "--backend", "torch", "--target", "wer=0.1"]) == 2
    assert "its metrics: top1" in capsys.readouterr().err


@pytest.fixture(scope="module")
def numbers(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("text") / "numbers")
    make("numbers-en-vi", out, seed=0, options={"train": 600, "dev": 50, "test": 100})
    return out


@pytest.mark.parametrize("model", ["seq2seq", "transformer"])
def test_translation_proxy_reaches_a_token_accuracy(numbers, one_torch_thread, model):
    result = train_to_target(model, "torch", numbers, "token_accuracy=0.3", seed=0,
                             max_minutes=2.0, eval_every=25, max_steps=300)
    assert result.reached, result.history
    assert result.record()["examples"] == {"train": 600, "test": 100}
    with pytest.raises(TrainingError, match="its metrics: token_accuracy.*exact_match.*bleu"):
        parse_target(model, "cer=0.2")
    with pytest.raises(TrainingError, match="out of range: bleu takes a value above 0 and at "
                                            "most 100"):
        parse_target(model, "bleu=120")


def test_translation_folder_of_the_wrong_layout(fm32):
    with pytest.raises(TrainingError, match="tbd data make numbers-en-vi"):
        train_to_target("seq2seq", "torch", fm32, "token_accuracy=0.5")


def test_greedy_ctc_and_edit_distance():
    from tbdzoo.training.speech_task import edit_distance, greedy_ctc
    assert greedy_ctc([0, 5, 5, 0, 5, 1, 1, 7, 0], 9) == [5, 5, 1, 7]
    assert greedy_ctc([5, 5, 6], 1) == [5]
    assert edit_distance("kitten", "sitting") == 3 and edit_distance([], [1, 2]) == 2


@pytest.fixture(scope="module")
def spoken(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("speech") / "spoken")
    make("spoken-numbers", out, seed=0, options={"utterances": 2, "chapters": 2})
    return out


def test_speech_task_scores_cer_and_wer(spoken, one_torch_thread):
    result = train_to_target("deepspeech2", "torch", spoken, "cer=0.01", seed=0,
                             eval_every=1, max_steps=1, overrides={"batch_size": 4})
    assert not result.reached and result.stop_reason == "max_steps (1) ran out"
    cer = result.history[-1]["value"]
    assert 0.0 <= cer <= 2.0
    assert result.record()["examples"]["train"] >= 4
    with pytest.raises(TrainingError, match="met before any training"):
        parse_target("deepspeech2", "cer=1")
    with pytest.raises(TrainingError, match="its metrics: cer .*wer"):
        parse_target("deepspeech2", "top1=0.5")


def test_speech_folder_of_the_wrong_layout(fm32):
    with pytest.raises(TrainingError, match="tbd data make spoken-numbers"):
        train_to_target("deepspeech2", "torch", fm32, "cer=0.5")


def test_inception_proxy_trains_at_75_pixels_from_any_image_size(fm32, one_torch_thread):
    """The proxy's 75-pixel input (no auxiliary head) from 32-pixel images: the pipeline
    resizes them, so the image models share one data set; ten steps and one evaluation."""
    result = train_to_target("inception_v3", "torch", fm32, "top1=0.99", seed=0, max_steps=10,
                             eval_every=10, max_minutes=2.0)
    record = result.record()
    assert (record["hparams"]["image_size"], record["hparams"]["aux_head"]) == (75, False)
    assert record["steps_run"] == 10 and len(record["losses"]) == 10
    assert all(0.0 < loss < 10.0 for loss in record["losses"])
    assert [h["step"] for h in record["history"]] == [10]
    assert 0.0 <= record["history"][0]["value"] <= 1.0
