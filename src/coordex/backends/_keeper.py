"""The keeper: ends the sessions coordex started when the host dies without closing.

Run by path, ``python -I -S _keeper.py``, by :mod:`coordex.backends._reap` (standard
library only). It reads lines on fd 0: ``+SID`` (coordex started a process leading
session SID) and ``-SID`` (it has been stopped and reaped), ``=MARK`` and ``~MARK`` (a
prefix of the ``COORDEX_OWNED`` mark that own-interpreter code's processes carry, see
``own/children.py``) and ``*PID START`` (a fork child of that code, by its start
time). It does nothing else while the host lives. At end of file - the
host exited or was killed, and the kernel closed its end of the pipe - every process of
every session still listed gets SIGKILL: its process group first, then any member that
moved to another group of the session.
Processes that left with ``setsid`` are in no listed session and are left alone; then
every listed fork child still running (and what it started), and every process
carrying a listed mark, gets SIGKILL.
"""

import os
import signal
import sys


def live_processes():
    """(pid, process group, session) of every non-zombie process, from /proc.

    "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses, so
    the fields are read after its last ``)``. Also used by :mod:`coordex.backends._reap`.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[0] != b"Z":
            yield int(entry), int(fields[2]), int(fields[3])


def members(sids):
    """Live processes whose session id is in ``sids``."""
    return [pid for pid, _, sid in live_processes() if sid in sids]


def owned(prefixes):
    """Live processes whose environment carries ``COORDEX_OWNED=<one of prefixes>...``:
    what own-interpreter code started (``own/children.py``)."""
    found = []
    keys = [b"COORDEX_OWNED=" + p for p in prefixes]
    for pid, _, _ in live_processes():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        for entry in data.split(b"\0"):
            if any(entry.startswith(k) for k in keys):
                found.append(pid)
                break
    return found


def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def tree(roots):
    """``roots`` and every live descendant of them."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found = set(roots)
    frontier = set(roots)
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def end(sids):
    for sid in sids:
        try:
            os.killpg(sid, signal.SIGKILL)
        except OSError:
            pass
    # A process forking as we go may add a member: a few passes until none is left.
    for _ in range(5):
        left = members(sids)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main():
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    watched = set()
    marks = set()
    forked = {}  # pid -> start time: fork children of own-interpreter code
    pending = b""
    while True:
        try:
            data = os.read(0, 65536)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line[:1] in (b"=", b"~"):  # a mark of own-interpreter sessions
                (marks.add if line[:1] == b"=" else marks.discard)(line[1:])
                continue
            if line[:1] == b"*":  # "*PID START": a fork child of own-interpreter code
                pid, _, start = line[1:].partition(b" ")
                if pid.isdigit():
                    forked[int(pid)] = start
                continue
            try:
                sid = int(line[1:])
            except ValueError:
                continue
            if line[:1] == b"+":
                watched.add(sid)
            elif line[:1] == b"-":
                watched.discard(sid)
    if watched:
        end(watched)
    # Only a pid that still started when it did: never one the kernel gave away since.
    roots = [pid for pid, start in forked.items() if start_time(pid) == start]
    for pid in tree(roots) if roots else ():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for _ in range(3):  # a process forking as we go may add one
        left = owned(marks) if marks else []
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
