"""The thread policy: torch's intra-op threads kept to the cores other processes leave free."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from rlaccel_plugins.threads import ThreadPolicy, own_cpu_seconds, threads_for


@pytest.mark.parametrize(("cap", "cores", "others", "expected"), [
    (2, 2, 0.0, 2), (2, 2, 0.4, 2), (2, 2, 0.6, 1), (2, 2, 1.0, 1), (2, 2, 3.0, 1), (16, 16, 4.2, 12), (4, 16, 0.0, 4),
])
def test_threads_are_the_free_cores_within_the_cap(cap, cores, others, expected):
    assert threads_for(cap, cores, others) == expected


class FakeMachine:
    """``/proc/stat``'s busy seconds for a machine where other processes use ``others`` cores."""

    def __init__(self) -> None:
        self.others, self._seconds, self._since = 0.0, 0.0, time.perf_counter()

    def busy(self) -> float:
        now = time.perf_counter()
        self._seconds += self.others * (now - self._since)
        self._since = now
        return self._seconds + own_cpu_seconds()


def test_the_count_follows_the_machine_and_comes_back_after():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    machine = FakeMachine()
    policy = ThreadPolicy(interval=0.05, cores=2, busy=machine.busy)
    try:
        policy.start()
        time.sleep(0.06)
        assert policy.update() == 2 and torch.get_num_threads() == 2
        machine.others = 1.0  # another process starts
        time.sleep(0.06)
        assert policy.update() == 1 and torch.get_num_threads() == 1
        assert policy.others == pytest.approx(1.0, abs=0.2)
        machine.others = 0.0
        time.sleep(0.06)
        assert policy.update() == 2
        assert policy.changes == 2
        policy.stop()
        assert torch.get_num_threads() == 2 and policy.threads is None
    finally:
        torch.set_num_threads(before)


def test_a_fixed_count_is_held_and_given_back():
    before = torch.get_num_threads()
    policy = ThreadPolicy(fixed=1)
    policy.start()
    assert torch.get_num_threads() == 1 and policy.update() == 1
    policy.stop()
    assert torch.get_num_threads() == before


def test_a_real_busy_process_takes_a_core_from_the_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        policy = ThreadPolicy(interval=0.3, cores=2)
        policy.start()
        time.sleep(0.5)
        assert policy.update() == 1
        assert policy.others >= 0.5
        policy.stop()
    finally:
        busy.kill()
        busy.wait()
        torch.set_num_threads(before)
