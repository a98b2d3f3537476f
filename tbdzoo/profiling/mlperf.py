"""MLPerf-style ``:::MLLOG`` lines for each run, through the mlperf-logging package, so tools
that read MLPerf logs can read ours. One block of events per finished record."""
import logging

from mlperf_logging import mllog
from mlperf_logging.mllog import constants


class MlperfLog(object):
    def __init__(self, path):
        # Our own logger with only a file handler: the package's default one prints to stdout,
        # where the progress display lives.
        logger = logging.getLogger("tbdzoo.mllog")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.addHandler(logging.FileHandler(path))
        mllog.config(logger=logger)
        self.logger = mllog.get_mllogger()

    def log_record(self, record):
        log, meta = self.logger, {"backend": record["backend"], "config": record["config"]}
        log.event(key=constants.SUBMISSION_BENCHMARK, value=record["model"], metadata=meta)
        log.event(key=constants.GLOBAL_BATCH_SIZE, value=record.get("batch_size"), metadata=meta)
        if record["status"] == "ok":
            log.event(key="tbdzoo_throughput", value=record["throughput"]["value"],
                      metadata=dict(meta, unit=record["throughput"]["unit"]))
            log.event(key="tbdzoo_step_time_median_s", value=record["step_time"]["median"], metadata=meta)
        log.end(key=constants.RUN_STOP, value=None, metadata=dict(
            meta, status="success" if record["status"] == "ok" else "aborted",
            reason=record.get("error")))
