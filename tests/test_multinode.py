"""Two "nodes" on one machine: horovodrun with two host names for this host, 2 ranks each,
and a stage directory per node ('{node}' in --stage-dir). Each node must stage exactly the
files its own ranks read, and the job must read every selected file exactly once per epoch."""

import json
from pathlib import Path

import pytest

from common import launchers
from common.inputs.staging_manifest import MANIFEST_DIR
from tests import helpers

# Four ranks as two nodes: `make test-all` runs it, `make test` skips it.
pytestmark = pytest.mark.slow

N_TRAIN, N_VALID = 512, 128


def test_each_node_stages_only_its_ranks_shard(cosmo_data, tiny_config, tmp_path):
    out, stage = tmp_path / "run", tmp_path / "stage"
    # 'localhost' and '127.0.0.1' are two hosts to Horovod (two nodes) but both run here.
    cmd = [*launchers.horovodrun(4, hosts="localhost:2,127.0.0.1:2"),
           *helpers.train_cmd("cosmoflow", tiny_config, "--data-dir", cosmo_data, "--output-dir", out,
                              "--n-train", str(N_TRAIN), "--n-valid", str(N_VALID), "--n-epochs", "1",
                              "--stage-dir", f"{stage}/node{{node}}", "--set", "runtime.record_shards=true",
                              "--set", "target_mae=100")]   # a target met at once: one epoch, success
    proc = helpers.run(cmd, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 rank(s) on 2 node(s), 2 per node" in proc.stdout
    assert "GB/s" in proc.stdout and "[staging]" in proc.stdout

    shards = [json.loads((out / "shards" / f"rank-{r:05d}.json").read_text()) for r in range(4)]
    for node in (0, 1):
        node_dir = stage / f"node{node}"
        staged = {p.name for p in node_dir.rglob("*") if p.is_file() and MANIFEST_DIR not in p.parts}
        ranks = (2 * node, 2 * node + 1)
        read = [Path(f) for r in ranks for split in ("train", "valid") for f in shards[r][split]]
        # The node's ranks read from the node's own directory, and it holds nothing else.
        assert all(node_dir in f.parents for f in read)
        assert staged == {f.name for f in read}
    train_names = [Path(f).name for s in shards for f in s["train"]]
    assert len(train_names) == N_TRAIN == len(set(train_names))            # each file once per epoch
    files = [{p.name for p in (stage / f"node{n}").rglob("*") if p.is_file() and MANIFEST_DIR not in p.parts}
             for n in (0, 1)]
    assert files[0] and files[1] and not files[0] & files[1]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["nodes"] == 2 and summary["staging"]["files"] == N_TRAIN + N_VALID
    staged_bytes = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file() and MANIFEST_DIR not in p.parts)
    assert summary["staging"]["bytes"] == staged_bytes
    log = (out / "mlperf.log").read_text()
    assert '"key": "number_of_nodes", "value": 2' in log
    assert log.index('"key": "staging_start"') < log.index('"key": "staging_stop"') < log.index('"key": "run_start"')
