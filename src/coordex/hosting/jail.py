"""The jail a confined host runs in (SPEC section 9): namespaces, mounts, Landlock, limits.

The host program (:mod:`.host`) calls these in order, single-threaded, before it imports
the Executor. Four processes make one host, five with an environments folder::

    keeper (outside)  --fork-->  warden (makes the jail)  --fork-->  init (pid 1 inside)
                                    init  --fork-->  builder (writes environments)
                                          --fork-->  host (runs the Executor)

``namespaces+landlock`` (user namespaces work):
    the keeper makes and joins the host's cgroups (:func:`make_limits`,
    :func:`join_cgroups`; rlimits where no cgroup can be had) and forks the *warden*,
    which unshares a user, mount, pid, IPC and UTS namespace (and a network namespace
    with ``network=False``) and builds the file view by allow-list (:mod:`.view`: a new
    root holding only what the host was given). A root server runs each tenant as a user
    of its own (:mod:`.identity`): the keeper writes the warden's identity map, and the
    warden takes that user before it forks anything. The warden's child is the pid
    namespace's init. The init forks the builder first, which enters the view with only
    the environments folder writable and restricts itself with Landlock
    (:func:`builder_spec`); each process a build starts gets a nested domain of its own
    that writes only that build's folder (:func:`confine_build_step`). The init then
    enters the view itself (everything read-only but the tenant's folders, ``/tmp`` and
    ``/dev/shm``; the environments folder read-only even inside those), with a ``/proc``
    of the new pid namespace (no process outside is visible, so none can be signalled,
    traced, reniced or read) and loopback up in an empty network namespace.
    The host then restricts itself with Landlock (:func:`restrict`): writes only
    beneath its folders, ``/tmp``, ``/dev/shm`` and a few devices; signals and abstract
    unix sockets scoped to its own processes (ABI 6); a seccomp filter refuses to change
    the limits, priority or CPU affinity of any process but the caller; and every
    capability goes, so no mount can be changed any more.
``landlock`` (no user namespaces, Landlock ABI >= 6):
    no new view; Landlock refuses reads as well as writes outside the same allow-list
    (:func:`.view.landlock_reads`; the environments folder for reads only, writable to
    the builder alone), scopes signals and abstract sockets, and the same seccomp
    filter keeps the limits, priority and affinity of other processes out of reach. A
    root server still runs each tenant as its own user. A hidden path that lies beneath
    an allowed one cannot be hidden this way, so the level is only claimed when none
    does. What this level cannot stop (no /proc of its own: command lines stay
    readable) is in the README's threat model.
``none``:
    nothing holds; the server says so and refuses several tenants.

Who reaps: the init process waits for every orphan in the pid namespace; when it ends
the kernel kills what is left there. The keeper ends init when its lifeline (a pipe
whose other end the owner holds) closes, so a dead owner takes its hosts with it.

Linux only; standard library only (the cluster starts this on nodes where coordex is
installed but nothing else can be assumed).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import stat
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..backends import isolation as iso

Level = Literal["namespaces+landlock", "landlock", "none"]
LEVELS: tuple[Level, ...] = ("namespaces+landlock", "landlock", "none")

_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_M_ARENA_MAX = -8  # mallopt

_LL_EXECUTE = 1 << 0
_LL_READ_FILE = 1 << 2
_LL_READ_DIR = 1 << 3
_LL_READ = _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR
_LL_IOCTL_DEV = 1 << 15  # ABI 5

# Devices the code may write (terminals and sinks), as for read-only calls. At the
# ``landlock`` level the machine's /dev/pts is shared by every tenant (and the kernel
# checks a new terminal's other end against Landlock like a path): there a host gets no
# pseudo-terminal at all, rather than a way into another tenant's.
# Never ``/dev/tty``: it is whatever terminal controls the opener, and nothing in a jail
# may reach the server's (the jail's processes are in a session of their own, with no
# controlling terminal; a terminal the tenant makes in its own devpts is its own).
DEVICES = tuple(d for d in iso._DEVICES if d != "/dev/tty")
LANDLOCK_DEVICES = tuple(d for d in DEVICES if d not in ("/dev/pts", "/dev/ptmx"))


@dataclass(frozen=True)
class JailSpec:
    """What one host may see and use.

    Attributes:
        folder: the working folder and home; writable.
        writable: further folders of the tenant (its data root when that is elsewhere).
        hidden: folders and files never shown, even where they lie beneath a folder
            that is (the server's root, its tokens file).
        readable: folders and files the host reads beyond the system's (the Python
            installation, coordex itself, what the operator names with ``--readable``):
            bound read-only into the view, or allowed by Landlock.
        network: False leaves only loopback (a network namespace of its own).
        tmpfs_size: bytes each private ``/tmp`` and ``/dev/shm`` may hold (None: the
            kernel's default, half of RAM). Files there are memory, and an rlimit does
            not count them, so without a bound a host could fill the machine's memory.
        environments: the folder of the tenant's built environments (with their store
            and uv cache). The host sees it read-only; only the builder process (see
            :func:`seal_for_builder`, :func:`builder_spec`) may write there.
        user: (uid, gid, name) the jail runs as where the server is root; None keeps
            the server's user.
        records: the folder of the host's call log and stored functions, written by
            its owner: read-only in the view (and to the builder), readable by Landlock.
        own_network: with ``network=False`` at the ``landlock`` level, whether the
            warden could give it an empty network namespace (root can without a user
            namespace); if not, IPv4 and IPv6 sockets are refused outright.
    """

    folder: str
    writable: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    network: bool = True
    tmpfs_size: int | None = None
    environments: str | None = None
    user: tuple[int, int, str] | None = None
    records: str | None = None
    own_network: bool = False  # an empty network namespace was made for it (landlock, root)


@dataclass(frozen=True)
class Limits:
    memory: int | None = 4 << 30
    processes: int | None = 512
    name: str = "host"


@dataclass
class LimitReport:
    memory: str = "none"  # "cgroup", "rlimit" or "none": what holds the memory limit
    processes: str = "none"
    cgroups: list[str] = field(default_factory=list)
    limit_memory: int | None = None
    limit_processes: int | None = None


# ------------------------------------------------------------------------ levels

def best_level() -> Level:
    """The strongest level this machine gives, from the cached isolation probe.

    ``COORDEX_ISOLATION_FORCE=refused`` (see :func:`isolation.force_unavailable`) acts
    as if user namespaces were blocked, ``none`` as if Landlock were missing too.
    """
    if not sys.platform.startswith("linux"):
        return "none"
    ceiling = iso.forced_ceiling()
    abi = iso.landlock_abi()
    if ceiling == "none" or abi < 3:
        return "none"
    if ceiling == "discarded" and iso.probe()["userns"]:
        return "namespaces+landlock"
    # Without namespaces only Landlock's signal scoping (ABI 6) keeps signals inside.
    return "landlock" if abi >= 6 else "none"


def forced_level() -> Level:
    """The strongest level ``COORDEX_ISOLATION_FORCE`` and Landlock's presence allow,
    without probing user namespaces (the caller knows they work)."""
    ceiling = iso.forced_ceiling()
    abi = iso.landlock_abi()
    if ceiling == "none" or abi < 3:
        return "none"
    if ceiling == "discarded":
        return "namespaces+landlock"
    return "landlock" if abi >= 6 else "none"


def landlock_covers(spec: JailSpec) -> bool:
    """True when no hidden path lies beneath a path the ``landlock`` level must allow,
    and the environments folder lies beneath no writable one (Landlock only adds
    rights beneath a folder: it cannot make a part of a writable folder read-only)."""
    from .view import landlock_reads

    own = [spec.folder, *spec.writable]
    allowed = [*landlock_reads(spec.readable), *own,
               *([spec.environments] if spec.environments else [])]
    if spec.environments and any(iso._within(os.path.realpath(spec.environments),
                                             os.path.realpath(w)) for w in own):
        return False
    return not any(iso._within(os.path.realpath(h), os.path.realpath(a))
                   for h in spec.hidden for a in allowed if os.path.exists(a))


# ------------------------------------------------------------------------ limits

def _cgroup_base(controller: str) -> str | None:
    """A writable cgroup folder for ``controller`` (v1 hierarchy or delegated v2)."""
    v1 = f"/sys/fs/cgroup/{controller}"
    if os.path.isdir(v1):
        return v1 if os.access(v1, os.W_OK) else None
    try:  # v2: our own group, if it was delegated to us
        with open("/proc/self/cgroup") as f:
            line = next((x for x in f if x.startswith("0::")), "")
    except OSError:
        return None
    own = "/sys/fs/cgroup" + line[3:].strip()
    if line and os.access(own, os.W_OK) and os.path.exists(os.path.join(own, "cgroup.procs")):
        with contextlib.suppress(OSError), open(os.path.join(own, "cgroup.controllers")) as f:
            if controller in f.read().split():
                return own
    return None


def _make_cgroup(controller: str, name: str, settings: dict[str, int]) -> str | None:
    base = _cgroup_base(controller)
    if base is None:
        return None
    path = os.path.join(base, "coordex", f"{name}-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        for key, value in settings.items():
            iso._write(os.path.join(path, key), str(value))
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return None
    return path


def make_limits(limits: Limits) -> LimitReport:
    """Make the host's cgroups (joined later by :func:`join_cgroups`); say what holds.

    A cgroup where the machine lets us make one (v1 ``memory``/``pids`` hierarchies as
    root, or a delegated v2 group); else per-process rlimits, set by
    :func:`apply_rlimits`: ``RLIMIT_AS`` for memory (each process may take the whole
    limit) and ``RLIMIT_NPROC`` (see :func:`apply_process_rlimit`; root is not held by
    it).
    """
    report = LimitReport(limit_memory=limits.memory, limit_processes=limits.processes)
    if limits.memory:
        v1 = os.path.isdir("/sys/fs/cgroup/memory")
        key = "memory.limit_in_bytes" if v1 else "memory.max"
        path = _make_cgroup("memory", limits.name, {key: limits.memory})
        if path is not None:
            report.memory = "cgroup"
            report.cgroups.append(path)
            if v1:  # without swap accounting this file is absent; swap off is then moot
                with contextlib.suppress(OSError):
                    iso._write(os.path.join(path, "memory.memsw.limit_in_bytes"),
                               str(limits.memory))
        else:
            report.memory = "rlimit"
    if limits.processes:
        path = _make_cgroup("pids", limits.name, {"pids.max": limits.processes})
        if path is not None:
            report.processes = "cgroup"
            report.cgroups.append(path)
        elif os.geteuid() != 0:
            report.processes = "rlimit"
    return report


def join_cgroups(report: LimitReport, pid: int) -> None:
    """Move ``pid`` into the cgroups; a limit whose group refuses it falls to an rlimit."""
    for path in list(report.cgroups):
        try:
            iso._write(os.path.join(path, "cgroup.procs"), str(pid))
        except OSError:
            report.cgroups.remove(path)
            with contextlib.suppress(OSError):
                os.rmdir(path)
            if "/memory" in path:
                report.memory = "rlimit"
            else:
                report.processes = "rlimit" if os.geteuid() != 0 else "none"


def apply_rlimits(report: LimitReport) -> None:
    """Set the memory rlimit :func:`make_limits` chose, in the process about to start the
    jail (the process rlimit comes later: :func:`apply_process_rlimit`)."""
    import resource

    if report.memory == "rlimit" and report.limit_memory:
        resource.setrlimit(resource.RLIMIT_AS, (report.limit_memory, report.limit_memory))
        # RLIMIT_AS counts address space reserved, not used: glibc reserves 64 MiB per
        # thread for a malloc arena of its own, so a host of a few threads reached a
        # 256 MiB limit without using it. Two arenas (for this process and what it forks,
        # and through the variable for what they start) keep the limit about memory.
        with contextlib.suppress(OSError, AttributeError):
            iso._libc().mallopt(_M_ARENA_MAX, 2)
        os.environ.setdefault("MALLOC_ARENA_MAX", "2")


def apply_process_rlimit(report: LimitReport) -> None:
    """Set ``RLIMIT_NPROC`` where :func:`make_limits` chose it, after
    :func:`enter_namespaces` where the level has namespaces.

    The kernel counts processes per user *and user namespace* (Linux >= 5.14) and holds
    a namespace's share of its parent's count to the limit its creator had when it was
    made. Set inside the host's own user namespace, the limit counts this host's
    processes alone, so one tenant cannot use up another's; set before, it would count
    every process of the server's user, every tenant's together. Without a user
    namespace (``landlock``) the count is the user's, shared by every tenant.
    """
    import resource

    if report.processes == "rlimit" and report.limit_processes:
        resource.setrlimit(resource.RLIMIT_NPROC,
                           (report.limit_processes, report.limit_processes))


def _end_members(path: str) -> None:
    """SIGKILL what is still in a host's cgroup (a process that outlived its jail's
    init, or one of a level without a pid namespace)."""
    import signal

    with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.procs")) as f:
        for pid in f.read().split():
            if int(pid) != os.getpid():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)


def leave_cgroups(report: LimitReport) -> None:
    """Move this process out of the host's cgroups and remove them.

    Called by the keeper once init has ended; the kernel ends the other processes of a
    pid namespace shortly after its init, so removal is retried for a moment.
    """
    import time

    for path in report.cgroups:
        parent = os.path.dirname(os.path.dirname(path))
        with contextlib.suppress(OSError):
            iso._write(os.path.join(parent, "cgroup.procs"), str(os.getpid()))
        _end_members(path)
        for _ in range(100):
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)


# ------------------------------------------------------------------------ namespaces

def enter_namespaces(network: bool, map_ids: Callable[[], None] | None = None) -> None:
    """unshare user + mount + pid + IPC + UTS (+ net) namespaces and map one identity.

    Children forked afterwards live in the new pid namespace; the first is its init.
    ``map_ids`` writes this process's identity map from outside (a root server mapping
    the tenant's own user, see :mod:`.identity`); without it the process maps its own
    uid and gid. Mapping one id (not the full identity map a read-only copy gets) means
    files of other users show as ``nobody`` and no id can be switched to inside.
    """
    uid, gid = os.geteuid(), os.getegid()
    flags = (iso._CLONE_NEWUSER | iso._CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC
             | _CLONE_NEWUTS)
    if not network:
        flags |= _CLONE_NEWNET
    iso._check(iso._libc().unshare(flags), "unshare(user, mount, pid, ipc, uts)")
    if map_ids is not None:
        map_ids()
    else:
        iso._write("/proc/self/setgroups", "deny")
        iso._write("/proc/self/uid_map", f"{uid} {uid} 1")
        iso._write("/proc/self/gid_map", f"{gid} {gid} 1")
    with contextlib.suppress(OSError):
        socket.sethostname("coordex")


def open_view(spec: JailSpec) -> tuple[Any, dict[str, int]]:
    """The view's plan and ``O_PATH`` handles on every folder and file it binds, made
    while this process can still reach them all (a root server's warden, before it
    takes the tenant's user: the server's root, or a Python under ``/root``, is closed
    to that user)."""
    plan = view_plan(spec)
    handles: dict[str, int] = {}
    try:
        for bind in plan.binds:
            handles[bind.path] = os.open(bind.path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        for fd in handles.values():
            os.close(fd)
        raise
    return plan, handles


def build_view(spec: JailSpec, opened: tuple[Any, dict[str, int]] | None = None) -> None:
    """Build the jail's new root (:func:`.view.stage`) in this mount namespace: the
    allow-list of :mod:`.view` plus the tenant's folders and its environments, from
    what :func:`open_view` opened (else opened here). Files made there are this
    process's, so a root server's warden calls it as the tenant."""
    from . import view

    plan, handles = opened if opened is not None else (view_plan(spec), {})
    try:
        view.stage(plan, home=spec.folder, user=spec.user, tmpfs_size=spec.tmpfs_size,
                   handles=handles)
    finally:
        for fd in handles.values():
            os.close(fd)


def view_plan(spec: JailSpec) -> Any:
    from . import view

    return view.plan(spec.readable, (spec.folder, *spec.writable), spec.hidden,
                     spec.environments, spec.records)


def seal_for_builder(spec: JailSpec) -> None:
    """The builder's view: the jail's, with only the environments folder writable (and a
    ``/proc`` of the jail's pid namespace). The init forks the builder before it enters
    the view itself. (The builder's scratch space lies in the environments folder, where
    the host cannot swap files under a build.)"""
    from . import view

    assert spec.environments
    view.enter([os.path.realpath(spec.environments)],
               [os.path.realpath(spec.records)] if spec.records else [])


def builder_spec(spec: JailSpec) -> JailSpec:
    """What the builder may use: it writes only the environments folder (and its own
    scratch space); it reads what the host reads, the tenant's folders included (a
    requirement may name a wheel there by ``file://``)."""
    assert spec.environments
    return JailSpec(folder=spec.environments, hidden=spec.hidden, network=spec.network,
                    readable=(*spec.readable, spec.folder, *spec.writable),
                    tmpfs_size=spec.tmpfs_size, records=spec.records)


def confine_build_step(cache: str, scratch: str) -> Callable[[list[str], Any, str], list[str]]:
    """How the builder runs each process of a build (the environment builder's
    ``confine_step``): in a Landlock domain of its own, nested in the builder's, that
    writes only beneath that build's own folder and the scratch folder ``scratch``, and,
    for uv, its cache ``cache``. So a package's code (its import-time code in the
    import check, an sdist's build backend under uv) cannot change the environments the
    tenant built before. Reads stay the builder's. The new environment's interpreter
    also may not change any file's mode, owner or times; uv must (it marks scripts
    executable), and so may the build backends it runs. One more exec per step
    (:func:`isolation.restricted_argv`)."""

    def confine(command: list[str], folder: Any, step: str) -> list[str]:
        writable = [str(folder), scratch, *([cache] if step == "uv" else [])]
        return iso.restricted_argv(writable, command, may_chmod=step == "uv")

    return confine


def init_namespace(spec: JailSpec) -> None:
    """In the pid namespace's init: the view with the tenant's folders, ``/tmp`` and
    ``/dev/shm`` writable (the environments folder read-only even inside them), a
    ``/proc`` of its own, loopback up without network."""
    from . import view

    own = [os.path.realpath(p) for p in (spec.folder, *spec.writable)]
    view.enter([*own, "/tmp", "/dev/shm"],
               [os.path.realpath(p) for p in (spec.environments, spec.records) if p])
    if not spec.network:
        _loopback_up()


def _loopback_up() -> None:
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def die_with_parent() -> None:
    """SIGKILL this process when its parent ends (the keeper, for init)."""
    iso._libc().prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)


