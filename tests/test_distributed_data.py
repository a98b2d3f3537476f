"""Data-parallel runs fed from a data folder: `tbd run --data DIR --nproc N` (each rank reads
its share through its framework's pipeline; the record sums the ranks) and `tbd train --nproc N`
(each rank trains on its share, rank 0 evaluates and the stop reaches every rank).
docs/distributed.md, "Data-fed runs" and "Training to a target"; docs/training.md."""
import json
import os

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
