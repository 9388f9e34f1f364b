"""foundation/host/contention.py: the thread governor lowers a model server's threads while other
threads keep the host's CPUs busy and restores them when they stop; it reads real /proc."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from eaglenest.foundation.host.contention import HostLoad, ThreadGovernor, governor_for
from eaglenest.foundation.host.threads import ThreadPlan


class _Load(HostLoad):
    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "counts", [3, 1])  # host runnable, own runnable

    def runnable_total(self) -> int:
        return self.counts[0]  # type: ignore[attr-defined,no-any-return]

    def runnable_own(self) -> int:
        return self.counts[1]  # type: ignore[attr-defined,no-any-return]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _window(gov: ThreadGovernor, clock: _Clock, load: _Load, counts: list[tuple[int, int]]
            ) -> None:
    """One window of samples, 0.125 s apart (exact in binary), cycling through ``counts``."""
    for i in range(8):
        clock.t += 0.125
        load.counts = list(counts[i % len(counts)])  # type: ignore[attr-defined]
        gov.sample()


def test_busy_neighbours_lower_the_threads_and_their_leaving_restores_them():
    load, clock, applied = _Load(), _Clock(), list[int]()
    gov = ThreadGovernor(2, 2, applied.append, load=load, clock=clock, sample_s=0.125)
    _window(gov, clock, load, [(4, 2)])  # two other threads always runnable
    assert gov.want == 1 and applied == []  # nothing applied until the torch thread ticks
    assert gov.tick() == 1 and applied == [1] and gov.threads == 1
    assert gov.tick() is None and applied == [1]
    _window(gov, clock, load, [(2, 1), (1, 1), (1, 1), (1, 1)])  # others 0.25
    assert gov.tick() == 2 and applied == [1, 2]


def test_a_part_time_neighbour_rounds_away_and_the_plan_is_a_ceiling():
    load, clock, applied = _Load(), _Clock(), list[int]()
    gov = ThreadGovernor(2, 4, applied.append, load=load, clock=clock, sample_s=0.125)
    _window(gov, clock, load, [(3, 2), (2, 2), (2, 2), (2, 2)])  # others 0.25: rounds to 0
    _window(gov, clock, load, [(3, 2)])  # others 1 of 4 CPUs: 3 free, the plan says 2
    assert gov.tick() is None and applied == []
    _window(gov, clock, load, [(7, 2)])  # others 5: more than the CPUs -> at least 1
    assert gov.tick() == 1


def _samples(gov: ThreadGovernor, clock: _Clock, load: _Load, counts: list[tuple[int, int]]
             ) -> list[int]:
    """One sample per entry of ``counts``, 0.125 s apart; ``want`` after each."""
    wants = []
    for c in counts:
        clock.t += 0.125
        load.counts = list(c)  # type: ignore[attr-defined]
        gov.sample()
        wants.append(gov.want)
    return wants


def test_a_pause_starts_a_new_window():
    load, clock, applied = _Load(), _Clock(), list[int]()
    gov = ThreadGovernor(2, 2, applied.append, load=load, clock=clock, sample_s=0.125)
    # most of a window of samples with a client waking every other one, then a SIGSTOP
    _samples(gov, clock, load, [(3, 2), (2, 2)] * 3 + [(3, 2)])
    assert gov.want == 2
    clock.t += 60
    _window(gov, clock, load, [(2, 2)])  # after the pause nothing else runs
    assert gov.want == 2 and gov.tick() is None


def test_a_client_runnable_for_a_few_samples_in_a_row_does_not_lower_the_threads():
    load, clock, applied = _Load(), _Clock(), list[int]()
    gov = ThreadGovernor(2, 2, applied.append, load=load, clock=clock, sample_s=0.125,
                         settle_s=0.25)
    # a busy relay or load generator: runnable 3 samples in a row, then idle 5 (mean 0.375)
    wants = _samples(gov, clock, load, ([(3, 2)] * 3 + [(2, 2)] * 5) * 2)
    assert wants == [2] * 16 and gov.tick() is None


def test_a_client_waking_per_step_does_not_lower_the_threads():
    load, clock, applied = _Load(), _Clock(), list[int]()
    gov = ThreadGovernor(2, 2, applied.append, load=load, clock=clock, sample_s=0.125,
                         settle_s=0.25)
    wants = _samples(gov, clock, load, [(3, 2), (2, 2), (2, 2), (2, 2)] * 4)  # 2 windows
    assert wants == [2] * 16 and gov.tick() is None  # min of any 2 in a row: 0; mean 0.25


def test_a_short_gap_starts_a_new_window_but_keeps_the_threads():
    load, clock, applied = _Load(), _Clock(), list[int]()
    gov = ThreadGovernor(2, 2, applied.append, load=load, clock=clock, sample_s=0.125,
                         settle_s=0.25)
    _samples(gov, clock, load, [(3, 2)] * 7)  # others 1 for most of a window
    clock.t += 1.0  # the sampler waited a second behind a busy step: no stall
    assert _samples(gov, clock, load, [(2, 2)] * 7) == [2] * 7  # a new window, still open
    assert gov.tick() is None
    assert _samples(gov, clock, load, [(2, 2)] * 2) == [2, 2]  # it closes: others 0


def test_a_stall_drops_to_one_thread_until_the_short_window_reads_the_host():
    load, clock, applied = _Load(), _Clock(), list[int]()
    gov = ThreadGovernor(2, 2, applied.append, load=load, clock=clock, sample_s=0.125,
                         settle_s=0.25)
    _window(gov, clock, load, [(2, 2)])
    clock.t += 30  # paused, or starved of CPU
    assert _samples(gov, clock, load, [(2, 2)]) == [1]  # the stall itself: 1 thread
    assert gov.tick() == 1
    assert _samples(gov, clock, load, [(2, 2)]) == [2]  # an idle host: the plan, at once
    assert gov.tick() == 2
    clock.t += 30
    assert _samples(gov, clock, load, [(4, 2), (4, 2), (2, 2)]) == [1, 1, 1]  # busy: stays


def test_governor_only_for_its_own_plan_over_the_whole_host():
    def apply(n: int) -> None:
        pass

    assert governor_for(ThreadPlan(2, 2, 1, "EAGLENEST_TORCH_THREADS"), apply, 2) is None
    assert governor_for(ThreadPlan(1, 2, 2, "auto"), apply, 2) is None
    assert governor_for(ThreadPlan(2, 2, 1, "auto"), apply, 8) is None  # confined to 2 of 8
    gov = governor_for(ThreadPlan(2, 2, 1, "auto"), apply, 2)
    assert gov is not None and gov.planned == 2 and gov.cpus == 2
    assert any(t.name == "thread-governor" for t in threading.enumerate())


def test_host_load_reads_proc_and_counts_a_spinning_thread(tmp_path: Path):
    load = HostLoad()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        time.sleep(0.05)
        seen = max(load.runnable_own() for _ in range(20))
    finally:
        stop.set()
        spinner.join()
    assert seen >= 1 and load.runnable_total() >= 1
    fake = tmp_path / "loadavg"
    fake.write_text("0.52 0.58 0.59 3/812 4711\n")
    tasks = tmp_path / "task"
    for tid, stat in (("1", "1 (py) R 0"), ("2", "2 (a) b) S 0"), ("3", "3 (x) R 1")):
        (tasks / tid).mkdir(parents=True)
        (tasks / tid / "stat").write_text(stat)
    fake_load = HostLoad(loadavg=fake, tasks=tasks)
    assert fake_load.runnable_total() == 3 and fake_load.runnable_own() == 2
