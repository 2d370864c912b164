"""Child processes kept running: what ``manage.py live_market`` runs its engine and servers under.

A :class:`Supervisor` owns one :class:`ChildSpec` per child (a name and how to start it). Once
started, a child that exits, whatever its exit status, is started again after a delay from the
:class:`RestartPolicy`: 0.5 s, doubled after each exit that follows a short run, at most 30 s,
and back to 0.5 s once a child has stayed up ``stable_s`` seconds. Every exit and every start is
reported. The other children keep running meanwhile: while the engine is down the gateway
answers 503 ``engine_unavailable``, and serves again once it is back.

A child owns its whole tree: each starts in a process group of its own (``start_new_session``),
and what it started itself (uvicorn's workers, a resource tracker) stays in that group. When a
child exits, the processes left in its group are stopped (SIGTERM, SIGKILL after
``leftover_grace_s``) before it is started again, so a web server whose main process was killed
does not leave workers holding its port. (A process that leaves its group with ``setsid`` is out
of reach; none of the market's children does.)

:meth:`Supervisor.stop_all` stops the children on purpose (SIGTERM to each child's process
group, SIGKILL after a grace period); nothing is restarted after it.

The clock, the sleep, the way a child is started and the way its group is signalled are
injected, so the policy is tested without processes or real time
(``tests/config/test_supervisor.py``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import psutil


class Process(Protocol):
    """What the supervisor needs of a started child (``subprocess.Popen`` has it)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass(frozen=True)
class ChildSpec:
    """A child process: ``name`` (in reports and log file names) and its command line, or a
    function that builds it at each start (so a restarted child gets the current settings)."""

    name: str
    argv: Sequence[str] | Callable[[], Sequence[str]]

    def command(self) -> list[str]:
        """The command line to start the child with now."""
        return list(self.argv() if callable(self.argv) else self.argv)


@dataclass(frozen=True)
class RestartPolicy:
    """When to start a child again after it exited. Seconds."""

    initial_s: float = 0.5  # the delay after an exit that follows a long run (or the first exit)
    factor: float = 2.0  # each further exit after a short run multiplies the delay by this
    max_s: float = 30.0  # the delay never exceeds this
    stable_s: float = 30.0  # a run at least this long counts as healthy: the delay starts over

    def delay(self, *, failures: int) -> float:
        """The delay before the next start after ``failures`` (>= 1) exits in a row, each
        after a run shorter than ``stable_s``."""
        return min(self.max_s, self.initial_s * self.factor ** (max(1, failures) - 1))


Launch = Callable[[ChildSpec], Process]
Report = Callable[[str], None]


class Groups(Protocol):
    """The process groups of the children (a child's group id is its pid)."""

    def signal(self, group: int, sig: int) -> None:
        """Send ``sig`` to every process of ``group`` (none left: nothing happens)."""

    def alive(self, group: int) -> bool:
        """Whether a process of ``group`` still runs (zombies do not count)."""


class OsGroups:
    """The operating system's process groups."""

    def signal(self, group: int, sig: int) -> None:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass  # already gone

    def alive(self, group: int) -> bool:
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == group and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
            except (ProcessLookupError, psutil.Error):
                continue  # it ended meanwhile
        return False


@dataclass
class _Child:
    spec: ChildSpec
    proc: Process | None = None
    started_at: float = 0.0
    failures: int = 0  # exits in a row after short runs
    restart_at: float | None = None  # when an exited child is to be started again
    starts: int = 0
    leftover: int | None = None  # the group of an exited child, while processes remain in it
    kill_at: float = 0.0  # when what is left in ``leftover`` gets SIGKILL


def exit_described(returncode: int) -> str:
    """``exit 3`` or ``signal 9 (SIGKILL)``: how a child ended (Popen's negative codes)."""
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
    return f"signal {-returncode} ({name})"


