"""Trainer events and the listeners that act on them.

The trainer says what happens (init started, epoch 3 stopped, eval gave 0.11);
listeners decide what to do with it: the MLPerf logger writes mllog lines, the
progress printer prints a line per epoch. Builders (models, datasets,
optimizers) emit nothing.
"""

import dataclasses
import sys
import time


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """Facts about a run, known once init is done."""
    benchmark: str
    seed: int
    num_nodes: int
    ranks: int
    accelerators_per_node: int
    global_batch_size: int
    train_samples: int
    eval_samples: int
    hyperparameters: dict
    target_name: str
    target: float
    # {"checkpoint": path, "epoch": n} when the run continues a checkpointed one.
    resumed_from: dict | None = None


class Listener:
    """No-op base: override what you need. Epochs are numbered from 1."""

    def on_init_start(self): ...
    def on_init_stop(self, info: RunInfo): ...
    def on_staging_start(self): ...
    def on_staging_stop(self, stats: dict): ...
    def on_caches_cleared(self, cleared: bool, files: int): ...
    def on_run_start(self): ...
    def on_epoch_start(self, epoch: int): ...
    def on_epoch_stop(self, epoch: int, train: dict): ...
    def on_eval_start(self, epoch: int): ...
    def on_eval_stop(self, epoch: int, value: float): ...
    def on_run_stop(self, status: str, epoch: int, checkpoint: str | None = None): ...
    def close(self): ...


class Events:
    """Fans every Listener event out to a list of listeners, in order."""

    def __init__(self, listeners):
        self.listeners = list(listeners)

    def __getattr__(self, name):
        if not hasattr(Listener, name):
            raise AttributeError(name)

        def fan_out(*args, **kwargs):
            for listener in self.listeners:
                getattr(listener, name)(*args, **kwargs)
        return fan_out


class ProgressPrinter(Listener):
    """One line per epoch on rank 0: loss, validation metric, throughput, LR."""

    def __init__(self, stream=sys.stdout):
        self.stream = stream
        self.run_start = None
        self.info = None
        self.train = {}

    def _print(self, msg):
        print(msg, file=self.stream, flush=True)

    def on_init_stop(self, info):
        self.info = info

    def on_staging_stop(self, stats):
        self._print(f"[staging] {stats['files']} files ({stats['skipped']} already staged), "
                    f"{stats['bytes'] / 1e9:.3f} GB in {stats['seconds']:.2f} s = {stats['gb_per_s']:.3f} GB/s "
                    f"(all ranks)")

    def on_run_start(self):
        self.run_start = time.time()

    def on_epoch_stop(self, epoch, train):
        self.train = train

    def on_eval_stop(self, epoch, value):
        t = self.train
        self._print(f"[epoch {epoch:3d}] train_loss {t.get('loss', float('nan')):.4f}  "
                    f"{self.info.target_name} {value:.4f} (target {self.info.target})  "
                    f"{t.get('samples_per_s', 0):.1f} samples/s  lr {t.get('lr', 0):.3g}  "
                    f"t={time.time() - self.run_start:.1f}s")

    def on_run_stop(self, status, epoch, checkpoint=None):
        minutes = (time.time() - self.run_start) / 60 if self.run_start else float("nan")
        saved = f"; checkpoint {checkpoint}" if checkpoint else ""
        self._print(f"[run] {status} after {epoch} epoch(s), time to train {minutes:.3f} min{saved}")
