"""Data-parallel runs fed from a data folder: `tbd run --data DIR --nproc N` (each rank reads
its share through its framework's pipeline; the record sums the ranks) and `tbd train --nproc N`
(each rank trains on its share, rank 0 evaluates and the stop reaches every rank).
docs/distributed.md, "Data-fed runs" and "Training to a target"; docs/training.md."""
import json

import numpy as np
import pytest

from conftest import require_framework
from image_folders import make_folder

require_framework("torch")

FAST = dict(rank_timeout=60.0, step_timeout=300.0)
SIZE = 32


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """12 training and 6 held-out images of 3 classes."""
    return make_folder(str(tmp_path_factory.mktemp("images")), per_class=4, val_per_class=2)


# -- tbd run --data --nproc -------------------------------------------------------------------
def test_tbd_run_with_data_and_two_processes_sums_the_ranks(images, tmp_path):
    from tbdzoo.cli import main
    out = tmp_path / "r.jsonl"
    code = main(["run", "resnet50", "--backend", "torch", "--config", "tiny", "--set",
                 "image_size={}".format(SIZE), "--set", "num_classes=3", "--batch-size", "2",
                 "--nproc", "2", "--data", images, "--data-workers", "1", "--warmup", "1",
                 "--steps", "2", "--repeats", "2", "--rank-timeout", "60", "-o", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["status"] == "ok" and record["distributed"]["world_size"] == 2
    fed = record["data"]
    assert fed["world_size"] == 2 and fed["per_replica_batch"] == 2
    assert fed["throughput"]["items_per_step"] == 4
    ranks = fed["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["share_examples"] for r in ranks] == [6, 6]   # 12 images, half an epoch each
    assert fed["throughput"]["value"] == pytest.approx(sum(r["throughput"] for r in ranks))
    assert fed["input_wait_fraction"] == max(r["input_wait_fraction"] for r in ranks)
    assert fed["cpu"]["process_trees"] == 2 and fed["cpu"]["process_tree_cores_busy"] == \
        pytest.approx(sum(r["process_tree_cores_busy"] for r in ranks))
    assert all(r["process_tree_cores_busy"] > 0 for r in ranks)
    assert fed["vs_synthetic"] == pytest.approx(
        fed["throughput"]["value"] / record["throughput"]["value"])
    assert fed["losses"] and all(np.isfinite(fed["losses"]))


def test_data_with_several_processes_is_refused_on_cntk_by_name(images):
    from tbdzoo.cli import UsageError, check_data, parser
    args = parser().parse_args(["run", "resnet50", "--backend", "cntk", "--nproc", "2",
                                "--data", images])
    with pytest.raises(UsageError, match="no Pillow"):
        check_data(args, {})


# -- tbd train --nproc ------------------------------------------------------------------------
PROXY = {"num_classes": 3, "image_size": SIZE}
# At the proxy's lr 0.1 four images a step amplify rounding: the second losses part by 1.5e-5.
SMOOTH = {"lr": 0.01}


def test_two_ranks_at_a_global_batch_train_to_a_target_like_one_process(images, one_torch_thread):
    """PyTorch, --bn-mode sync: the two ranks' k-th batches hold one process's k-th batch, so
    the global loss of each step is one process's at that batch. The one process runs one
    intra-op thread, as each rank does. Two steps: the proxy at 32
    pixels is ill-conditioned (BatchNorm over 4 values a channel at its last stage), and
    from the third step on rounding alone parts runs, as it parts one process on 1 and 2
    threads (docs/distributed.md, "Training to a target")."""
    from tbdzoo.training import train_to_target
    common = dict(target="top1=0.99", seed=0, eval_every=1, max_steps=2)
    one = train_to_target("resnet50", "torch", images, overrides=dict(PROXY, batch_size=4,
                                                                      **SMOOTH),
                          **common).record()
    two = train_to_target("resnet50", "torch", images, overrides=dict(PROXY, batch_size=2,
                                                                      **SMOOTH),
                          nproc=2, bn_mode="sync", **dict(common, **FAST)).record()
    d = two["distributed"]
    assert (d["world_size"], d["per_replica_batch"], d["global_batch"]) == (2, 2, 4)
    assert (d["engine"], d["bn_mode"]) == ("DistributedDataParallel", "sync")
    assert "broadcast" in d["stop"] and two["batch_size"] == 4 == one["batch_size"]
    assert two["steps_run"] == 2 and two["stop_reason"] == "max_steps (2) ran out"
    assert [h["step"] for h in two["history"]] == [1, 2]
    assert all(0.0 <= h["value"] <= 1.0 for h in two["history"])
    # The first step's loss is one process's to float rounding; the second's reads weights
    # one update later through BatchNorm over 4 values a channel, which amplifies the
    # different summation order of synchronised statistics (2.4e-5 seen; a wrong shard or
    # global batch moves it by 1e-2 or more).
    np.testing.assert_allclose(two["losses"][0], one["losses"][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two["losses"][1], one["losses"][1], rtol=1e-4)
    assert two["losses"][0] > 0.5  # ln 3 at the start: a real loss, not a placeholder


@pytest.fixture(scope="module")
def numbers(tmp_path_factory):
    from tbdzoo.datasets.makers import make
    out = str(tmp_path_factory.mktemp("text") / "numbers")
    make("numbers-en-vi", out, seed=0, options={"train": 200, "dev": 20, "test": 40})
    return out


EXACT = ("--set", "dropout=0", "--set", "attention_dropout=0", "--set", "label_smoothing=0")


@pytest.mark.parametrize("backend", ["mxnet"])
def test_the_stop_at_the_target_reaches_every_rank(numbers, tmp_path, backend):
    """The Transformer on MXNet: rank 0 meets a low target and every rank stops at that step
    (the launcher refuses ranks that stop at different steps); only rank 0 writes MLPerf
    lines. Each rank trains on its slice of the global batch weighted by its target tokens,
    so the global losses are one process's at the global batch."""
    require_framework(backend)
    from tbdzoo.cli import main
    from tbdzoo.training import train_to_target
    out, mllog = tmp_path / "t.jsonl", tmp_path / "t.mllog"
    code = main(["train", "transformer", "--backend", backend, "--data", numbers, "--target",
                 "token_accuracy=0.02", "--eval-every", "2", "--max-steps", "40", "--set",
                 "batch_size=4"] + list(EXACT) + ["--nproc", "2", "--rank-timeout", "60",
                                                   "--mllog", str(mllog), "-o", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    d = record["distributed"]
    history = record["history"]
    assert record["reached"] and record["steps"] == record["steps_run"] == history[-1]["step"]
    assert record["steps_run"] < 40 and [h["step"] for h in history] == list(
        range(2, record["steps_run"] + 1, 2))
    assert history[-1]["value"] >= 0.02 and all(h["value"] < 0.02 for h in history[:-1])
    assert record["stop_reason"] == "target reached" and d["world_size"] == 2
    assert (d["per_replica_batch"], d["global_batch"], record["batch_size"]) == (4, 8, 8)
    assert d["engine"] == "KVStore" and "push-pull" in d["stop"]
    lines = [l for l in mllog.read_text().splitlines() if ":::MLLOG" in l]
    assert sum('"run_start"' in l for l in lines) == 1
    assert any('"global_batch_size", "value": 8' in l for l in lines)
    assert sum('"eval_accuracy"' in l for l in lines) == len(history)
    one = train_to_target("transformer", backend, numbers, "token_accuracy=0.99", seed=0,
                          eval_every=2, max_steps=record["steps_run"],
                          overrides={"batch_size": 8, "dropout": 0.0, "attention_dropout": 0.0,
                                     "label_smoothing": 0.0}).record()
    np.testing.assert_allclose(record["losses"], one["losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([h["value"] for h in history],
                               [h["value"] for h in one["history"]], atol=1e-9)


def test_cntk_ranks_train_a_step_budget_to_a_target(numbers, tmp_path):
    """The Transformer on CNTK: no collective reaches Python, so the ranks train the step
    budget agreed in advance and rank 0 records the first evaluation that met the target;
    the global losses are one process's at the global batch."""
    from conftest import require_backend
    require_backend("cntk")
    from tbdzoo.cli import main
    from tbdzoo.training import train_to_target
    out = tmp_path / "t.jsonl"
    code = main(["train", "transformer", "--backend", "cntk", "--data", numbers, "--target",
                 "token_accuracy=0.02", "--eval-every", "2", "--max-steps", "4", "--set",
                 "batch_size=4"] + list(EXACT) + ["--nproc", "2", "--rank-timeout", "120",
                                                   "-o", str(out)])
    record = json.loads(out.read_text())
    d = record["distributed"]
    assert code == (0 if record["reached"] else 1)
    assert record["steps_run"] == 4 and [h["step"] for h in record["history"]] == [2, 4]
    assert d["engine"] == "data_parallel_distributed_learner" and d["communication"] == "mpi"
    assert "agreed in advance" in record["stop_reason"]
    assert (d["per_replica_batch"], d["global_batch"]) == (4, 8)
    one = train_to_target("transformer", "cntk", numbers, "token_accuracy=0.99", seed=0,
                          eval_every=2, max_steps=4,
                          overrides={"batch_size": 8, "dropout": 0.0, "attention_dropout": 0.0,
                                     "label_smoothing": 0.0}).record()
    assert len(one["losses"]) == 4 and record["losses"][0] > 1.0   # about ln(vocab) at first
    np.testing.assert_allclose(record["losses"], one["losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([h["value"] for h in record["history"]],
                               [h["value"] for h in one["history"]], atol=1e-9)


@pytest.mark.parametrize("model", ["a3c", "wgan", "faster_rcnn"])
def test_a_task_without_rank_shares_refuses_nproc_by_name(model, tmp_path):
    """Refused before any data is read or process started, naming the models that do train
    data-parallel and the command that measures this one's data-parallel throughput."""
    from tbdzoo.training import train_to_target
    from tbdzoo.training.errors import TrainingError
    with pytest.raises(TrainingError, match=r"^{} does not train data-parallel to a target.*"
                                            r"resnet50, transformer, inception_v3.*"
                                            r"tbd run --nproc".format(model)):
        train_to_target(model, "torch", str(tmp_path / "absent"), None, nproc=2)
