"""offline.submission: result sets into an MLPerf HPC v3.0 submission tree that the official
package checker passes, and one `error:` line for what cannot be submitted.

The sets are the public MLCommons v3.0 logs of tests/fixtures (a 10-run CosmoFlow set and a 5-run
DeepCAM set, as offline.result_set lays them out): real logs of complete sets, which the official
checkers accept in closed division (seed and RCP checks included).
"""

import json
import shutil
import subprocess

import pytest
import yaml
from mlperf_logging.system_desc_checker import system_desc_checker

from offline import submission
from tests import helpers
from tests.test_scoring import COSMO, DEEPCAM_WEAK, extract_fixtures, killed, not_converged

DEEPCAM = "Dell/results/32xXE8545x4A100-SXM4-40GB/strong/deepcam"
# What no machine can tell about itself; the fixture logs are of 4-GPU nodes, so the GPU fields too.
SYSTEM_INFO = {
    "status": "research",
    "host_processor_interconnect": "",
    "host_storage_type": "NVMe",
    "host_networking": "none",
    "host_networking_topology": "n/a",
    "host_memory_configuration": "",
    "cooling": "air",
    "hw_notes": "",
    "sw_notes": "",
    "accelerator_model_name": "NVIDIA A100-SXM4-40GB",
    "accelerator_host_interconnect": "PCIe 4.0",
    "accelerator_frequency": "1410 MHz",
    "accelerator_on-chip_memories": "",
    "accelerator_memory_configuration": "HBM2",
    "accelerator_memory_capacity": "40 GB",
    "accelerator_interconnect": "NVLink-3",
    "accelerator_interconnect_topology": "fully-connected",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return extract_fixtures(tmp_path_factory.mktemp("fixtures"))


def result_set(results, tmp_path, source: str, name: str):
    """A result set as offline.result_set writes it: <out>/<org>/results/<system>/strong/<bench>/."""
    out = tmp_path / name
    *_, scaling, bench = source.split("/")
    shutil.copytree(results / source, out / "reference" / "results" / "testbox" / scaling / bench)
    return out


def system_info(tmp_path, drop=()):
    path = tmp_path / "system.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in SYSTEM_INFO.items() if k not in drop}))
    return path


def package(*sets, out, info, extra=()):
    return helpers.run(
        [
            helpers.PYTHON,
            "-m",
            "offline.submission",
            "--org",
            "TestOrg",
            "--system",
            "box_1x2",
            *sets,
            "--out",
            out,
            "--system-info",
            info,
            *extra,
        ],
        timeout=600,
    )


@pytest.fixture(scope="module")
def packaged(results, tmp_path_factory):
    """The 10-run CosmoFlow and 5-run DeepCAM sets packaged once: (their sets' root, the process, the tree)."""
    tmp_path = tmp_path_factory.mktemp("packaged")
    cosmo = result_set(results, tmp_path, COSMO, "cosmo_set")
    deepcam = result_set(results, tmp_path, DEEPCAM, "deepcam_set")
    out = tmp_path / "TestOrg"
    return cosmo, package(cosmo, deepcam, out=out, info=system_info(tmp_path)), out


def test_sets_become_a_tree_the_official_package_checker_passes(packaged):
    cosmo, proc, out = packaged
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"mlperf_logging.package_checker {out} hpc 3.0.0: PASSED" in proc.stdout
    assert (
        "PACKAGE CHECKER FOUND NO ERRORS"
        in out.with_name("TestOrg.package_checker.log").read_text()
    )
    # The layout of the HPC rules.
    for bench, runs in (("cosmoflow", 10), ("deepcam", 5)):
        folder = out / "results" / "box_1x2" / "strong" / bench
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            f"result_{i}.txt" for i in range(runs)
        )
        code = out / "benchmarks" / bench / "implementations" / submission.DEFAULT_IMPL
        assert (code / bench / "train.py").read_text() == (
            helpers.REPO / bench / "train.py"
        ).read_text()
        assert not (code / ".venv").exists() and not (code / "runs").exists()
    # Every log of the set is there, none altered (the fixture's result_1..10 become result_0..9).
    packaged = sorted((out / "results" / "box_1x2" / "strong" / "cosmoflow").glob("*.txt"))
    originals = sorted(
        (cosmo / "reference" / "results" / "testbox" / "strong" / "cosmoflow").glob("*.txt")
    )
    assert sorted(p.read_text() for p in packaged) == sorted(p.read_text() for p in originals)
    desc = json.loads((out / "systems" / "box_1x2.json").read_text())
    assert (
        desc["submitter"] == "TestOrg"
        and desc["system_name"] == "box_1x2"
        and desc["division"] == "closed"
    )
    assert desc["accelerators_per_node"] == "4"  # from the logs
    assert desc["cooling"] == "air"  # from the YAML
    cpu = next(
        line.split(":", 1)[1].strip()
        for line in open("/proc/cpuinfo")
        if line.startswith("model name")
    )
    assert desc["host_processor_model_name"] == cpu  # read from this machine
    import tensorflow as tf  # the version installed here

    assert desc["framework"].startswith(f"TensorFlow {tf.__version__}, Horovod 0.28.1")
    valid, *_ = system_desc_checker.check_system_desc(
        str(out / "systems" / "box_1x2.json"), "hpc", "3.0.0"
    )
    assert valid


