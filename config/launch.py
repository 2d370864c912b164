"""Start one of the live market's programs in place of this process, once what its previous run
left is gone (the command of every program in ``manage.py live_market``'s supervisord file):

    python -m config.launch --pidfile var/run/web.pid [--fresh DIR] [--after URL] -- ARGV...

supervisord starts each program in a process group of its own and stops the whole group, but a
program that dies by itself (uvicorn's main process SIGKILLed, say) leaves its group behind:
uvicorn's workers would keep the port, and every start after it would fail. So before it
executes ARGV this stops the group named in the pid file (SIGTERM, SIGKILL after
``GRACE_S``), writes its own pid there (the group's id: supervisord made it the leader) and,
with ``--fresh``, empties DIR (the web server's ``PROMETHEUS_MULTIPROC_DIR``: the files of
dead workers go). With ``--after URL`` (repeatable) it first waits until each URL answers:
smg drops the replicas that do not answer when it starts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

GRACE_S = 5.0  # how long what a previous run left has to stop after SIGTERM


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id is another user's group now: not ours to stop
        return False
    return True


def leftovers_stop(group: int, grace_s: float = GRACE_S) -> None:
    """Stop every process of ``group`` (SIGTERM, then SIGKILL after ``grace_s``)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_alive(group):
            return
        os.killpg(group, sig)
        deadline = time.monotonic() + grace_s
        while group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.05)


def answers(url: str) -> bool:
    """Whether ``url`` answers HTTP (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pidfile", type=Path, required=True)
    parser.add_argument("--fresh", type=Path, help="a directory to empty before the start")
    parser.add_argument("--after", action="append", default=[], metavar="URL")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    try:
        previous = int(args.pidfile.read_text())
    except (FileNotFoundError, ValueError):
        previous = None
    if os.getpgrp() != os.getpid():  # started by hand: a group of its own, as supervisord does
        os.setpgrp()
    if previous is not None and previous != os.getpid():
        leftovers_stop(previous)
    args.pidfile.parent.mkdir(parents=True, exist_ok=True)
    args.pidfile.write_text(str(os.getpid()))
    if args.fresh is not None:
        shutil.rmtree(args.fresh, ignore_errors=True)
        args.fresh.mkdir(parents=True)
    for url in args.after:
        while not answers(url):
            time.sleep(0.2)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
