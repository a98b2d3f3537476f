"""JAX's data-parallel engine (jax.distributed, one shard_map program per update;
docs/distributed.md), two ranks on this host's CPU over Gloo: they train like one process at
the same global batch, BatchNorm normalises each shard and averages the running statistics
over the replicas, rank 0's stop decision reaches every rank, and a killed rank ends the run
naming it; the record of `tbd run --nproc` names the engine. The one-process references run
in the JAX environment's worker."""
import json

import numpy as np
import pytest

from conftest import require_backend
from tbdzoo import distributed
from tbdzoo.backends.registry import build
from test_distributed import (
    FAST,
    assert_a_killed_rank_is_named,
    assert_two_ranks_train_like_one,
    assert_weights_close,
    replica_batchnorm_step,
)

pytestmark = pytest.mark.backend


@pytest.fixture(autouse=True)
def jax_environment():
    require_backend("jax")


def test_two_ranks_train_like_one_process():
    assert_two_ranks_train_like_one("jax", build)


def test_batchnorm_normalises_each_shard_and_averages_the_running_statistics():
    """ResNet-50, --bn-mode replica: the first loss is the shards' weighted mean, each shard
    normalised by its own statistics; the SGD update is the weighted mean of the shards'
    gradients; both ranks' running statistics are the mean of what one step on each shard
    alone leaves (the momentum rule is linear in the batch's statistics)."""
    got, stats, _ = replica_batchnorm_step("jax", build)
    mean = {n: (stats[0][n] + stats[1][n]) / 2 for n in stats[0]}
    assert mean and any(not np.allclose(stats[0][n], stats[1][n]) for n in mean)
    for rank in got["ranks"]:
        assert_weights_close(rank["weights"], mean)


@pytest.fixture(scope="module")
def numbers(tmp_path_factory):
    from tbdzoo.datasets.makers import make
    out = str(tmp_path_factory.mktemp("text") / "numbers")
    make("numbers-en-vi", out, seed=0, options={"train": 200, "dev": 20, "test": 40})
    return out


def test_the_stop_at_the_target_reaches_every_rank(numbers, tmp_path):
    """The Transformer to a low token accuracy: rank 0 evaluates on its own copy of the
    weights, meets the target, and its decision reaches the other rank through a broadcast,
    so both stop at that step (the launcher refuses ranks that stop at different steps)."""
    from tbdzoo.cli import main
    out = tmp_path / "t.jsonl"
    code = main(["train", "transformer", "--backend", "jax", "--data", numbers, "--target",
                 "token_accuracy=0.02", "--eval-every", "2", "--max-steps", "40", "--set",
                 "batch_size=4", "--set", "dropout=0", "--set", "attention_dropout=0",
                 "--set", "label_smoothing=0", "--nproc", "2", "--rank-timeout", "60",
                 "-o", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    d = record["distributed"]
    assert record["reached"] and record["stop_reason"] == "target reached"
    assert record["steps_run"] < 40 and record["steps_run"] == record["history"][-1]["step"]
    assert d["engine"] == "jax.distributed" and d["communication"] == "gloo"
    assert "broadcast_one_to_all" in d["stop"]
    assert (d["per_replica_batch"], d["global_batch"]) == (4, 8)


def test_a_killed_rank_ends_the_run_naming_it():
    assert_a_killed_rank_is_named("jax")


def test_the_record_names_the_engine_and_its_exposed_communication():
    """``tbd run --nproc 2``: every rank runs the protocol, then the same steps compiled
    without the collectives; rank 0's record names the engine and the exposed share."""
    record = distributed.run("a3c", "jax", nproc=2, config="tiny", steps=3, warmup=1,
                             repeats=1, **FAST)
    d = record["distributed"]
    assert (d["engine"], d["communication"], d["world_size"]) == ("jax.distributed", "gloo", 2)
    assert record["batch_size"] == d["global_batch"] == 2 * d["per_replica_batch"]
    assert d["step_time_local"] > 0 and 0.0 <= d["communication_share"] < 1.0
