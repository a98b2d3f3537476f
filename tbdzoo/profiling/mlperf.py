"""MLPerf-style ``:::MLLOG`` lines for each run, through the mlperf-logging package, so tools
that read MLPerf logs can read ours. One block of events per finished record."""
import logging

from mlperf_logging import mllog
from mlperf_logging.mllog import constants


def file_mllogger(name, path):
    """The package's shared MLLogger writing only to ``path`` through the logger ``name``,
    and that file handler: the package's default logger prints to stdout, where the progress
    display lives. A second log of the same name in one process (a second run) swaps the
    file; the package refuses to be configured twice with one logger, so it is configured
    only when another logger is current."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handler = logging.FileHandler(path)
    logger.addHandler(handler)
    if mllog.get_mllogger().logger.name != name:
        mllog.config(logger=logger)
    return mllog.get_mllogger(), handler


class MlperfLog:
    def __init__(self, path):
        self.logger, _ = file_mllogger("tbdzoo.mllog", path)

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
