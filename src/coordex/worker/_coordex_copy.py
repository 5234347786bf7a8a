"""What makes a read-only copy hold against everything a session holds (SPEC section 1).

Standard library only and valid on CPython 3.8: the environment worker loads it beside
itself, the own interpreter imports it as ``coordex.worker._coordex_copy``, and it runs
as a script for a copy by values. One copy of this logic serves every Python backend.

A read-only copy is made one of two ways:

``"fork"``
    The process holding the session forks; the child is a copy-on-write image of it.
    Before user code runs, the child (:func:`seal_fork_child`) closes the descriptors
    coordex holds (pipes to shells and workers, launcher sockets, protocol pipes:
    no channel back into any session), reopens each writable descriptor of a regular
    file through the protected view (a file in an overlaid folder: its writes are
    discarded) or read-only (writes fail with ``EBADF``), and turns every shared
    writable mapping (``mmap`` of a file, anonymous shared memory) into a private
    copy at the same address, so the session never sees what the copy writes there.
``"values"``
    Where the session has loaded a runtime that does not survive ``fork()`` (polars'
    thread pool, duckdb, grpc, torch: see :data:`FORK_UNSAFE`), a fork child would hang
    on it. Instead the session's values are pickled (:func:`pack_values`) and carried
    into a fresh interpreter of the same environment, started by :func:`start_values_copy`,
    which runs this file as a script: it protects the disk first (still single-threaded),
    then loads the values and runs the cell. Names that cannot be pickled, or refer to
    classes and functions defined in the session itself, stay behind and are listed in
    ``isolation["left_out"]``.

Either copy talks to the process that made it over a private pipe pair (the *link*),
in the lines of ``_coordex_protocol``: ``copy_ready`` (which protections held, sent
before user code runs, so a copy that times out or dies still reports them),
``capability_call``/``capability_result`` (capabilities run in the agent's process, never
in the copy) and ``done``. The parent reads them with :class:`LinkReader`, which skips
lines that are not valid messages: the copy can garble its own link, not its parent.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from typing import Any, Dict, Iterable, List, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:
    from . import _coordex_engine as engine
    from . import _coordex_protocol as wire
else:  # loaded by path (the worker) or run as a script (a copy by values)
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import _coordex_engine as engine  # type: ignore[no-redef]
    import _coordex_protocol as wire  # type: ignore[no-redef]

# Libraries whose runtime breaks in a fork child, with why. polars is unsafe only once
# its pool has started (its threads are named ``polars-N``; imported but unused, a fork
# child starts a pool of its own); for the others a loaded module counts, since their
# threads cannot be told apart and a wrong guess hangs the copy.
FORK_UNSAFE = {
    "polars": "polars' thread pool does not exist in a fork child",
    "duckdb": "duckdb's thread pool and global state are not fork-safe",
    "grpc": "grpc's threads do not survive fork()",
    "torch": "torch's OpenMP thread pool does not survive fork()",
}
_POOL_THREADS = {"polars": "polars-"}  # library -> name prefix of its pool's threads


def fork_unsafe_runtimes(modules: Optional[Dict[str, Any]] = None) -> List[str]:
    """The loaded libraries of :data:`FORK_UNSAFE` (sorted); empty when fork is safe."""
    modules = sys.modules if modules is None else modules
    found = [name for name in FORK_UNSAFE if name in modules]
    if not found:
        return []
    if "grpc" in found and os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").lower() in (
            "1", "true"):
        found.remove("grpc")  # grpc re-creates its threads in the child itself
    pooled = [name for name in found if name in _POOL_THREADS]
    if pooled:
        threads = _thread_names()
        found = [name for name in found if name not in _POOL_THREADS or any(
            _is_pool_thread(t, _POOL_THREADS[name]) for t in threads)]
    return sorted(found)


def _is_pool_thread(name: str, prefix: str) -> bool:
    # ``polars-0``, ``polars-1``...: not ``polars-ooc-clea``, which import alone starts.
    return name.startswith(prefix) and name[len(prefix):len(prefix) + 1].isdigit()


def _thread_names() -> List[str]:
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return [prefix + "0" for prefix in _POOL_THREADS.values()]  # cannot tell: assume started
    for task in tasks:
        try:
            with open("/proc/self/task/%s/comm" % task) as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return names


# -- descriptors coordex holds (host side: own interpreter) ----------------------------

# fd -> (st_dev, st_ino): what coordex opened and a copy must not inherit. The identity
# is checked in the child, so a number closed and reused by the user is never touched.
_HELD: Dict[int, Tuple[int, int]] = {}


def hold(*fds: int) -> None:
    """Note descriptors coordex holds (pipes to shells and workers, sockets)."""
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        _HELD[fd] = (st.st_dev, st.st_ino)


def release(*fds: Optional[int]) -> None:
    """Forget descriptors about to be closed."""
    for fd in fds:
        if fd is not None:
            _HELD.pop(fd, None)


def close_held(keep: Iterable[int] = ()) -> None:
    """In a fork child: close every descriptor :func:`hold` noted that is still the same."""
    keep = set(keep)
    for fd, identity in list(_HELD.items()):
        if fd in keep:
            continue
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == identity:
            try:
                os.close(fd)
            except OSError:
                pass
    _HELD.clear()


# -- in a fork child: descriptors and mappings ----------------------------------------

_REOPEN_DROP = os.O_CREAT | os.O_EXCL | os.O_TRUNC


def seal_descriptors(keep: Iterable[int], discarded: bool) -> None:
    """Reopen every descriptor of a regular file so the disk and the session keep nothing.

    With ``discarded`` (overlays are mounted) a writable file whose path now leads into
    an overlay is reopened there with its old flags and offset: the code's writes land
    in the throwaway layer. Every other one is reopened read-only at the same offset, so
    writes fail, and so the copy's reads move its own file position, not the session's.
    Every channel to another process (:func:`_is_channel`: a pipe, a unix socket, a
    pseudo-terminal, an epoll instance, an eventfd or pidfd) is replaced by a read-only
    ``/dev/null`` under the same number: reads see end of file, writes fail with
    ``EBADF``, so the copy cannot drive a process the session started, nor reach
    coordex through a descriptor nobody held. Network sockets and other devices are left
    as they are. Run after protection.
    """
    import fcntl

    keep = set(keep)
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        if fd in keep:
            continue
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            st = os.fstat(fd)
        except OSError:
            continue  # the listing's own descriptor, or already closed
        if not stat.S_ISREG(st.st_mode):
            if _is_channel(fd, st.st_mode):
                _replace_with_null(fd)
            continue
        try:
            offset = os.lseek(fd, 0, os.SEEK_CUR)
        except OSError:
            offset = 0
        replacement = -1
        if flags & os.O_ACCMODE == os.O_RDONLY:
            # Still reopened: a descriptor the fork shares has one file position, so
            # reading in the copy would move the session's.
            pass
        elif discarded:
            replacement = _reopen_through_overlay(fd, flags, st)
        if replacement < 0:
            try:
                replacement = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                replacement = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if offset:
                os.lseek(replacement, offset, os.SEEK_SET)
            inheritable = not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
            os.dup2(replacement, fd, inheritable=inheritable)
        except OSError:
            # A file that cannot be reopened where it was (a /proc file of a process
            # that has gone, ESRCH): nothing, rather than the session's descriptor.
            _replace_with_null(fd)
        finally:
            os.close(replacement)


def _is_channel(fd: int, mode: int) -> bool:
    """Whether ``fd`` leads to another process rather than to a file or the network."""
    if stat.S_ISFIFO(mode):
        return True
    if stat.S_ISSOCK(mode):
        import socket

        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            return True
        try:
            return sock.family not in (socket.AF_INET, socket.AF_INET6)
        finally:
            sock.detach()
    try:
        target = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return False
    # epoll (a copy could add its descriptors to the host's set), eventfd, pidfd
    # (pidfd_send_signal), signalfd, inotify; a pseudo-terminal's either end.
    return target.startswith(("anon_inode:", "/dev/pts/")) or target == "/dev/ptmx"


def _replace_with_null(fd: int) -> None:
    import fcntl

    try:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        inheritable = not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        os.dup2(null, fd, inheritable=inheritable)
    except OSError:
        pass
    finally:
        os.close(null)


# -- in a copy: System V shared memory and background children ---------------------------

_CLONE_NEWIPC = 0x08000000
_PR_SET_CHILD_SUBREAPER = 36


def wall_off_sysv() -> bool:
    """Make the System V segments of this machine unreachable from the copy.

    Segments it has attached are made private by :func:`privatize_shared_mappings`;
    this stops it from attaching one again (``shmat(shmid)``) and writing the session's
    memory through it: a private IPC namespace where the copy may make one (root, or a
    user namespace from protection), else a check that no segment is attachable.
    Returns whether that held (``objects`` is false otherwise).
    """
    try:
        listed = _read_proc("/proc/sysvipc/shm").count("\n") > 1
    except OSError:
        listed = False  # no SysV IPC in this kernel, or no /proc: nothing to reach
    if not listed:
        return True
    try:
        if _libc().unshare(_CLONE_NEWIPC) == 0:
            return True
    except (AttributeError, OSError):
        pass
    return not _attachable_sysv()


def _attachable_sysv() -> bool:
    """Whether a System V segment listed in /proc lets this process attach it."""
    try:
        lines = _read_proc("/proc/sysvipc/shm").splitlines()[1:]
    except OSError:
        return False
    uid = os.geteuid()
    groups = set(os.getgroups()) | {os.getegid()}
    for line in lines:
        fields = line.split()
        if len(fields) < 12:
            continue
        perms = int(fields[2], 8)
        owner, group, creator, creator_group = (int(f) for f in fields[8:12])
        if uid == 0 or uid in (owner, creator):
            return True
        if (perms & 0o060) and groups & {group, creator_group}:
            return True
        if perms & 0o006:
            return True
    return False


def adopt_orphans() -> None:
    """In a copy, before user code: orphans of what it starts become its children
    (``PR_SET_CHILD_SUBREAPER``), so :func:`end_descendants` finds every one, those that
    left with ``setsid`` or a double fork included."""
    try:
        _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (AttributeError, OSError):
        pass


def end_descendants(settle: float = 2.0) -> int:
    """In a copy whose code ended: SIGKILL every process it started, and reap them.

    A background child would otherwise keep the copy's output pipes open (the call
    returned only at its timeout) and go on running after the call. Returns how many
    were ended. Costs one listing of this process's children when there are none.
    """
    import signal
    import time

    ended = set()  # type: set
    deadline = time.monotonic() + settle
    while True:
        _reap_all()
        found = descendants(os.getpid())
        if not found:
            return len(ended)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.add(pid)
            except OSError:
                pass
        if time.monotonic() > deadline:
            return len(ended)
        time.sleep(0.001)


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return


def _children(pid: int) -> List[int]:
    found = []  # type: List[int]
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in _read_proc("/proc/%d/task/%s/children" % (pid, task)).split()]
        except (OSError, ValueError):
            pass
    return found


def descendants(pid: int) -> List[int]:
    """Every live descendant of ``pid``, parents before their children."""
    found = []  # type: List[int]
    frontier = _children(pid)
    while frontier:
        found += frontier
        nxt = []  # type: List[int]
        for child in frontier:
            nxt += _children(child)
        frontier = [p for p in nxt if p not in found]
    return found


def _libc() -> Any:
    return _memory_calls()


def _reopen_through_overlay(fd: int, flags: int, st: Any) -> int:
    """The file reopened by its path if that path now leads into an overlay, else -1."""
    try:
        path = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return -1
    if not path.startswith("/") or path.endswith(" (deleted)"):
        return -1
    try:
        new = os.open(path, (flags & ~_REOPEN_DROP) | os.O_CLOEXEC)
    except OSError:
        return -1  # refused (Landlock): outside the overlaid folders
    try:
        if os.fstat(new).st_dev != st.st_dev:
            return new  # another filesystem: the overlay
    except OSError:
        pass
    os.close(new)  # the same file as before: writes would reach the disk
    return -1


_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_PRIVATE, _MAP_ANONYMOUS = 0x02, 0x20
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
# A line of /proc/self/maps for a shared mapping: start, end, perms ("rw-"), the rest.
_SHARED_MAP = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ([r-][w-][x-])s(.*)$", re.MULTILINE)
# Read-only shared maps up to this size in all are made private without asking smaps.
COPY_READ_ONLY_LIMIT = 16 << 20


def privatize_shared_mappings() -> bool:
    """Make every writable shared mapping a private copy at the same address.

    Each region's bytes are copied into a new private anonymous mapping, which
    ``mremap`` then moves over the old one in a single step; Python objects that point
    there (``mmap.mmap``, numpy memmaps) keep working on the copy. Returns False when
    a shared writable mapping had to stay shared (a device mapping, or a failure):
    then in-place writes there reach the session and ``objects`` must be false.
    """
    try:
        text = _read_proc("/proc/self/maps")
    except OSError:
        return False
    regions = []  # type: List[Tuple[int, int, str, str]]
    read_only = []  # type: List[Tuple[int, int, str, str]]  # mprotect could make writable
    # Only shared lines are split: in a fork child every string made costs faults.
    for found in _SHARED_MAP.finditer(text):
        start, end, perms, rest = found.groups()
        fields = rest.split(None, 3)
        path = fields[3].strip() if len(fields) > 3 else ""
        (regions if perms[1] == "w" else read_only).append(
            (int(start, 16), int(end, 16), perms, path))
    if read_only:
        # Copying a small read-only map (glibc's gconv cache, 28 KiB, is in most
        # processes) costs microseconds; asking /proc/self/smaps whether mprotect could
        # make it writable costs milliseconds in a large process, since smaps walks the
        # pages of every mapping. So readable ones are copied while they are small in
        # all, and smaps is read only for the rest (large, unreadable or device maps).
        copied = [r for r in read_only if r[2][0] == "r" and not _is_device(r[3])]
        if sum(end - start for start, end, _, _ in copied) <= COPY_READ_ONLY_LIMIT:
            regions += copied
            read_only = [r for r in read_only if r not in copied]
        if read_only:
            regions += _may_become_writable(read_only)
    if not regions:
        return True
    import ctypes

    libc = _memory_calls()
    failed = ctypes.c_void_p(-1).value
    complete = True
    for start, end, perms, path in regions:
        if _is_device(path) or perms[0] != "r":
            complete = False  # device memory cannot be copied; write-only cannot be read
            continue
        size = end - start
        prot = (_PROT_READ | (_PROT_WRITE if perms[1] == "w" else 0)
                | (_PROT_EXEC if perms[2] == "x" else 0))
        fresh = libc.mmap(None, size, _PROT_READ | _PROT_WRITE,
                          _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0)
        if fresh in (None, failed):
            complete = False
            continue
        ctypes.memmove(fresh, start, size)
        moved = libc.mremap(fresh, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, start)
        if moved != start:
            libc.munmap(ctypes.c_void_p(fresh), ctypes.c_size_t(size))
            complete = False
            continue
        libc.mprotect(start, size, prot)
    return complete


_LIBC = None  # type: Any  # libc with mmap, mremap and mprotect typed: see prepare()


def _memory_calls() -> Any:
    global _LIBC
    if _LIBC is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.mremap.restype = ctypes.c_void_p
        libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                ctypes.c_int, ctypes.c_void_p]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _LIBC = libc
    return _LIBC


def prepare() -> None:
    """In the process that forks copies, before a fork: set up once what each copy
    would set up again (libc's memory calls, ~0.2 ms in a fork child)."""
    _memory_calls()


def _read_proc(path: str) -> str:
    """A /proc file's text, read unbuffered: in a fork child a text stream's buffers
    and decoder cost more (in copy-on-write faults) than the read itself."""
    with open(path, "rb", buffering=0) as raw:
        return raw.readall().decode("utf-8", "surrogateescape")


def _is_device(path: str) -> bool:
    return path.startswith("/dev/") and not path.startswith(("/dev/shm/", "/dev/zero"))


def _may_become_writable(regions: List[Tuple[int, int, str, str]],
                         ) -> List[Tuple[int, int, str, str]]:
    """The read-only shared ``regions`` that ``mprotect`` could make writable (their file
    was opened for writing: ``mw`` in smaps' VmFlags). Read only when such regions
    exist, since smaps costs more than maps."""
    wanted = {start: (start, end, perms, path) for start, end, perms, path in regions}
    found = []
    current = None
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    try:
                        current = int(head.split("-", 1)[0], 16)
                    except ValueError:
                        current = None
                elif head == "VmFlags:" and current in wanted and " mw" in line:
                    found.append(wanted[current])
    except OSError:
        return list(regions)  # cannot tell: copy them all rather than leave one shared
    return found


# -- the link between a copy and the process that made it ------------------------------


class Link:
    """The copy's end: JSON lines out on ``out_fd``, capability results in on ``in_fd``."""

    def __init__(self, out_fd: int, in_fd: int) -> None:
        self.out_fd = out_fd
        self.reader = wire.LineReader(in_fd)
        self._next = 0

    def send(self, msg: Dict[str, Any]) -> None:
        view = memoryview(wire.encode(msg))
        while view:
            view = view[os.write(self.out_fd, view):]

    def call_capability(self, name: str, args: Any, kwargs: Any) -> Dict[str, Any]:
        self._next += 1
        call_id = "copy-%d" % self._next
        self.send(wire.message("capability_call", id=call_id, name=name, args=args,
                               kwargs=kwargs))
        while True:
            line = self.reader.read_line()
            if line is None:
                return {"error": {"type": "CapabilityError",
                                  "message": "the session's process went away"}}
            msg = wire.decode(line)
            if msg["type"] == "capability_result" and msg["id"] == call_id:
                return msg


class CapabilityStub:
    """A capability name in a copy: calling it runs the capability in the agent's process."""

    def __init__(self, name: str, link: Link) -> None:
        self.__name__ = self.__qualname__ = name
        self._link = link
        self.__doc__ = ("Host capability %r: runs in the agent's process, also from a "
                        "read-only copy. Arguments and the result must be plain values (%s)."
                        % (name, wire.PLAIN_TYPES))

    def __repr__(self) -> str:
        return "<capability %r (runs in the agent's process)>" % self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.__name__
        reply = self._link.call_capability(
            name, wire.to_wire(list(args), "capability %r argument" % name),
            wire.to_wire(kwargs, "capability %r keyword argument" % name))
        error = reply.get("error")
        if error is not None:
            raise RuntimeError("capability %r failed in the agent's process: %s: %s"
                               % (name, error.get("type", "Error"), error.get("message", "")))
        return wire.from_wire(reply.get("value"))


def answer_capability(msg: Dict[str, Any], call: Any) -> Dict[str, Any]:
    """The ``capability_result`` for a copy's ``capability_call``; ``call(name, args, kwargs)``."""
    try:
        value = call(str(msg["name"]), list(wire.from_wire(msg["args"])),
                     dict(wire.from_wire(msg["kwargs"])))
        return wire.message("capability_result", id=msg["id"],
                            value=wire.to_wire(value, "the result of capability %r"
                                               % msg["name"]))
    except Exception as exc:
        return wire.message("capability_result", id=msg["id"],
                            error={"type": type(exc).__name__, "message": str(exc)})


class LinkReader:
    """The parent's end: whole, valid messages from what the copy wrote (others skipped)."""

    def __init__(self) -> None:
        self._lines = wire.LineReader(-1)

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        found = []
        for line in self._lines.feed(data):
            try:
                found.append(wire.decode(line, wire.WORKER_TO_HOST))
            except wire.ProtocolError:
                continue  # the copy's code wrote to its own link: only the copy suffers
        return found


def interrupt_on_sigint() -> None:
    """In a copy: SIGINT (a timeout or a cancel) raises ``engine.Interrupt`` in the code."""
    # The C module: signal.signal's enum conversions cost a fork child ~0.1 ms of faults.
    import _signal

    _signal.signal(_signal.SIGINT, _raise_interrupt)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise engine.Interrupt


def run_cell(code: str, namespace: Dict[str, Any], output_limit: int) -> Dict[str, Any]:
    """``engine.run_cell``, with an interrupt that lands outside the engine reported too."""
    outcome = None
    try:
        outcome = engine.run_cell(code, namespace, output_limit)
    except KeyboardInterrupt:
        pass
    if outcome is None:
        outcome = {"result": None, "interrupted": True, "images": [],
                   "error": {"exception": "KeyboardInterrupt", "message": "",
                             "traceback": "KeyboardInterrupt\n"}}
    return outcome


def step_aside() -> None:
    """In a copy that has sent its ``done``: run on at idle priority from here on.

    Exiting tears down the copy's copy-on-write image (milliseconds for a large
    session), and on a busy machine that ran on the CPU the waiting parent was woken
    on, before it: the parent read the ``done`` ~4 ms late. At idle priority the
    teardown waits for a free CPU instead.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass  # not Linux: the parent just waits for the CPU


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# -- a copy by values --------------------------------------------------------------------

_HIDDEN = ("__builtins__", "_")


def pack_values(namespace: Dict[str, Any], skip: Iterable[str] = ()) -> Tuple[bytes, List[str]]:
    """Pickle the session's user names; returns (the pickle, names left out, sorted).

    All names go in one pickle so objects shared between names stay shared; only when
    that fails is each name tried alone to find the ones that cannot travel. Classes
    and functions defined in the session (module ``__main__``) and their instances are
    left out: a fresh process has no ``__main__`` that defines them.
    """
    import io
    import pickle

    skip = set(skip)
    names = [n for n in namespace if n not in skip and n not in _HIDDEN
             and not (n.startswith("__") and n.endswith("__"))]

    class _Pickler(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            kind = obj if isinstance(obj, type) else type(obj)
            module = getattr(obj, "__module__", None) if callable(obj) else None
            if getattr(kind, "__module__", None) == "__main__" or module == "__main__":
                raise pickle.PicklingError("defined in the session")
            return NotImplemented

    def dumps(values: Dict[str, Any]) -> bytes:
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(values)
        return buffer.getvalue()

    import types

    # Modules travel by name and are imported again in the copy.
    modules = {n: namespace[n].__name__ for n in names
               if isinstance(namespace[n], types.ModuleType)}
    values = {n: namespace[n] for n in names if n not in modules}
    try:
        return dumps({"modules": modules, "values": values}), []
    except Exception:
        pass
    left_out = []
    for name in list(values):
        try:
            dumps({name: values[name]})
        except Exception:
            left_out.append(name)
            del values[name]
    return dumps({"modules": modules, "values": values}), sorted(left_out)


def start_values_copy(python: str, payload: Dict[str, Any], stdout: int, stderr: int,
                      env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
                      ) -> Tuple[Any, int, int]:
    """Start a fresh ``python`` running this file; returns (process, link out, link in).

    ``payload`` (pickled to the child's first link bytes): ``values`` (from
    :func:`pack_values`), ``code``, ``output_limit``, ``protect``, ``scratch``,
    ``capabilities`` (names), ``sys_path``. The child inherits no descriptor but its
    output pipes and its link; it stays in its parent's process group, so whatever
    ends that group (a worker's close) ends the copy too.
    """
    import pickle
    import struct
    import subprocess

    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    argv = [python, "-u", "-I", os.path.abspath(__file__), str(to_child_r), str(from_child_w)]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                pass_fds=(to_child_r, from_child_w), env=env, cwd=cwd)
    except BaseException:
        for fd in (to_child_w, from_child_r):
            os.close(fd)
        raise
    finally:
        os.close(to_child_r)
        os.close(from_child_w)
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        write_all(to_child_w, struct.pack("!Q", len(data)) + data)
    except OSError:
        pass  # it died at once; its exit status tells
    return proc, from_child_r, to_child_w


def _read_exact(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the session's process closed the link")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _load_isolation() -> Any:
    """backends/isolation.py, loaded by path once (it keeps the copy's overlay handles)."""
    import importlib.util

    loaded = sys.modules.get("_coordex_isolation")
    if loaded is not None:
        return loaded
    path = os.path.join(os.path.dirname(_HERE), "backends", "isolation.py")
    spec = importlib.util.spec_from_file_location("_coordex_isolation", path)
    if spec is None or spec.loader is None:
        raise ImportError("no module at %r" % path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["_coordex_isolation"] = module
    return module


def _values_main(in_fd: int, out_fd: int) -> int:
    """A copy by values: protect, load the values, run the cell, report over the link."""
    import pickle
    import struct
    import types

    interrupt_on_sigint()
    adopt_orphans()
    link = Link(out_fd, in_fd)
    size = struct.unpack("!Q", _read_exact(in_fd, 8))[0]
    payload = pickle.loads(_read_exact(in_fd, size))
    sys.path[:] = payload["sys_path"]
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(encoding="utf-8", errors="backslashreplace")
    files = "none"
    if payload.get("scratch"):
        for name in ("TMPDIR", "TMP", "TEMP"):
            os.environ[name] = payload["scratch"]
        try:  # still one thread: nothing is loaded yet that could start one
            files = _load_isolation().protect(payload.get("protect") or [], payload["scratch"])
        except Exception as exc:
            sys.stderr.write("coordex: file protection failed (%s: %s)\n"
                             % (type(exc).__name__, exc))
    left_out = list(payload.get("left_out") or [])
    module = types.ModuleType("__main__")
    namespace = module.__dict__
    import builtins

    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = module
    try:
        packed = pickle.loads(payload["values"])
    except Exception as exc:
        sys.stderr.write("coordex: the session's values could not be loaded (%s: %s)\n"
                         % (type(exc).__name__, exc))
        packed = {"modules": {}, "values": {}}
    import importlib

    for name, module_name in packed["modules"].items():
        try:
            namespace[name] = importlib.import_module(module_name)
        except Exception:
            left_out.append(name)
    namespace.update(packed["values"])
    for name in payload.get("capabilities") or []:
        namespace[name] = CapabilityStub(name, link)
    isolation = {"names": True, "objects": wall_off_sysv(), "files": files,
                 "copy": "values", "left_out": left_out}
    link.send(wire.message("copy_ready", isolation=isolation))
    before = dict(namespace)
    outcome = run_cell(payload["code"], namespace, payload["output_limit"])
    # What the copy changed, for the call log: the session itself never sees it.
    outcome["rebound"], outcome["deleted"] = engine.changed_names(before, namespace)
    if files == "discarded":
        outcome["written"] = _load_isolation().written()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    outcome.update(type="done", id="copy", isolation=isolation)
    end_descendants()  # what the code started ends with the copy
    link.send(outcome)
    return 0


if __name__ == "__main__":
    _code = 70
    try:
        _code = _values_main(int(sys.argv[1]), int(sys.argv[2]))
    finally:
        os._exit(_code)
