"""A model server's thread count, kept right while other programs come and go on its CPUs.

The start-up plan (threads.py) counts EagleNest's own compute processes; anything else that
starts using the CPUs later (a build, another service, a busy neighbour) is invisible to it.
An OpenMP region of N threads needs all N on a CPU at once: when other runnable threads
compete for the same CPUs, every region waits for its threads' time slices, and a decoder,
which runs hundreds of small regions a token, slows down many times over (on the 2-core VM
with two busy processes beside it, the embedded server's plain decoding at 2 threads fell to
0.4 tok/s). So between engine steps the server looks at how many threads *other than its
own* are runnable on the host and uses ``max(1, min(planned, cpus - others))`` threads.

Contract:
- others = runnable threads on the host (``/proc/loadavg``, the numerator of its 4th field)
  minus this process's runnable threads (state R in ``/proc/self/task/*/stat``), sampled
  every ``sample_s`` on a thread of its own and averaged over ``window_s``; the average is
  rounded to the nearest whole thread, so an occasional client or log writer does not count;
- the thread count changes at most once a window, in either direction, never above the
  plan, and only between steps (``tick``, on the thread that runs torch); a shorter window
  would take a busy client or relay on the same host, runnable for a few samples in a row
  now and then, for a neighbour;
- a gap in the samples longer than 5 periods starts a new window; one longer than
  ``stall_s`` (2 s) is a stall: the process was paused, or starved for longer than its own
  busy steps delay the sampler (past 250 ms at times, with 8 streams on 2 CPUs). After a
  stall the count from before says nothing about the host, so it drops to 1 thread at once
  and the first ``settle_s`` of samples set it, up or down, from the fewest other threads any
  of them saw (a whole prefill at 2 threads beside two busy processes, before the next
  window, took 5.7 s);
- only for a plan of its own making (``source == "auto"``, more than 1 thread) over every
  CPU of the host: ``/proc/loadavg`` counts the whole host, so a process confined to some of
  its CPUs (affinity, cpuset, a cgroup quota) would count strangers on other CPUs; there the
  start-up plan stands.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eaglenest.foundation.host.loops import Loop
from eaglenest.foundation.host.threads import ThreadPlan

log = logging.getLogger("eaglenest.threads")


@dataclass(frozen=True)
class HostLoad:
    """Where the counts come from (tests point these at files of their own)."""

    loadavg: Path = Path("/proc/loadavg")
    tasks: Path = Path("/proc/self/task")

    def runnable_total(self) -> int:
        # "0.52 0.58 0.59 3/812 4711": 3 runnable of 812 threads
        return int(self.loadavg.read_text().split()[3].split("/")[0])

    def runnable_own(self) -> int:
        n = 0
        for task in self.tasks.iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:  # the thread ended between listing and reading
                continue
            # "4711 (python3) R 1 ...": the state follows the last ')' (names may hold ')')
            n += stat[stat.rindex(")") + 2] == "R"
        return n


class ThreadGovernor:
    """A sampler thread (``start``) reads the counts; ``tick()``, called between engine steps
    on the thread that runs torch, applies the count the last full window asked for.

    The sampler keeps its own clock rather than sampling between steps: a streaming client
    wakes up exactly when a step's tokens go out, and samples taken then would count it
    every time."""

    def __init__(self, planned: int, cpus: int, apply: Callable[[int], None],
                 load: HostLoad | None = None, clock: Callable[[], float] = time.monotonic,
                 sample_s: float = 0.05, window_s: float = 1.0, settle_s: float = 0.2,
                 stall_s: float = 2.0) -> None:
        self.planned, self.cpus, self.apply = planned, cpus, apply
        self.load, self.clock = load or HostLoad(), clock
        self.sample_s, self.window_s, self.stall_s = sample_s, window_s, stall_s
        self.settle_n = max(1, round(settle_s / sample_s))  # samples that set want after a stall
        self.threads = self.want = planned
        self._samples: list[int] = []
        self._settling = False  # after a stall, until settle_n samples have set want
        self._last_sample = self._window_start = clock()

    def start(self) -> ThreadGovernor:
        """Sample every `sample_s` for the life of the process, whatever a sample raises
        (foundation/host/loops.py: logged, retried after a back-off of at most a second)."""
        Loop("thread-governor", self.sample, self.sample_s, max_backoff=1.0,
             logger=log).start()
        return self

    def sample(self) -> None:
        """One sample; after a stall the first ``settle_n`` set ``want``; the end of a window
        sets it from the window's average."""
        now = self.clock()
        gap = now - self._last_sample
        if gap > 5 * self.sample_s:  # paused (SIGSTOP) or starved: a new window
            self._samples, self._window_start = [], now
        if gap > self.stall_s:  # paused, or starved for longer than any busy spell of ours
            self._settling, self.want = True, 1
        self._last_sample = now
        try:
            self._samples.append(max(0, self.load.runnable_total() - self.load.runnable_own()))
        except (OSError, ValueError, IndexError):
            return
        if self._settling and len(self._samples) >= self.settle_n:
            # the fewest others of the first samples: a neighbour that stays, not a client
            # that wakes when tokens go out (min over [0, 2, 0, 1] is 0; over [2, 3, 2, 2] 2)
            self.want, self._settling = self._threads_for(min(self._samples)), False
        if now - self._window_start < self.window_s:
            return
        others = sum(self._samples) / len(self._samples)
        # the average rounds: a client runnable a fifth of the time (0.2) counts 0
        self.want = self._threads_for(int(others + 0.5))
        log.debug("%.2f other threads runnable (%d samples): %d threads", others,
                  len(self._samples), self.want)
        self._samples, self._window_start = [], now

    def _threads_for(self, others: int) -> int:
        # Example: 2 CPUs, plan 2; two busy processes (others 2) -> max(1, 2 - 2) = 1
        return max(1, min(self.planned, self.cpus - others))

    def tick(self) -> int | None:
        """Apply the wanted count if it changed (on the torch thread). The new count, or None."""
        want = self.want
        if want == self.threads:
            return None
        log.info("torch threads %d -> %d (other threads runnable on %d CPUs)",
                 self.threads, want, self.cpus)
        self.threads = want
        self.apply(want)
        return want


def governor_for(plan: ThreadPlan, apply: Callable[[int], None],
                 host_cpus: int | None = None) -> ThreadGovernor | None:
    """A governor for ``plan`` where the contract allows one (else None)."""
    host = host_cpus if host_cpus is not None else (os.cpu_count() or 1)
    if plan.source != "auto" or plan.threads <= 1 or plan.cpus < host:
        return None
    return ThreadGovernor(plan.threads, plan.cpus, apply).start()