class Supervisor:
    """Starts children, restarts those that exit (see the module's docstring), stops them all."""

    def __init__(
        self,
        *,
        launch: Launch,
        policy: RestartPolicy | None = None,
        report: Report = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_s: float = 0.2,
        groups: Groups | None = None,
        leftover_grace_s: float = 5.0,
    ) -> None:
        self.launch = launch
        self.groups = groups or OsGroups()
        self.leftover_grace_s = leftover_grace_s
        self.policy = policy or RestartPolicy()
        self.report = report
        self.clock = clock
        self.sleep = sleep
        self.poll_s = poll_s
        self._children: dict[str, _Child] = {}
        self._stopping = False

    def add(self, spec: ChildSpec) -> None:
        """Own ``spec`` (not started yet)."""
        if spec.name in self._children:
            raise ValueError(f"a child named {spec.name!r} is supervised already")
        self._children[spec.name] = _Child(spec)

    def start(self, name: str) -> Process:
        """Start the child ``name`` now and supervise it (whatever ``launch`` raises, such as
        OSError, goes to the caller)."""
        child = self._children[name]
        child.restart_at = None
        child.started_at = self.clock()  # a start that fails counts as a run of 0 s
        child.proc = self.launch(child.spec)
        child.starts += 1
        again = " again" if child.starts > 1 else ""
        self.report(f"{name}: started{again} (pid {child.proc.pid})")
        return child.proc

    def process(self, name: str) -> Process | None:
        """The child's current process (None while it waits to be started again)."""
        return self._children[name].proc

    def check(self) -> None:
        """One round: note the children that exited (and stop what they left in their group),
        start those whose delay is over and whose group is empty."""
        if self._stopping:
            return
        now = self.clock()
        for name, child in self._children.items():
            if child.proc is not None and (code := child.proc.poll()) is not None:
                child.leftover, child.kill_at = child.proc.pid, now + self.leftover_grace_s
                self._exited(child, f"exited ({exit_described(code)})", now)
                self.groups.signal(child.leftover, signal.SIGTERM)
            if child.leftover is not None:
                self._leftover_stop(child, now)
            if child.leftover is None and child.restart_at is not None and now >= child.restart_at:
                try:
                    self.start(name)
                except Exception as exc:  # noqa: BLE001 (an OSError, or its argv could not be built)
                    self._exited(child, f"could not be started ({exc})", now)

    def _exited(self, child: _Child, what: str, now: float) -> None:
        ran_s = now - child.started_at
        child.failures = 1 if ran_s >= self.policy.stable_s else child.failures + 1
        delay = self.policy.delay(failures=child.failures)
        child.proc = None
        child.restart_at = now + delay
        self.report(
            f"{child.spec.name}: {what} after {ran_s:.1f} s; starting it again in {delay:g} s"
            f" (see its log)"
        )

    def _leftover_stop(self, child: _Child, now: float) -> None:
        """Forget the exited child's group once it is empty; SIGKILL what is still there after
        the grace period."""
        assert child.leftover is not None
        if not self.groups.alive(child.leftover):
            child.leftover = None
        elif now >= child.kill_at:
            self.report(
                f"{child.spec.name}: processes it left were still running after"
                f" {self.leftover_grace_s:g} s; killed them (SIGKILL)"
            )
            self.groups.signal(child.leftover, signal.SIGKILL)
            child.kill_at = float("inf")  # killed once; their end is awaited as any other

    def run(self, *, until: Callable[[], bool] = lambda: False) -> None:
        """Check the children every ``poll_s`` seconds until ``until()`` (or an exception,
        such as the KeyboardInterrupt of Ctrl-C)."""
        while not until():
            self.check()
            self.sleep(self.poll_s)

    def stop_all(self, *, grace_s: float = 10.0) -> None:
        """Stop every child and what it started: SIGTERM to each child's process group (its
        own process may have exited already, leaving others there), SIGKILL to the groups still
        running after ``grace_s`` seconds. Nothing is restarted afterwards."""
        self._stopping = True
        groups = set()
        for child in self._children.values():
            child.restart_at = None
            if child.proc is not None:
                groups.add(child.proc.pid)
            if child.leftover is not None:
                groups.add(child.leftover)
        for group in groups:
            self.groups.signal(group, signal.SIGTERM)
        deadline = self.clock() + grace_s
        while True:
            for child in self._children.values():
                if child.proc is not None:
                    child.proc.poll()  # reaps it, so that it no longer counts in its group
            groups = {g for g in groups if self.groups.alive(g)}
            if not groups or self.clock() >= deadline:
                break
            self.sleep(0.05)
        for group in groups:
            self.groups.signal(group, signal.SIGKILL)
        for child in self._children.values():
            if child.proc is not None:
                child.proc.wait()
