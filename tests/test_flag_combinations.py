"""Flags alone and in the pairs that share a mechanism: each combination trains a step, or exits 2
with one line before run_start. None may crash after run_start (a compiled forward holding a
collective XLA has no kernel for did, once: the halo's alltoall under --xla).

Covered elsewhere, not repeated here: --amp alone (test_cosmoflow_end_to_end.py), --benchmark alone
(test_benchmark_mode.py), --benchmark with a split (test_spatial.py), group batch norm with
accumulation (test_deepcam_end_to_end.py), a split alone (test_spatial.py, test_deepcam_split.py)."""

import pytest

from tests import helpers

COSMO_RUN = [
    "--n-train",
    "16",
    "--n-valid",
    "8",
    "--batch-size",
    "4",
    "--n-epochs",
    "1",
    "--set",
    "target_mae=100",
]
FP16 = [
    "--amp",
    "--set",
    "runtime.amp_dtype=float16",
]  # loss scaling: the mechanism --amp has on a GPU
BF16 = [
    "--amp",
    "--set",
    "runtime.amp_dtype=bfloat16",
]  # CosmoFlow's float16 needs a GPU or --xla (below)
ACCUMULATE = ["--set", "train.gradient_accumulation_frequency=2"]


def _trained_a_step(proc, out, benchmark: bool) -> None:
    assert proc.returncode == 0, helpers.failure_output(proc)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if benchmark:
        assert "[benchmark]" in proc.stdout, proc.stdout[-2000:]
    else:
        log = (out / "mlperf.log").read_text()
        assert '"key": "run_stop"' in log and '"status": "success"' in log, log[-2000:]


@pytest.mark.parametrize(
    "flags",
    [
        ["--xla"],
        ["--xla", *FP16, *ACCUMULATE],
        ["--xla", "--benchmark", "1", "--set", "train.benchmark_warmup_steps=0"],
    ],
    ids=["xla", "xla+fp16+accumulation", "xla+benchmark"],
)
def test_one_rank_combinations_train(cosmo_data, tiny_config, tmp_path, flags):
    out = tmp_path / "run"
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            cosmo_data,
            "--output-dir",
            out,
            *COSMO_RUN,
            *flags,
        )
    )
    _trained_a_step(proc, out, "--benchmark" in flags)


@pytest.mark.parametrize(
    "bench, flags, message",
    [
        (
            "cosmoflow",
            ["--xla", "--spatial-ranks", "2"],
            "'runtime.xla' and 'parallel.spatial_ranks' > 1",
        ),
        (
            "cosmoflow",
            ["--xla", "--spatial-ranks", "2", "--benchmark", "1"],
            "'runtime.xla' and 'parallel.spatial_ranks'",
        ),
        (
            "deepcam",
            ["--xla", "--batchnorm_group_size", "2"],
            "'runtime.xla' and 'model.batchnorm_group_size' > 1",
        ),
        (
            "deepcam",
            ["--xla", "--spatial_ranks", "2"],
            "'runtime.xla' and 'parallel.spatial_ranks' > 1",
        ),
    ],
    ids=["xla+split", "xla+split+benchmark", "xla+group-bn", "deepcam-xla+split"],
)
def test_combinations_xla_cannot_compile_end_before_run_start(
    cosmo_data, tiny_config, deepcam_data, deepcam_config, tmp_path, bench, flags, message
):
    out = tmp_path / "run"
    paths = (
        ["--data-dir", cosmo_data, "--output-dir", out, *COSMO_RUN]
        if bench == "cosmoflow"
        else ["--data_dir_prefix", deepcam_data, "--output_dir", out]
    )
    config = tiny_config if bench == "cosmoflow" else deepcam_config
    proc = helpers.run(helpers.train_cmd(bench, config, *paths, *flags))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in helpers.own_lines(proc.stderr) if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and message in errors[0], errors
    assert not (out / "mlperf.log").exists()  # ended before init: no run_start


