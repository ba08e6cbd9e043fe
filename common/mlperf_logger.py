"""Maps trainer events to MLPerf log lines (`mlperf_logging.mllog`).

Only rank 0 writes. The log grows in `<output-dir>/mlperf.log.partial` and is
renamed to `mlperf.log` once the run has stopped, so `mlperf.log` is always a
finished log. A log already there (a resumed run) is kept as mlperf.log.1, .2...
"""

import logging
import os
import threading
from pathlib import Path

from mlperf_logging.mllog.mllog import MLLogger

from common.events import Listener, RunInfo

RESUMED_KEY = "resumed_from"
LOG_NAME = "mlperf.log"
_CALLER_OFFSET = 3


class MLPerfLogger(Listener):
    """Listener that writes the MLPerf log of one run.

    Args:
      output_dir: where mlperf.log goes.
      submission: the submission_* keys (benchmark, org, division, status, platform).
      metric_key: the key of the quality metric ('eval_error', 'eval_accuracy').
      instance: for weak scaling, {'instance_id': i, 'number_of_instances': m}.
    """

    def __init__(self, output_dir, submission: dict, metric_key: str, instance: dict | None = None):
        self.metric_key = metric_key
        self._instance = dict(instance or {})   # weak scaling: instance_id, number_of_instances
        self.final = Path(output_dir) / LOG_NAME
        self.partial = Path(output_dir) / (LOG_NAME + ".partial")
        self.partial.unlink(missing_ok=True)
        # A private logging.Logger per run keeps runs in one process (tests) apart.
        logger = logging.getLogger(f"mlperf.{id(self)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(self.partial)
        logger.addHandler(self._handler)
        self._logger = logger
        # Offsets so that each line's metadata names the trainer's call site,
        # past the event fan-out and this listener.
        self._ml = MLLogger(logger=logger, default_stack_offset=_CALLER_OFFSET,
                            root_dir=str(Path(__file__).resolve().parents[1]))
        self._submission = dict(submission)
        self._closed = False
        # SIGTERM closes the log from another thread (common.termination) while
        # the main thread may be writing a line: one at a time, none after close.
        self._lock = threading.RLock()

    def _event(self, key, value=None, **metadata):
        with self._lock:
            if not self._closed:
                self._ml.event(key=key, value=value, metadata=metadata or None, stack_offset=_CALLER_OFFSET + 1)

    def _start(self, key, **metadata):
        with self._lock:
            if not self._closed:
                self._ml.start(key=key, metadata=metadata or None, stack_offset=_CALLER_OFFSET + 1)

    def _end(self, key, **metadata):
        with self._lock:
            if not self._closed:
                self._ml.end(key=key, metadata=metadata or None, stack_offset=_CALLER_OFFSET + 1)

    def on_init_start(self):
        self._start("init_start")
        for key in ("benchmark", "org", "division", "status", "platform"):
            self._event(f"submission_{key}", self._submission[key])

    def on_init_stop(self, info: RunInfo):
        self._event("seed", info.seed)
        self._event("number_of_nodes", info.num_nodes)
        self._event("number_of_ranks", info.ranks)
        for key, value in self._instance.items():
            self._event(key, value)
        self._event("accelerators_per_node", info.accelerators_per_node)
        self._event("global_batch_size", info.global_batch_size)
        self._event("train_samples", info.train_samples)
        self._event("eval_samples", info.eval_samples)
        for key, value in info.hyperparameters.items():
            self._event(key, value)
        if info.resumed_from:
            # Not an MLPerf key: a resumed run is no benchmark result, and scoring refuses it.
            self._event(RESUMED_KEY, info.resumed_from)
        self._end("init_stop")

    def on_staging_start(self):
        self._start("staging_start")

    def on_staging_stop(self, stats):
        self._end("staging_stop", **{k: stats[k] for k in ("files", "bytes", "seconds", "gb_per_s")})

    def on_caches_cleared(self, cleared, files):
        # True only when this rank's input files were evicted from the page cache
        # (common.page_cache); metadata says how many files that covered.
        self._event("cache_clear", bool(cleared), files=files, method="posix_fadvise(DONTNEED)")

    def on_run_start(self):
        self._start("run_start")

    def on_epoch_start(self, epoch):
        self._start("epoch_start", epoch_num=epoch)

    def on_epoch_stop(self, epoch, train):
        self._end("epoch_stop", epoch_num=epoch)
        self._event("train_loss", train["loss"], epoch_num=epoch)
        self._event("tracked_stats", {"throughput": train["samples_per_s"]}, step=epoch)

    def on_eval_start(self, epoch):
        self._start("eval_start", epoch_num=epoch)

    def on_eval_stop(self, epoch, value):
        self._end("eval_stop", epoch_num=epoch)
        self._event(self.metric_key, value, epoch_num=epoch)

    def on_run_stop(self, status, epoch, checkpoint=None):
        # A run stopped on request says where it can go on from (aborted-with-checkpoint).
        self._end("run_stop", status=status, epoch_num=epoch, **({"checkpoint": checkpoint} if checkpoint else {}))

    def close(self):
        """Closes the file and moves it to its final name (idempotent, from any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_file()

    def _close_file(self):
        self._handler.close()
        self._logger.removeHandler(self._handler)
        if self.final.exists():
            n = 1
            while self.final.with_name(f"{LOG_NAME}.{n}").exists():
                n += 1
            os.replace(self.final, self.final.with_name(f"{LOG_NAME}.{n}"))
        os.replace(self.partial, self.final)
