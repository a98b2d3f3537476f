"""MLPerf lines of several runs in one process: each run's lines go to its own file, whichever
log (a benchmark's or a training run's) came before it."""
from tbdzoo.profiling.mlperf import MlperfLog
from tbdzoo.training.mllog import TrainingMllog
from tbdzoo.training.targets import parse_target


def _run(log, seed):
    log.start("resnet50", "torch", seed, 8, parse_target("resnet50", "top1=0.5"))
    log.evaluation(10, 80, 0.25)
    log.stop(False, "max_steps")


def _lines(path):
    return [l for l in path.read_text().splitlines() if ":::MLLOG" in l]


def test_runs_one_after_another_write_their_own_files(tmp_path):
    first, second, bench = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "bench.log"
    _run(TrainingMllog(str(first)), seed=1)
    MlperfLog(str(bench)).log_record({"model": "resnet50", "backend": "torch",
                                      "config": "tiny", "status": "error", "error": "x"})
    _run(TrainingMllog(str(second)), seed=2)
    _run(TrainingMllog(str(second)), seed=3)   # the same file again: appended
    a, b = _lines(first), _lines(second)
    assert len(a) == 7 and len(b) == 14
    assert any('"key": "seed", "value": 1' in l for l in a)
    assert not any('"value": 2' in l and '"seed"' in l for l in a)
    assert any('"key": "seed", "value": 3' in l for l in b)
    assert all('"run_stop"' not in l for l in a[:-1]) and '"aborted"' in a[-1]
    assert len(_lines(bench)) == 3    # benchmark, batch size, run_stop