@pytest.mark.parametrize(
    "bench, message",
    [
        ("cosmoflow", "warm-up: TensorFlow has no kernel for MaxPool3D in half"),
        pytest.param(  # the same path, the warm-up's catch, with DeepCAM's graph to trace: slow
            "deepcam",
            "warm-up: Current CPU implementations do not yet support dilation rates larger than 1",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_float16_without_kernels_on_a_cpu_ends_at_warm_up(
    cosmo_data, tiny_config, deepcam_data, deepcam_config, tmp_path, bench, message
):
    # TensorFlow's CPU kernels have no float16 MaxPool3D (CosmoFlow) nor float16 dilated convolution
    # gradients (DeepCAM's ASPP): the first step that runs finds it, which is warm-up's, before
    # run_start; one line says what. float16 is a GPU's (and XLA's) precision.
    out = tmp_path / "run"
    paths = (
        ["--data-dir", cosmo_data, "--output-dir", out, *COSMO_RUN]
        if bench == "cosmoflow"
        else ["--data_dir_prefix", deepcam_data, "--output_dir", out]
    )
    proc = helpers.run(
        helpers.train_cmd(
            bench,
            tiny_config if bench == "cosmoflow" else deepcam_config,
            *paths,
            *FP16,
            "--set",
            "train.warmup_steps=1",
        )
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in helpers.own_lines(proc.stderr) if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], errors
    assert (
        "Traceback" not in proc.stderr
        and '"key": "run_start"' not in (out / "mlperf.log").read_text()
    )


def test_a_split_trains_with_bf16_and_accumulation_on_two_ranks(cosmo_data, tiny_config, tmp_path):
    # The halo exchange of bf16 activations (Horovod carries them as float32) and the accumulated
    # sums of the split layers' gradients, in one step, the optimizer sharded over the group.
    out = tmp_path / "run"
    proc = helpers.horovodrun(
        2,
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            cosmo_data,
            "--output-dir",
            out,
            *COSMO_RUN,
            "--spatial-ranks",
            "2",
            "--shard-optimizer",
            *BF16,
            *ACCUMULATE,
        ),
    )
    _trained_a_step(proc, out, benchmark=False)
    assert (
        "2-way spatial x 1 data-parallel group(s)" in proc.stdout
        and "mixed_bfloat16" in proc.stdout
    )
    assert "the optimizer's state sharded over each group" in proc.stdout


DEEPCAM_SPLIT_BENCH = [
    "--spatial_ranks",
    "2",
    "--local_batch_size",
    "1",
    "--benchmark",
    "1",
    "--set",
    "train.benchmark_warmup_steps=0",
    "--set",
    "train.warmup_steps=1",
    *helpers.DEEPCAM_NARROW,
]  # narrowed: bf16 is emulated, slowly, on an AVX2 CPU


# DeepCAM's pairs in one run of 4 ranks: a split with bf16 and accumulation and group batch norm
# with accumulation need no 2-rank runs of their own (group batch norm with accumulation alone trains
# in test_deepcam_end_to_end.py).
@pytest.mark.slow  # four ranks
def test_a_deepcam_split_with_group_batch_norm_bf16_and_accumulation_benchmarks_on_four_ranks(
    deepcam_data, deepcam_config, tmp_path
):
    # Batch norm over 2 data-parallel groups x 2 slabs: one group of the 4 ranks. The height split's
    # halo rows, gathered ASPP input, pooled mean and loss sum in bf16 (Horovod carries them as
    # float32), the split's gradients accumulated, in benchmark mode.
    data = tmp_path / "data"
    helpers.copy_deepcam_subset(deepcam_data, data, n_train=4, n_valid=2)
    out = tmp_path / "run"
    proc = helpers.horovodrun(
        4,
        helpers.train_cmd(
            "deepcam",
            deepcam_config,
            "--data_dir_prefix",
            data,
            "--output_dir",
            out,
            *DEEPCAM_SPLIT_BENCH,
            "--batchnorm_group_size",
            "2",
            *BF16,
            "--gradient_accumulation_frequency",
            "2",
        ),
        timeout=600,
    )
    _trained_a_step(proc, out, benchmark=True)
    assert (
        "2-way spatial x 2 data-parallel group(s)" in proc.stdout
        and "mixed_bfloat16" in proc.stdout
    )