def test_the_verdict_is_the_checkers_own(packaged, tmp_path):
    """Negative control: a package the official checker rejects is reported as such."""
    out = tmp_path / "TestOrg"
    shutil.copytree(packaged[2], out)
    (
        out / "results" / "box_1x2" / "strong" / "cosmoflow" / "result_9.txt"
    ).unlink()  # 9 of the 10 runs
    passed, errors, _ = submission.run_package_checker(out, "3.0.0")
    assert not passed
    assert any("Incorrect number of files" in line for line in errors)


def test_a_weak_scaling_set_is_packaged_with_every_instances_nodes(results, tmp_path):
    out = tmp_path / "TestOrg"
    proc = package(
        result_set(results, tmp_path, DEEPCAM_WEAK, "weak_set"), out=out, info=system_info(tmp_path)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list((out / "results" / "box_1x2" / "weak" / "deepcam").glob("result_*.txt"))) == 10
    # 10 instances of 128 nodes, as HPE+LBNL's own description of this system says.
    assert json.loads((out / "systems" / "box_1x2.json").read_text())["number_of_nodes"] == "1280"


def test_a_set_with_a_failed_run_is_refused_naming_the_run(results, tmp_path):
    cosmo = result_set(results, tmp_path, COSMO, "set")
    log = cosmo / "reference" / "results" / "testbox" / "strong" / "cosmoflow" / "result_3.txt"
    original = log.read_text()
    log.write_text(killed(original))
    proc = package(cosmo, out=tmp_path / "TestOrg", info=system_info(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = helpers.error_lines(proc.stderr)
    assert (
        line.startswith("error: ")
        and "has failed runs, result_3.txt: " in line
        and "--allow-failed" in line
    )
    assert not (tmp_path / "TestOrg").exists()
    # One run of ten that did not converge: the olympic mean drops it, and the rules accept the set
    # when asked to. (A killed run's log, cut mid-line, fails the closed division's seed checker.)
    log.write_text(not_converged(original))
    allowed = package(
        cosmo, out=tmp_path / "TestOrg", info=system_info(tmp_path), extra=["--allow-failed"]
    )
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def test_missing_system_fields_are_listed_on_one_line(results, tmp_path):
    proc = package(
        result_set(results, tmp_path, COSMO, "set"),
        out=tmp_path / "TestOrg",
        info=system_info(tmp_path, drop=("cooling", "status")),
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: systems/box_1x2.json lacks 2 field(s) the system_desc_checker requires: status, cooling; "
        f"give them in --system-info {tmp_path / 'system.yaml'}"
    ]
    assert not (tmp_path / "TestOrg").exists()


def test_a_folder_mixing_benchmarks_is_refused(results, tmp_path):
    cosmo = result_set(results, tmp_path, COSMO, "set")
    folder = cosmo / "reference" / "results" / "testbox" / "strong" / "cosmoflow"
    shutil.copy(results / DEEPCAM / "result_0.txt", folder / "result_11.txt")
    proc = package(cosmo, out=tmp_path / "TestOrg", info=system_info(tmp_path))
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {folder} mixes benchmarks (cosmoflow: result_1.txt")
    assert "deepcam: result_11.txt): one folder holds one result set" in line


def test_unknown_system_fields_and_an_existing_out_are_refused(results, tmp_path):
    cosmo = result_set(results, tmp_path, COSMO, "set")
    info = tmp_path / "system.yaml"
    info.write_text(yaml.safe_dump(SYSTEM_INFO | {"colour": "blue"}))
    proc = package(cosmo, out=tmp_path / "TestOrg", info=info)
    assert proc.returncode == 2 and proc.stderr.startswith(
        f"error: --system-info {info}: unknown fields colour"
    )
    (tmp_path / "TestOrg").mkdir()
    proc = package(cosmo, out=tmp_path / "TestOrg", info=system_info(tmp_path))
    assert proc.returncode == 2 and "exists: choose another --out" in proc.stderr


def test_the_required_fields_are_the_official_checkers():
    fields = submission.required_fields("3.0.0")
    assert (
        len(fields) == 33 and fields[0] == "submitter" and "accelerator_on-chip_memories" in fields
    )
    # The CLI is importable and documented as the module says.
    assert (
        subprocess.run(
            [helpers.PYTHON, "-m", "offline.submission", "--help"],
            cwd=helpers.REPO,
            capture_output=True,
            env=helpers.env(),
        ).returncode
        == 0
    )


def test_system_info_numbers_are_written_as_the_checkers_strings(results, tmp_path):
    """YAML types `host_processor_core_count: 2` as an int; the official checker joins the fields as
    strings and dies on an int (TypeError). Every field is written as a string."""
    sets = submission.load_sets([result_set(results, tmp_path, COSMO, "cosmo_set")], "3.0.0", False)
    info = tmp_path / "numbers.yaml"
    info.write_text(
        yaml.safe_dump(
            SYSTEM_INFO
            | {
                "host_processor_core_count": 2,
                "accelerators_per_node": 0,
                "host_processors_per_node": 1,
                "host_memory_capacity": 24,
            }
        )
    )
    desc, _ = submission.describe_system("TestOrg", "box_1x2", sets, info, "3.0.0")
    assert desc["host_processor_core_count"] == "2" and desc["accelerators_per_node"] == "0"
    scalars = {
        k: v for k, v in desc.items() if not isinstance(v, dict)
    }  # other_software_stack is a mapping
    assert all(isinstance(v, str) for v in scalars.values()), scalars
    path = tmp_path / "box_1x2.json"
    path.write_text(json.dumps(desc))
    valid, *_ = system_desc_checker.check_system_desc(str(path), "hpc", "3.0.0")
    assert valid
    # Negative control: the same description with the int YAML gave is what the checker dies on.
    path.write_text(json.dumps(desc | {"host_processor_core_count": 2}))
    with pytest.raises(TypeError):
        system_desc_checker.check_system_desc(str(path), "hpc", "3.0.0")


def test_a_nested_system_info_value_is_refused(results, tmp_path):
    sets = submission.load_sets([result_set(results, tmp_path, COSMO, "cosmo_set")], "3.0.0", False)
    info = tmp_path / "nested.yaml"
    info.write_text(yaml.safe_dump(SYSTEM_INFO | {"cooling": ["air", "water"]}))
    with pytest.raises(
        submission.SubmissionError, match="field cooling must be a value or a mapping"
    ):
        submission.describe_system("TestOrg", "box_1x2", sets, info, "3.0.0")


def test_the_image_the_runs_computed_in_becomes_the_sw_notes(results, tmp_path):
    # The runs' summary.json (beside their logs) names the image: common/runtime.container_image.
    folder = result_set(results, tmp_path, COSMO, "set")
    logs = next(folder.glob("*/results/*/*/*"))
    image = {"runtime": "apptainer", "image": "/sw/hpc.sif", "sha256": "c" * 64, "commit": "abc123"}
    (logs / "summary.json").write_text(json.dumps({"runtime": {"image": image}}))
    sets = submission.load_sets([folder], "3.0.0", allow_failed=False)
    info = system_info(tmp_path, drop=("sw_notes",))
    description, _ = submission.describe_system("TestOrg", "box_1x2", sets, info, "3.0.0")
    assert (
        description["sw_notes"] == f"apptainer image /sw/hpc.sif sha256:{'c' * 64}, commit abc123"
    )
    (logs / "summary.json").unlink()  # control: nothing names an image, and nobody gave the field
    with pytest.raises(submission.SubmissionError, match="sw_notes"):
        submission.describe_system("TestOrg", "box_1x2", sets, info, "3.0.0")
