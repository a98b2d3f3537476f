"""CNTK's data_parallel_distributed_learner over mpiexec (docs/distributed.md), two ranks on
this host's CPU: they train like one process at the same global batch, BatchNorm behaves per
replica, and a killed rank ends the run naming it, leaving nothing behind. The one-process
references run in CNTK's worker environment."""
import os
import shutil
import signal
import time

import psutil
import pytest

from tbdzoo import distributed
from tbdzoo.backends import environments
from tbdzoo.backends.registry import build
from tbdzoo.distributed import launch
from tbdzoo.distributed.world import Node
from tbdzoo.errors import DistributedError
from test_distributed import (
    FAST,
    GLOBAL_BATCH,
    alive,
    assert_a_stopped_rank_is_declared_hung,
    assert_each_phase_reduced,
    assert_two_ranks_train_like_one,
    assert_weights_close,
    replica_batchnorm_step,
    wait_for_steps,
)

if not os.path.exists(environments.python_of("cntk")):
    pytest.skip("the CNTK environment is missing; " + environments.how_to_create("cntk"),
                allow_module_level=True)
if shutil.which("mpiexec") is None:
    pytest.skip("mpiexec is missing; install Debian's openmpi-bin (`make env-cntk` does)",
                allow_module_level=True)


def test_two_ranks_train_like_one_process():
    assert_two_ranks_train_like_one("cntk", build)


def test_a_recurrent_model_over_ragged_batches_trains_like_one_process():
    """Seq2Seq tiny (LSTMs over per-example lengths, attention, a one-objective program):
    each rank's shard has its own padding and number of target tokens, and the global losses
    and both ranks' weights are still one process's at the global batch."""
    from test_distributed import SEQ2SEQ_BATCH
    from test_distributed_models import assert_like_one_process
    got = assert_like_one_process("cntk", "seq2seq", SEQ2SEQ_BATCH)
    assert got["ranks"][0]["gradient_weight"] == pytest.approx(15 / 28)  # tokens, not examples


def test_batchnorm_statistics_are_per_replica():
    """ResNet-50, --bn-mode replica: the first loss is the shards' weighted mean, each with its
    own statistics; the SGD update uses the weighted mean of the shards' gradients; rank 0's
    running statistics are its own shard's."""
    got, stats, _ = replica_batchnorm_step("cntk", build)
    assert stats[0]
    assert_weights_close(got["weights"], stats[0])   # rank 0's: its own shard's


def test_a_training_program_reduces_each_phase_before_clipping():
    """WGAN-GP (a generator phase, then five critic phases, each its own Trainer): the first
    generator objective is the shards' weighted mean, and both ranks hold the same weights
    after two steps, which only a distributed learner in every phase's Trainer gives."""
    assert_each_phase_reduced("cntk", build)


def test_synchronised_batchnorm_is_refused_by_name():
    with pytest.raises(DistributedError, match="--bn-mode sync is not available on CNTK's "
                       "data_parallel_distributed_learner.*use --bn-mode replica"):
        distributed.train("resnet50", "cntk", nproc=2, global_batch=GLOBAL_BATCH, steps=1,
                          config="tiny", bn_mode="sync", **FAST)


def test_a_killed_rank_ends_the_run_naming_it():
    node = Node("cntk", nproc=2, device="cpu")
    job = launch.make_job("transformer", "cntk", node, "train", 2, 4, config="tiny",
                          steps=100000, **FAST)
    run = launch.start(job)
    ranks = wait_for_steps(run, 1, 2)
    everything = [p.pid for p in psutil.Process(run.process.pid).children(recursive=True)]
    os.kill(ranks[1], signal.SIGKILL)
    start = time.time()
    with pytest.raises(DistributedError) as info:
        run.wait(timeout=120)
    message = str(info.value)
    assert "(pid {})".format(ranks[1]) in message.splitlines()[0]
    assert "signal 9" in message  # mpiexec's own account, which the error quotes
    assert time.time() - start < 30
    pids = everything + [run.process.pid]
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]


def test_a_stopped_rank_is_declared_hung_and_everything_stops():
    """A rank stopped with SIGSTOP: named within --rank-timeout; the other rank and mpiexec
    are stopped too."""
    assert_a_stopped_rank_is_declared_hung("cntk", victim=1)
