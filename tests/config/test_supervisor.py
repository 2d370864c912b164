"""The live market's supervisor: restart with backoff, reset after a healthy run, what an exited
child left in its group stopped before it starts again, clean stop.

Most tests use no processes and no real time: the clock, the sleep, the way a child is started
and its process groups are fakes. The last ones run real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from config.supervisor import (
    ChildSpec,
    RestartPolicy,
    Supervisor,
    exit_described,
)


class FakeProcess:
    """A child that runs until the test says it exited."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode


class FakeGroups:
    """Process groups: how many processes each still has beside its leader, and the signals
    sent. SIGKILL empties a group; SIGTERM does when ``stubborn`` does not name it."""

    def __init__(self) -> None:
        self.left: dict[int, int] = {}
        self.stubborn: set[int] = set()
        self.sent: list[tuple[int, int]] = []

    def signal(self, group: int, sig: int) -> None:
        self.sent.append((group, sig))
        if sig == signal.SIGKILL or group not in self.stubborn:
            self.left.pop(group, None)

    def alive(self, group: int) -> bool:
        return self.left.get(group, 0) > 0


class World:
    """A fake clock, its sleep, and a launcher that records what it started and when."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.started: list[tuple[str, float, list[str]]] = []
        self.reports: list[str] = []
        self.procs: dict[str, FakeProcess] = {}
        self.refuse: set[str] = set()
        self.groups = FakeGroups()

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def launch(self, spec: ChildSpec) -> FakeProcess:
        if spec.name in self.refuse:
            raise FileNotFoundError(f"no such program: {spec.command()[0]}")
        proc = FakeProcess(pid=100 + len(self.started))
        self.started.append((spec.name, self.now, spec.command()))
        self.procs[spec.name] = proc
        return proc

    def supervisor(self, policy: RestartPolicy | None = None) -> Supervisor:
        return Supervisor(
            launch=self.launch,
            policy=policy,
            report=self.reports.append,
            clock=self.clock,
            sleep=self.sleep,
            poll_s=0.1,
            groups=self.groups,
            leftover_grace_s=5.0,
        )

    def starts_of(self, name: str) -> list[float]:
        return [at for started, at, _ in self.started if started == name]

    def crash(self, name: str, code: int = -signal.SIGKILL) -> None:
        self.procs[name].returncode = code

    def run_for(self, supervisor: Supervisor, seconds: float) -> None:
        end = self.now + seconds
        supervisor.run(until=lambda: self.now >= end - 1e-9)


def test_the_delay_doubles_from_half_a_second_up_to_its_cap() -> None:
    policy = RestartPolicy()  # the defaults: 0.5 s, doubling, at most 30 s
    delays = [policy.delay(failures=n) for n in range(1, 10)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_a_child_that_keeps_crashing_is_restarted_with_doubling_delays() -> None:
    world = World()
    supervisor = world.supervisor(RestartPolicy(initial_s=0.5, max_s=4.0, stable_s=60.0))
    supervisor.add(ChildSpec("engine", ["sim", "--port", "30000"]))
    supervisor.add(ChildSpec("web", ["web"]))
    supervisor.start("engine")
    supervisor.start("web")
    crashes = []
    for _ in range(6):
        crashes.append(world.now)
        world.crash("engine")
        restarts = len(world.starts_of("engine"))
        while len(world.starts_of("engine")) == restarts:
            world.run_for(supervisor, 0.1)
    # Each restart comes one delay after the exit (at most one poll, 0.1 s, later).
    gaps = [at - crash for at, crash in zip(world.starts_of("engine")[1:], crashes, strict=True)]
    for gap, delay in zip(gaps, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0], strict=True):
        assert delay - 1e-6 <= gap <= delay + 0.1 + 1e-6
    assert world.starts_of("web") == [1000.0], "the other child kept running"
    assert world.started[-1][2] == ["sim", "--port", "30000"]
    assert "engine: exited (signal 9 (SIGKILL)) after 0.0 s; starting it again in 0.5 s" in (
        " ".join(world.reports)
    )
    assert sum("engine: started again" in line for line in world.reports) == 6


def test_the_delay_starts_over_after_a_run_of_stable_s() -> None:
    world = World()
    supervisor = world.supervisor(RestartPolicy(initial_s=1.0, max_s=30.0, stable_s=20.0))
    supervisor.add(ChildSpec("engine", ["sim"]))
    supervisor.start("engine")
    for _ in range(3):  # three quick crashes: 1, 2, 4 s
        world.crash("engine")
        world.run_for(supervisor, 5.0)
    assert len(world.starts_of("engine")) == 4
    world.run_for(supervisor, 25.0)  # then it stays up longer than stable_s
    world.crash("engine")
    crashed_at = world.now
    world.run_for(supervisor, 3.0)
    assert world.starts_of("engine")[-1] - crashed_at == pytest.approx(1.0, abs=0.11)
    assert world.reports[-2].endswith("starting it again in 1 s (see its log)")


def test_a_child_that_cannot_be_started_is_tried_again_with_backoff() -> None:
    world = World()
    supervisor = world.supervisor(RestartPolicy(initial_s=0.5, max_s=30.0, stable_s=10.0))
    supervisor.add(ChildSpec("worker", ["celery"]))
    supervisor.start("worker")
    world.run_for(supervisor, 30.0)  # a long healthy run
    world.refuse.add("worker")
    world.crash("worker", code=1)
    world.run_for(supervisor, 4.0)  # starts tried 0.5, 1.5 and 3.5 s after the exit
    failed = [line for line in world.reports if "could not be started" in line]
    assert len(failed) == 3 and "no such program: celery" in failed[0]
    assert failed[-1].endswith("starting it again in 4 s (see its log)")
    world.refuse.clear()
    world.run_for(supervisor, 4.0)
    assert len(world.starts_of("worker")) == 2
    assert supervisor.process("worker") is world.procs["worker"]


def test_argv_is_built_at_each_start() -> None:
    world = World()
    policy = {"reserve": "0.001"}
    supervisor = world.supervisor()
    supervisor.add(ChildSpec("engine", lambda: ["sim", "--reserve", policy["reserve"]]))
    supervisor.start("engine")
    policy["reserve"] = "0.25"  # the operator moved the reserve meanwhile
    world.crash("engine")
    world.run_for(supervisor, 1.0)
    assert [argv for _, _, argv in world.started] == [
        ["sim", "--reserve", "0.001"],
        ["sim", "--reserve", "0.25"],
    ]


def test_what_an_exited_child_left_is_stopped_before_it_starts_again() -> None:
    """uvicorn's main process killed leaves its workers in its group, holding the port: they
    get SIGTERM at once, and the child starts again only when its group is empty."""
    world = World()
    supervisor = world.supervisor(RestartPolicy(initial_s=0.5))
    supervisor.add(ChildSpec("web", ["uvicorn"]))
    web = supervisor.start("web").pid
    world.groups.left[web] = 3  # two workers and a resource tracker
    world.groups.stubborn.add(web)  # they outlive a SIGTERM for a while
    world.crash("web")
    world.run_for(supervisor, 2.0)
    assert world.groups.sent == [(web, signal.SIGTERM)]
    assert world.starts_of("web") == [1000.0], "started again beside its old workers"
    world.groups.left.pop(web)  # they ended
    world.run_for(supervisor, 0.2)
    assert len(world.starts_of("web")) == 2


def test_what_outlives_the_grace_period_is_killed_then_the_child_starts_again() -> None:
    world = World()
    supervisor = world.supervisor(RestartPolicy(initial_s=0.5))
    supervisor.add(ChildSpec("web", ["uvicorn"]))
    web = supervisor.start("web").pid
    world.groups.left[web] = 2
    world.groups.stubborn.add(web)
    world.crash("web")
    crashed = world.now
    world.run_for(supervisor, 6.0)
    assert world.groups.sent == [(web, signal.SIGTERM), (web, signal.SIGKILL)]
    restarted = world.starts_of("web")[1]
    assert 5.0 <= restarted - crashed <= 5.0 + 0.1 + 1e-6  # the grace period, not the 0.5 s delay
    assert any("still running after 5 s; killed them (SIGKILL)" in r for r in world.reports)


def test_stop_all_signals_the_groups_of_children_that_exited_too() -> None:
    world = World()
    supervisor = world.supervisor()
    supervisor.add(ChildSpec("web", ["uvicorn"]))
    supervisor.add(ChildSpec("engine", ["sim"]))
    web, engine = supervisor.start("web").pid, supervisor.start("engine").pid
    world.groups.left[web] = 2
    world.groups.stubborn.add(web)
    world.crash("web")
    world.crash("engine", code=0)
    world.groups.left[engine] = 1
    supervisor.stop_all(grace_s=1.0)
    assert (engine, signal.SIGTERM) in world.groups.sent
    assert world.groups.sent.count((web, signal.SIGTERM)) == 1
    assert world.groups.sent[-1] == (web, signal.SIGKILL)
    assert not world.groups.alive(web) and not world.groups.alive(engine)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_real_child_killed_leaves_nothing_behind() -> None:
    """A real child that started a process of its own (as uvicorn starts its workers) is
    SIGKILLed: its own child, orphaned, is stopped before the child starts again."""
    spawner = [
        sys.executable, "-c",
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n",
    ]  # fmt: skip
    reports: list[str] = []
    supervisor = Supervisor(
        launch=lambda spec: subprocess.Popen(
            spec.command(), start_new_session=True, stdout=subprocess.PIPE, text=True
        ),
        report=reports.append,
        policy=RestartPolicy(initial_s=0.2),
        leftover_grace_s=5.0,
    )
    supervisor.add(ChildSpec("web", spawner))
    first = supervisor.start("web")
    assert first.stdout is not None
    orphan = int(first.stdout.readline())
    assert _running(orphan)
    os.kill(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while supervisor.process("web") in (first, None):
        assert time.monotonic() < deadline, reports
        supervisor.check()
        time.sleep(0.05)
    assert not _running(orphan), "the killed child's own child outlived it"
    second = supervisor.process("web")
    assert second is not None and second.stdout is not None
    orphan2 = int(second.stdout.readline())
    supervisor.stop_all(grace_s=10.0)
    assert second.poll() == -signal.SIGTERM and not _running(orphan2)


def test_stop_all_stops_real_children_and_restarts_nothing() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = Supervisor(
        launch=lambda spec: subprocess.Popen(spec.command(), start_new_session=True),
        report=lambda line: None,
    )
    supervisor.add(ChildSpec("a", sleeper))
    supervisor.add(ChildSpec("b", sleeper))
    a, b = supervisor.start("a"), supervisor.start("b")
    supervisor.stop_all(grace_s=10.0)
    assert a.poll() == -signal.SIGTERM and b.poll() == -signal.SIGTERM
    supervisor.check()  # what the loop would do next: nothing any more
    assert supervisor.process("a") is a and supervisor.process("b") is b


def test_exits_are_described_by_code_or_signal() -> None:
    assert exit_described(0) == "exit 0"
    assert exit_described(3) == "exit 3"
    assert exit_described(-9) == "signal 9 (SIGKILL)"
    assert exit_described(-15) == "signal 15 (SIGTERM)"
