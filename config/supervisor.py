"""Child processes kept running: what ``manage.py live_market`` runs its engine and servers under.

A :class:`Supervisor` owns one :class:`ChildSpec` per child (a name and how to start it). Once
started, a child that exits, whatever its exit status, is started again after a delay from the
:class:`RestartPolicy`: 0.5 s, doubled after each exit that follows a short run, at most 30 s,
and back to 0.5 s once a child has stayed up ``stable_s`` seconds. Every exit and every start is
reported. The other children keep running meanwhile: while the engine is down the gateway
answers 503 ``engine_unavailable``, and serves again once it is back.

:meth:`Supervisor.stop_all` stops the children on purpose (SIGTERM to each child's process
group, SIGKILL after a grace period); nothing is restarted after it.

The clock, the sleep and the way a child is started are injected, so the policy is tested
without processes or real time (``tests/scheduler_bridge/test_supervisor.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


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


@dataclass
class _Child:
    spec: ChildSpec
    proc: Process | None = None
    started_at: float = 0.0
    failures: int = 0  # exits in a row after short runs
    restart_at: float | None = None  # when an exited child is to be started again
    starts: int = 0


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
    ) -> None:
        self.launch = launch
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
        """One round: note the children that exited, start those whose delay is over."""
        if self._stopping:
            return
        now = self.clock()
        for name, child in self._children.items():
            if child.proc is not None and (code := child.proc.poll()) is not None:
                self._exited(child, f"exited ({exit_described(code)})", now)
            if child.restart_at is not None and now >= child.restart_at:
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

    def run(self, *, until: Callable[[], bool] = lambda: False) -> None:
        """Check the children every ``poll_s`` seconds until ``until()`` (or an exception,
        such as the KeyboardInterrupt of Ctrl-C)."""
        while not until():
            self.check()
            self.sleep(self.poll_s)

    def stop_all(self, *, grace_s: float = 10.0) -> None:
        """Stop every child: SIGTERM to its process group, SIGKILL to those still there after
        ``grace_s`` seconds. Nothing is restarted afterwards."""
        self._stopping = True
        procs = [c.proc for c in self._children.values() if c.proc is not None]
        for child in self._children.values():
            child.restart_at = None
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()


def _signal_group(proc: Process, sig: int) -> None:
    """Signal the child's process group (children start in sessions of their own, so that
    what they start themselves stops with them)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass  # already gone
