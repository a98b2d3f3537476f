"""MLPerf-style ``:::MLLOG`` lines of a training run through the mlperf-logging package:
run_start, the seed and batch size, eval_accuracy at each evaluation (with the step and the
samples seen), run_stop with status success or aborted."""
import logging

__all__ = ["TrainingMllog"]


class TrainingMllog(object):
    def __init__(self, path):
        from mlperf_logging import mllog
        from mlperf_logging.mllog import constants
        self.constants = constants
        self.path = path   # a data-parallel run's rank 0 writes its own lines here
        # A logger of our own with only a file handler: the package's default prints to
        # stdout, where the progress display lives.
        logger = logging.getLogger("tbdzoo.training.mllog")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        self._handler = logging.FileHandler(path)
        logger.addHandler(self._handler)
        mllog.config(logger=logger)
        self.log = mllog.get_mllogger()
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
