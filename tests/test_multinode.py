"""Two "nodes" on one machine: horovodrun with two host names for this host, 2 ranks each,
and a stage directory per node ('{node}' in --stage-dir). Each node must stage exactly the
files its own ranks read, and the job must read every selected file exactly once per epoch.
Spatial groups that do not fit the nodes are refused by every rank (the groups that span
nodes are proven in tests/test_spatial.py)."""

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
    cmd = helpers.train_cmd(
        "cosmoflow",
        tiny_config,
        "--data-dir",
        cosmo_data,
        "--output-dir",
        out,
        "--n-train",
        str(N_TRAIN),
        "--n-valid",
        str(N_VALID),
        "--n-epochs",
        "1",
        "--stage-dir",
        f"{stage}/node{{node}}",
        "--set",
        "runtime.record_shards=true",
        "--set",
        "target_mae=100",
    )  # a target met at once: one epoch, success
    proc = helpers.horovodrun_two_nodes(4, cmd)
    assert proc.returncode == 0, helpers.failure_output(proc)
    assert "4 rank(s) on 2 node(s), 2 per node" in proc.stdout
    assert "GB/s" in proc.stdout and "[staging]" in proc.stdout

    shards = [json.loads((out / "shards" / f"rank-{r:05d}.json").read_text()) for r in range(4)]
    for node in (0, 1):
        node_dir = stage / f"node{node}"
        staged = {
            p.name for p in node_dir.rglob("*") if p.is_file() and MANIFEST_DIR not in p.parts
        }
        ranks = (2 * node, 2 * node + 1)
        read = [Path(f) for r in ranks for split in ("train", "valid") for f in shards[r][split]]
        # The node's ranks read from the node's own directory, and it holds nothing else.
        assert all(node_dir in f.parents for f in read)
        assert staged == {f.name for f in read}
    train_names = [Path(f).name for s in shards for f in s["train"]]
    assert len(train_names) == N_TRAIN == len(set(train_names))  # each file once per epoch
    files = [
        {
            p.name
            for p in (stage / f"node{n}").rglob("*")
            if p.is_file() and MANIFEST_DIR not in p.parts
        }
        for n in (0, 1)
    ]
    assert files[0] and files[1] and not files[0] & files[1]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["nodes"] == 2 and summary["staging"]["files"] == N_TRAIN + N_VALID
    staged_bytes = sum(
        p.stat().st_size for p in stage.rglob("*") if p.is_file() and MANIFEST_DIR not in p.parts
    )
    assert summary["staging"]["bytes"] == staged_bytes
    log = (out / "mlperf.log").read_text()
    assert '"key": "number_of_nodes", "value": 2' in log
    assert (
        log.index('"key": "staging_start"')
        < log.index('"key": "staging_stop"')
        < log.index('"key": "run_start"')
    )


def test_spatial_groups_that_do_not_fit_the_nodes_are_refused_by_every_rank(
    cosmo_data, tiny_config, tmp_path
):
    # 3 ranks on one "node", 1 on the other: K=2 neither divides 3 nor is a multiple of it.
    train = helpers.train_cmd(
        "cosmoflow",
        tiny_config,
        "--data-dir",
        cosmo_data,
        "--output-dir",
        tmp_path / "run",
        "--spatial-ranks",
        "2",
    )
    proc = helpers.run(
        [
            *launchers.horovodrun(4, hosts="localhost:3,127.0.0.1:1"),
            *helpers.saying_its_exit_code(train),
        ],
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    # Every rank decided from the same gathered nodes: each says the same line and exits 2, none hangs.
    # Horovodrun may end ranks before their shells say their exit codes (a CI run saw one "exit 2" of
    # four, every error line printed): each code said is 2, and a rank without its error line must be
    # one horovodrun ended before it said anything.
    codes = helpers.said_exit_codes(output)
    assert codes and set(codes.values()) == {2}, output[-3000:]
    for r in range(4):
        mine = [line for line in helpers.error_lines(output) if f"error: [rank {r}]" in line]
        if not mine:
            assert r not in codes, output[-3000:]
            continue
        assert len(mine) == 1 and mine[0].endswith(
            "parallel.spatial_ranks=2 neither divides nor is a multiple of the 3 ranks per node: a group of 2 "
            "consecutive ranks must sit on one node or span whole nodes"
        ), output[-3000:]
    assert not (tmp_path / "run" / "mlperf.log").exists()
