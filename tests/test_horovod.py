"""Real two-rank Horovod runs (horovodrun over Gloo, on this machine)."""

import json
import time

from tests import helpers
from tests.test_cosmoflow_end_to_end import copy_subset, shard_of, truncate


def test_two_ranks_disjoint_shards_identical_weights_one_log(cosmo_data, tiny_config, tmp_path):
    out = tmp_path / "run"
    proc = helpers.horovodrun(2, helpers.train_cmd(
        "cosmoflow", tiny_config, "--data-dir", cosmo_data, "--output-dir", out, "--n-train", "1024",
        "--n-valid", "256", "--n-epochs", "2", "--set", "runtime.record_shards=true",
        "--set", "train.stop_at_target=false"))
    assert (out / "summary.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 rank(s) on 1 node(s)" in proc.stdout

    shards = [json.loads((out / "shards" / f"rank-{r:05d}.json").read_text()) for r in (0, 1)]
    for split, total in (("train", 1024), ("valid", 256)):
        a, b = set(shards[0][split]), set(shards[1][split])
        assert len(a) == len(b) == total // 2 and not a & b

    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["epochs"] == 2
    assert summary["weights_in_sync"] is True

    logs = sorted(p.name for p in out.iterdir() if p.name.startswith("mlperf"))
    assert logs == ["mlperf.log"]
    log = (out / "mlperf.log").read_text()
    assert log.count('"key": "run_start"') == 1
    assert '"key": "global_batch_size", "value": 16' in log


def test_bad_file_on_one_rank_ends_both_ranks(cosmo_data, tiny_config, tmp_path):
    data = tmp_path / "data"
    copy_subset(cosmo_data, data, 64, 32)
    victim = shard_of(data, rank=1, size=2, n_train=64)[3]
    truncate(data / "train" / victim.split("/")[-1])
    start = time.time()
    proc = helpers.horovodrun(2, helpers.train_cmd(
        "cosmoflow", tiny_config, "--data-dir", data, "--output-dir", tmp_path / "run",
        "--n-train", "64", "--n-valid", "32"), timeout=240)
    assert proc.returncode != 0
    assert time.time() - start < 200
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if "error: [rank 1]" in line]
    assert len(errors) == 1 and victim in errors[0], output[-3000:]
    assert "Terminating remaining workers" in output
