"""MLPerf-style ``:::MLLOG`` lines of a training run through the mlperf-logging package:
run_start, the seed and batch size, eval_accuracy at each evaluation (with the step and the
samples seen), run_stop with status success or aborted."""
__all__ = ["TrainingMllog"]


class TrainingMllog:
    def __init__(self, path):
        from mlperf_logging.mllog import constants

        from ..profiling.mlperf import file_mllogger
        self.constants = constants
        self.path = path   # a data-parallel run's rank 0 writes its own lines here
        self.log, self._handler = file_mllogger("tbdzoo.training.mllog", path)
        self.meta = {}

    def start(self, model, backend, seed, batch_size, target):
        c = self.constants
        self.meta = {"backend": backend}
        self.log.event(key=c.SUBMISSION_BENCHMARK, value=model, metadata=self.meta)
        self.log.event(key=c.SEED, value=seed, metadata=self.meta)
        self.log.event(key=c.GLOBAL_BATCH_SIZE, value=batch_size, metadata=self.meta)
        self.log.event(key="target_" + target.metric.name, value=target.value, metadata=self.meta)
        self.log.start(key=c.RUN_START, metadata=self.meta)

    def evaluation(self, step, samples, value):
        c = self.constants
        self.log.event(key=c.EVAL_ACCURACY, value=value,
                       metadata=dict(self.meta, step_num=step, samples_count=samples))

    def stop(self, reached, reason):
        self.log.end(key=self.constants.RUN_STOP, metadata=dict(
            self.meta, status="success" if reached else "aborted", reason=reason))
        self._handler.flush()
        self._handler.close()
