"""Runs the official MLPerf compliance checker on a log."""

import subprocess
import sys


def check_log(path, ruleset: str = "3.0.0", usage: str = "hpc") -> tuple[bool, str]:
    """Runs `python -m mlperf_logging.compliance_checker`; returns (passed, its output)."""
    cmd = [
        sys.executable,
        "-m",
        "mlperf_logging.compliance_checker",
        "--usage",
        usage,
        "--ruleset",
        ruleset,
        "--log_output",
        "/dev/null",
        str(path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0 and "SUCCESS" in out, out
