"""MXNet's dist_sync kvstore (docs/distributed.md), two workers, a scheduler and a server on
this host's CPU: the workers train like one process at the same global batch, BatchNorm
behaves per replica, and a killed worker or server ends the run naming it, leaving nothing
behind."""
import os
import signal
import time

import psutil
import pytest

from conftest import require_framework
from tbdzoo import distributed
from tbdzoo.distributed import launch
from tbdzoo.distributed.world import Node
from tbdzoo.errors import DistributedError

require_framework("mxnet")

# the same checks and tolerances as PyTorch and TensorFlow
from test_distributed import FAST, alive, assert_a_stopped_rank_is_declared_hung, wait_for_steps
from test_distributed import test_a_training_program_reduces_each_phase_before_clipping as program_check
from test_distributed import test_batchnorm_statistics_are_per_replica as per_replica_check
from test_distributed import test_two_processes_train_like_one as train_like_one_check


def test_two_workers_train_like_one_process():
    train_like_one_check("mxnet")


def test_batchnorm_statistics_are_per_replica():
    per_replica_check("mxnet")


def test_a_training_program_reduces_each_phase_before_clipping():
    program_check("mxnet")


def test_synchronised_batchnorm_is_refused_by_name():
    with pytest.raises(DistributedError, match="--bn-mode sync is not available on MXNet's "
                       "dist_sync kvstore.*use --bn-mode replica"):
        distributed.train("resnet50", "mxnet", nproc=2, global_batch=8, steps=1, config="tiny",
                          bn_mode="sync", **FAST)


# -- faults -------------------------------------------------------------------------------------
def start_long_run():
    node = Node("mxnet", nproc=2, device="cpu")
    job = launch.make_job("transformer", "mxnet", node, "train", 2, 4, config="tiny",
                          steps=100000, **FAST)
    return launch.start(job)


def helper_pids(run):
    """{helper name: pid} of the scheduler and server the agent started."""
    out = {}
    for p in psutil.Process(run.process.pid).children():
        env = p.environ()
        if env.get("DMLC_ROLE") in ("scheduler", "server"):
            out[env["DMLC_ROLE"]] = p.pid
    return out


def assert_nothing_left(run, pids):
    pids = list(pids) + [run.process.pid]
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]


@pytest.mark.parametrize("victim", ["rank", "server"])
def test_a_killed_worker_or_server_ends_the_run_naming_it(victim):
    run = start_long_run()
    ranks = wait_for_steps(run, 1, 2)
    helpers = helper_pids(run)
    assert sorted(helpers) == ["scheduler", "server"]
    pid = ranks[1] if victim == "rank" else helpers["server"]
    os.kill(pid, signal.SIGKILL)
    start = time.time()
    with pytest.raises(DistributedError) as info:
        run.wait(timeout=120)
    message = str(info.value)
    if victim == "rank":
        assert message.startswith("rank ")
        assert "(pid {}) was killed by signal SIGKILL".format(pid) in message
        assert "the other ranks were stopped" in message
    else:
        assert message.startswith("helper process server-0 (pid {}) was killed by signal "
                                  "SIGKILL while the ranks were running".format(pid))
    assert time.time() - start < 30
    assert_nothing_left(run, list(ranks.values()) + list(helpers.values()))


def test_a_stopped_worker_is_declared_hung_and_everything_stops():
    """A worker stopped with SIGSTOP: named within --rank-timeout; the other worker, the
    scheduler and the server are stopped too."""
    assert_a_stopped_rank_is_declared_hung("mxnet", victim=1)
