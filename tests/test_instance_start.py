"""Weak scaling's start barrier (common.run.instance_start): rank 0 of each instance waits in a
shared directory until every instance is ready or gone, or until the timeout.

The whole launcher (offline.weak_scaling, two real instances) is tests/test_results_tools.py's.
"""

import threading
import time

import pytest

from common.run.instance_start import GONE, READY, marker, wait_for_instances, write_marker


def write_later(directory, instance_id, kind, delay_s):
    thread = threading.Timer(delay_s, write_marker, (directory, instance_id, kind))
    thread.start()
    return thread


def test_an_instance_waits_until_the_last_one_is_ready(tmp_path):
    write_marker(tmp_path, 0, READY)
    late = write_later(tmp_path, 2, READY, 0.4)
    write_marker(tmp_path, 1, READY)
    meeting = wait_for_instances(tmp_path, 3, timeout_s=30)
    late.join()
    assert meeting.missing == () and meeting.gone == ()
    assert (
        meeting.waited_s >= 0.35
    )  # the timeout test below is the control: a file never written holds it
    assert float(marker(tmp_path, 2, READY).read_text()) <= time.time()


def test_an_instance_gone_before_it_was_ready_does_not_hold_the_others(tmp_path):
    write_marker(tmp_path, 0, READY)
    write_later(tmp_path, 1, GONE, 0.2).join()
    meeting = wait_for_instances(tmp_path, 2, timeout_s=30)
    assert meeting.gone == (1,) and meeting.missing == () and meeting.waited_s < 5


@pytest.mark.parametrize("instance_2", [None, GONE], ids=["never started", "gone"])
def test_instances_never_ready_are_named_at_the_timeout(tmp_path, instance_2):
    write_marker(tmp_path, 0, READY)
    if instance_2:
        write_marker(tmp_path, 2, instance_2)
    meeting = wait_for_instances(tmp_path, 3, timeout_s=0.3)
    assert 0.3 <= meeting.waited_s < 5
    assert (meeting.gone, meeting.missing) == (((2,), (1,)) if instance_2 else ((), (1, 2)))


def test_markers_are_written_whole_under_their_own_name(tmp_path):
    write_marker(tmp_path / "start", 4, READY)
    assert [p.name for p in (tmp_path / "start").iterdir()] == ["instance_4.ready"]
