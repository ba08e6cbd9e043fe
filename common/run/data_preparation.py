"""Data preparation between init and the timed run: stage the shard node-locally, record it.

MLPerf HPC v3.0 lets staging sit outside the timed region: it runs after
init_stop and before run_start (`staging_start`/`staging_stop` in the log).
The result is the `Shards` the input pipeline reads; the trainer builds its
datasets once, from it.
"""

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common.files import write_text_atomic
from common.task import Shards

if TYPE_CHECKING:  # a run that stages imports them (stage)
    from common.inputs.staging import StageStats
    from common.inputs.staging_layouts import Conversion


def prepare_data(
    cfg, dist, shards: Shards, events, run_dir, conversion: "Conversion | None" = None
) -> "tuple[Shards, StageStats | None]":
    """Every rank: stage (when staging.stage_dir is set) and record its shard; returns readable paths.

    Args:
      cfg: the run's config (staging, runtime sections).
      dist: the Distribution (collectives: every rank calls this).
      shards: this rank's shard as `Task.shard` chose it (source paths).
      events: the trainer's Events (staging_start, staging_progress, staging_stop).
      run_dir: the run's folder (shards/ goes there with runtime.record_shards).
      conversion: the layout staged files are written in (Task.staged_layout), used
        when staging.convert is on.

    Returns:
      (Shards with the paths to read, staging figures of all ranks: None when nothing was staged).
    """
    stats = None
    if cfg.staging.stage_dir:
        events.on_staging_start()
        conversion = conversion if cfg.staging.convert else None
        shards, stats = stage(cfg, dist, shards, events.on_staging_progress, conversion)
        events.on_staging_stop(stats)
    if cfg.runtime.record_shards:
        record(dist, shards, run_dir)  # the paths actually read, staged or not
    return shards, stats


def stage(
    cfg, dist, shards: Shards, progress=None, conversion: "Conversion | None" = None
) -> "tuple[Shards, StageStats]":
    """Stages this rank's files into the node-local stage_dir (in `conversion`'s layout, or copied);
    (staged Shards, figures of all ranks)."""
    from common.inputs.staging import StageStats, stage_files

    s = cfg.staging
    # '{node}' / '{host}' in the path name a directory per node, for nodes
    # that share a file system (or several "nodes" on one machine).
    stage_dir = Path(
        s.stage_dir.replace("{node}", str(dist.node_rank)).replace("{host}", dist.hostname)
    )
    start = time.perf_counter()
    options = dict(verify=s.verify, threads=s.threads)
    train, st = stage_files(shards.train_files, stage_dir, conversion, progress, **options)
    valid, sv = stage_files(shards.valid_files, stage_dir, conversion, progress, **options)
    seconds = time.perf_counter() - start
    # Staging ends when the slowest rank is done; bytes add up over ranks.
    nbytes, nfiles, nskipped = dist.allreduce_sum(
        [st.bytes + sv.bytes, st.files + sv.files, st.skipped + sv.skipped]
    )
    seconds = float(dist.allreduce_max([seconds])[0])
    stats = StageStats(files=int(nfiles), skipped=int(nskipped), bytes=int(nbytes), seconds=seconds)
    return dataclasses.replace(shards, train_files=train, valid_files=valid), stats


def record(dist, shards: Shards, run_dir) -> None:
    """Writes run_dir/shards/rank-NNNNN.json: this rank's host and files (tests, audits)."""
    d = Path(run_dir) / "shards"
    d.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        d / f"rank-{dist.rank:05d}.json",
        json.dumps(
            {
                "rank": dist.rank,
                "host": dist.hostname,
                "train": shards.train_files,
                "valid": shards.valid_files,
            }
        ),
    )