# ------------------------------------------------------------------------ Landlock

def restrict(level: Level, spec: JailSpec) -> None:
    """Apply Landlock to this process for good; raise OSError if it cannot hold.

    ``namespaces+landlock``: writes only beneath the tenant's folders, ``/tmp``,
    ``/dev/shm`` and the devices. ``landlock``: reads too, beneath an allow-list (the
    environments folder among them, for reading only). Both scope signals and abstract
    unix sockets to the host's own processes (ABI >= 6). A host and its builder each
    restrict themselves, in sibling domains: neither can signal, trace or read the
    memory of the other. Then every capability goes (:func:`drop_capabilities`).
    """
    abi = iso.landlock_abi()
    if abi < 3:
        raise OSError(errno.ENOSYS, "Landlock ABI >= 3 is needed")
    write = (iso._LL_WRITE_FILE | iso._LL_REMOVE_DIR | iso._LL_REMOVE_FILE | iso._LL_MAKE_ALL
             | iso._LL_REFER | iso._LL_TRUNCATE)
    read = _LL_READ if level == "landlock" else 0
    ioctl = _LL_IOCTL_DEV if abi >= 5 else 0
    handled = write | read | ioctl
    scoped = iso._LL_SCOPE_SIGNAL | iso._LL_SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    own = [spec.folder, *spec.writable]
    rules: list[tuple[str, int]] = [(p, handled) for p in own]
    if level == "landlock":
        from .view import landlock_reads

        scratch = os.environ.get("TMPDIR", "")
        rules += [(scratch, handled)] if scratch else []
        rules += [(p, read | ioctl) for p in landlock_reads(spec.readable)]
        rules += [(p, read | ioctl) for p in (spec.environments, spec.records) if p]
        # At their real paths (a rule follows no link: /dev/ptmx is often pts/ptmx).
        rules += [(os.path.realpath(d), handled) for d in LANDLOCK_DEVICES]
    else:
        rules += [("/", read | ioctl), ("/tmp", handled), ("/dev/shm", handled)]
        rules += [(d, handled) for d in DEVICES]
    attr = (ctypes.c_uint64 * 3)(handled, 0, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = iso._check(iso._syscall(iso._NR_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                                      ctypes.c_size_t(size), ctypes.c_uint32(0)),
                         "landlock_create_ruleset")
    try:
        for path, access in rules:
            if access:
                _add_rule(ruleset, path, access)
        iso._check(iso._libc().prctl(iso._PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        iso._check(iso._syscall(iso._NR_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset),
                                ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    keep_to_own_processes(shared_ipc=level == "landlock",
                          no_inet=level == "landlock" and not spec.network and not spec.own_network)
    drop_capabilities()


def empty_network() -> None:
    """An empty network namespace with loopback up, made without a user namespace (a
    root server's warden at the ``landlock`` level: ``network=False`` holds as at the
    other level)."""
    iso._check(iso._libc().unshare(_CLONE_NEWNET), "unshare(net)")
    _loopback_up()


# Calls that change another process's limits, priority or CPU placement, per machine:
# (audit arch, {syscall number: what it may target}). "pid": only itself (pid 0);
# "prio": setpriority(PRIO_PROCESS, 0) only; "ioprio": ioprio_set(IOPRIO_WHO_PROCESS, 0)
# only. Landlock scopes signals and ptrace but not these; in a pid namespace no process
# outside can be named anyway, and the filter holds where there is none (``landlock``).
_OTHERS_SYSCALLS: dict[str, tuple[int, dict[int, str]]] = {
    "x86_64": (0xC000003E, {302: "pid", 141: "prio", 203: "pid", 142: "pid", 144: "pid",
                            314: "pid", 251: "ioprio"}),
    "aarch64": (0xC00000B7, {261: "pid", 140: "prio", 122: "pid", 118: "pid", 119: "pid",
                             274: "pid", 30: "ioprio"}),
    "riscv64": (0xC00000F3, {261: "pid", 140: "prio", 122: "pid", 118: "pid", 119: "pid",
                             274: "pid", 30: "ioprio"}),
}
# System V IPC, POSIX message queues, the kernel's keyrings (add_key, request_key,
# keyctl) and inotify watches, refused where the host has no namespaces of its own
# (``landlock``): there every tenant would share the machine's (under one user: B's keys
# and the names of B's new files).
_IPC_SYSCALLS: dict[str, tuple[int, ...]] = {
    "x86_64": (29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, 240, 241, 248, 249, 250, 254),
    "aarch64": (*range(180, 182), *range(186, 198), 217, 218, 219, 27),
    "riscv64": (*range(180, 182), *range(186, 198), 217, 218, 219, 27),
}
# io_uring runs system calls no seccomp filter sees (a socket among them): never in a jail.
_URING_SYSCALLS = (425, 426, 427)  # the same numbers on every architecture
# ioctl(2): TIOCSTI (type into a terminal's input) and TIOCLINUX (the console's
# selection, which can be pasted as input) are refused on every terminal, the jail's own
# too: typed input is how code reaches whoever reads that terminal.
_IOCTL_SYSCALL = {"x86_64": 16, "aarch64": 29, "riscv64": 29}
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
# User namespaces: unshare(2) and clone(2) with CLONE_NEWUSER are refused (EPERM), and
# clone3(2), whose flags lie in memory a filter cannot read, says ENOSYS (libc then
# falls back to clone). A namespace of its own would hand the tenant's code every
# capability there (CAP_NET_ADMIN: nf_tables and the rest of the kernel's network
# administration), as bubblewrap refuses.
_UNSHARE_SYSCALL = {"x86_64": 272, "aarch64": 97, "riscv64": 97}
_CLONE_SYSCALL = {"x86_64": 56, "aarch64": 220, "riscv64": 220}
_CLONE3_SYSCALL = 435  # the same number on every architecture
_CLONE_NEWUSER = 0x10000000
# socket(2), for a host that must have no network and has no namespace to be given an
# empty one in (``landlock`` under an unprivileged user): AF_INET and AF_INET6 refused.
_SOCKET_SYSCALL = {"x86_64": 41, "aarch64": 198, "riscv64": 198}
_FILTERS: list[Any] = []  # the programs' buffers, kept alive for the process's life


def keep_to_own_processes(shared_ipc: bool = False, no_inet: bool = False) -> None:
    """A seccomp filter: ``prlimit``, ``setpriority``, ``sched_setaffinity``,
    ``sched_setparam``, ``sched_setscheduler``, ``sched_setattr`` and ``ioprio_set``
    work on the calling process alone (pid 0), and fail with EPERM on any other: a
    tenant's code can still lower its own priority or limits, never another's. Code of
    another ABI of the machine (32-bit, x32), whose numbers differ, gets ENOSYS for every
    call: it does not run in a jail. io_uring fails with EPERM, and so do
    ``ioctl(TIOCSTI)``/``ioctl(TIOCLINUX)`` on any terminal and a new user namespace
    (``unshare``/``clone`` with ``CLONE_NEWUSER``; ``clone3`` says ENOSYS, so libc uses
    ``clone``). With ``shared_ipc`` (no
    namespaces of its own) System V IPC, POSIX message queues, keyrings and inotify
    fail with EPERM too; with ``no_inet`` so do IPv4 and IPv6 sockets. Needs
    no_new_privs."""
    table = _OTHERS_SYSCALLS.get(iso._MACHINE)
    if table is None:
        return
    arch, calls = table
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    arg = {0: 16, 1: 24}  # seccomp_data.args[i], low 32 bits (little-endian)
    prog: list[tuple[int, int, int, int]] = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, enosys),  # another ABI: nothing runs
        (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, enosys),  # x32 numbers: the same
    ]
    for nr, kind in calls.items():
        if kind == "pid":
            block = [(ld, 0, 0, arg[0]), (jeq, 0, 1, 0), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
        else:
            first = 0 if kind == "prio" else 1
            block = [(ld, 0, 0, arg[0]), (jeq, 0, 3, first), (ld, 0, 0, arg[1]), (jeq, 0, 1, 0),
                     (ret, 0, 0, allow), (ret, 0, 0, eperm)]
        prog.append((jeq, 0, len(block), nr))
        prog += block  # every block ends in a return: the next test still holds the number
    refused = [*_URING_SYSCALLS, *(_IPC_SYSCALLS.get(iso._MACHINE, ()) if shared_ipc else ())]
    for nr in refused:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    jset = 0x45
    ioctl_nr = _IOCTL_SYSCALL.get(iso._MACHINE)
    if ioctl_nr is not None:  # ioctl(fd, TIOCSTI or TIOCLINUX, ...)
        prog += [(jeq, 0, 5, ioctl_nr), (ld, 0, 0, arg[1]), (jeq, 2, 0, _TIOCSTI),
                 (jeq, 1, 0, _TIOCLINUX), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    for table_nr in (_UNSHARE_SYSCALL, _CLONE_SYSCALL):  # flags are the first argument
        flags_nr = table_nr.get(iso._MACHINE)
        if flags_nr is not None:
            prog += [(jeq, 0, 4, flags_nr), (ld, 0, 0, arg[0]), (jset, 1, 0, _CLONE_NEWUSER),
                     (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, _CLONE3_SYSCALL), (ret, 0, 0, enosys)]
    socket_nr = _SOCKET_SYSCALL.get(iso._MACHINE)
    if no_inet and socket_nr is not None:  # socket(AF_INET or AF_INET6, ...)
        prog += [(jeq, 0, 5, socket_nr), (ld, 0, 0, arg[0]), (jeq, 2, 0, 2), (jeq, 1, 0, 10),
                 (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    prog.append((ret, 0, 0, allow))
    fprog, buf = iso.sock_fprog(prog)
    _FILTERS.append(buf)
    iso._check(iso._libc().prctl(iso._PR_SET_SECCOMP, iso._SECCOMP_MODE_FILTER,
                                 ctypes.c_char_p(fprog), 0, 0), "seccomp")


_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_capabilities() -> None:
    """Give up every capability, for good (what an ``exec`` could regain included).

    The host and the builder are the creator's children in the jail's user namespace,
    so they hold every capability there: enough for ``mount_setattr``, which Landlock
    does not see, to clear the read-only flag of their own view (and, as root without
    namespaces, of the machine's mounts). The bounding set goes first (that needs
    ``CAP_SETPCAP``), then the ambient set, then the process's own sets.
    """
    libc = iso._libc()
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL for a cap this kernel lacks
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice 32 bits, none
    iso._check(libc.capset(header, data), "capset")


def _add_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a folder this machine does not have
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            # Rights on a non-directory must be file rights, else EINVAL.
            access &= (iso._LL_WRITE_FILE | iso._LL_TRUNCATE | _LL_EXECUTE | _LL_READ_FILE
                       | _LL_IOCTL_DEV)
        rule = iso._PathBeneath(access, fd)
        iso._check(iso._syscall(iso._NR_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                ctypes.c_int(iso._LANDLOCK_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)),
                   f"landlock_add_rule {path!r}")
    finally:
        os.close(fd)


__all__ = [
    "LEVELS",
    "JailSpec",
    "Level",
    "LimitReport",
    "Limits",
    "apply_process_rlimit",
    "apply_rlimits",
    "best_level",
    "build_view",
    "builder_spec",
    "confine_build_step",
    "die_with_parent",
    "drop_capabilities",
    "empty_network",
    "enter_namespaces",
    "forced_level",
    "init_namespace",
    "join_cgroups",
    "landlock_covers",
    "leave_cgroups",
    "make_limits",
    "open_view",
    "restrict",
    "seal_for_builder",
]
