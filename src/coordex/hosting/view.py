"""The jail's file view, built by allow-list (SPEC 9): what is not bound does not exist.

At the ``namespaces+landlock`` level the view is a new root, a tmpfs, holding only:

- the system's program folders, read-only (:data:`SYSTEM_DIRS`), and the machine's CPU
  list (:data:`SYS_READ`);
- the few files of ``/etc`` programs need (:data:`ETC_FILES`), read-only, and a
  ``passwd``/``group`` of the jail's own naming only root, nobody and the tenant;
- ``/dev`` with the sinks and terminals of :data:`DEVICE_NODES`, a ``devpts`` of its
  own and a private ``/dev/shm``; a private ``/tmp``; a ``/proc`` of the jail's pid
  namespace (mounted by each process that enters the view);
- the folders the host reads (:attr:`JailSpec.readable`: the Python installation,
  coordex, what the operator names with ``--readable``), read-only;
- the tenant's folders, writable, and its environments folder, read-only (writable in
  the builder's view alone).

Every path keeps its name: a folder is bound at its real path, and each symbolic link
met on the way there (``/bin`` -> ``usr/bin``, a virtual environment's ``python``) is made
again in the view. Nothing under a hidden path is ever bound (:func:`plan`), and a hidden
path that lies beneath a bound folder is covered by an empty one.

:func:`stage` builds the new root at :data:`STAGE` in the jail's mount namespace (the
process that made the namespaces does it, before the pid namespace has an init);
:func:`enter` is called by each process that lives in it (init, builder): a mount
namespace of its own, ``/proc``, ``pivot_root``, the old root gone, then everything
read-only but what that process may write.

The ``landlock`` level has no new root: :func:`landlock_reads` gives the same list as
Landlock rules instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..backends import isolation as iso

# Where the new root is built, in the jail's own mount namespace (the machine's /tmp is
# covered there by it, so nothing of the machine's /tmp reaches the view either).
STAGE = "/tmp"

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read in /etc: the name service (with the jail's own passwd and group),
# hosts and the resolver, certificates, the time zone, the dynamic linker's cache, the
# alternatives Debian's commands are links into, and the few configuration files Python,
# bash and git read when present. Not /etc/shadow, ssh keys, or any service's secrets.
ETC_FILES = ("nsswitch.conf", "hosts", "host.conf", "resolv.conf", "gai.conf", "services",
             "protocols", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
             "ca-certificates.conf", "pki/tls/certs", "pki/ca-trust/extracted", "localtime",
             "timezone", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
             "os-release", "mime.types", "bash.bashrc", "profile", "inputrc", "gitconfig",
             "environment", "locale.alias", "locale.gen")
# Not ``tty``: nothing in a jail has a controlling terminal to reach through it.
DEVICE_NODES = ("null", "zero", "full", "random", "urandom")
# The CPU list os.cpu_count() and BLAS libraries read (nothing else of /sys).
SYS_READ = ("/sys/devices/system/cpu",)

_NR_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}.get(iso._MACHINE, 155)
_MS_RDONLY, _MS_NOEXEC = 1, 8


@dataclass(frozen=True)
class Bind:
    """One folder or file of the machine in the view, at its own (real) path."""

    path: str
    writable: bool = False


@dataclass(frozen=True)
class Plan:
    binds: tuple[Bind, ...]
    links: tuple[tuple[str, str], ...]  # (path in the view, the link's text)
    covers: tuple[str, ...]  # hidden paths beneath a bound folder: covered, empty


def resolve(path: str, links: list[tuple[str, str]], depth: int = 0) -> str:
    """The real path of ``path``; each symbolic link met on the way is added to
    ``links`` as (its path, its text), so the view can hold the same links."""
    if depth > 40:
        raise OSError(40, f"too many levels of symbolic links at {path!r}")
    current = "/"
    for part in os.path.normpath(path).split("/"):
        if not part:
            continue
        candidate = os.path.join(current, part)
        if os.path.islink(candidate):
            text = os.readlink(candidate)
            links.append((candidate, text))
            current = resolve(os.path.normpath(os.path.join(current, text)), links, depth + 1)
        else:
            current = candidate
    return current


def plan(readable: Iterable[str], writable: Iterable[str], hidden: Sequence[str],
         environments: str | None = None, records: str | None = None) -> Plan:
    """What the view holds (see the module docstring); pure but for path look-ups.

    A path that is or lies beneath a hidden one is left out (but the tenant's own
    folders, which a server's root holds); a hidden path beneath a bound folder is
    covered by an empty one. Paths that do not exist are left out.
    """
    real_hidden = [os.path.realpath(h) for h in hidden]
    links: list[tuple[str, str]] = []
    wanted: dict[str, bool] = {}

    def add(path: str | None, write: bool, own: bool = False) -> None:
        if not path or not os.path.lexists(path):
            return
        found: list[tuple[str, str]] = []
        try:
            real = resolve(os.path.abspath(path), found)
        except OSError:
            return
        if not os.path.exists(real):
            return
        # The tenant's own folders may lie in a hidden path (a server's root holds them);
        # nothing else may. A folder that holds one is bound with it covered (below).
        if not own and any(iso._within(real, h) for h in real_hidden):
            return
        links.extend(found)
        wanted[real] = wanted.get(real, False) or write

    for path in SYSTEM_DIRS:
        add(path, False)
    for name in ETC_FILES:
        add(os.path.join("/etc", name), False)
    for path in SYS_READ:
        add(path, False)
    for path in readable:
        add(path, False)
    for path in writable:
        add(path, True, own=True)
    for extra in (environments, records):
        add(extra, False, own=True)
    binds: list[Bind] = []
    for path in sorted(wanted, key=lambda p: (p.count("/"), p)):
        # Beneath a folder already bound with the same rights: seen through it.
        if any(iso._within(path, b.path) and b.writable == wanted[path] for b in binds):
            continue
        binds.append(Bind(path, wanted[path]))
    bound = [b.path for b in binds]
    unique_links = []
    for link in dict.fromkeys(links):
        # A link inside a bound folder is there already; one on a hidden path never is.
        if not any(iso._within(link[0], b) for b in bound) and not any(
                iso._within(link[0], h) for h in real_hidden):
            unique_links.append(link)
    covers = tuple(h for h in real_hidden if any(iso._within(h, b) and h != b for b in bound))
    return Plan(tuple(binds), tuple(unique_links), covers)


def landlock_reads(readable: Iterable[str]) -> list[str]:
    """The folders and files Landlock lets a host read at the ``landlock`` level: the
    same list as the view's, each at its real path (a rule follows no link)."""
    paths: list[str] = []
    # The machine's passwd and group too: there is no view to write the jail's own in.
    for path in (*SYSTEM_DIRS, *(os.path.join("/etc", n) for n in (*ETC_FILES, "passwd", "group")),
                 *readable, *SYS_READ, "/proc"):
        links: list[tuple[str, str]] = []
        with contextlib.suppress(OSError):
            if os.path.lexists(path):
                paths.append(resolve(path, links))  # Landlock does not stop a walk
    return sorted(set(paths) - {"/"})


# ---------------------------------------------------------------------------- staging

def stage(view: Plan, *, home: str, user: tuple[int, int, str] | None, tmpfs_size: int | None,
          handles: dict[str, int] | None = None) -> None:
    """Build the new root at :data:`STAGE` in this mount namespace (made private first).

    ``handles`` maps bound paths to ``O_PATH`` descriptors opened earlier (by a process
    that could reach them); others are opened here. ``user`` is (uid, gid, name) of the
    tenant for the view's ``passwd``; ``home`` its home.
    """
    iso._mount(None, "/", None, iso._MS_REC | iso._MS_PRIVATE)
    opened = {b.path: os.open(b.path, os.O_PATH | os.O_CLOEXEC)
              for b in view.binds if handles is None or b.path not in handles}
    sources = {**(handles or {}), **opened}
    kinds = {path: stat.S_ISDIR(os.fstat(fd).st_mode) for path, fd in sources.items()}
    try:
        iso._mount("tmpfs", STAGE, "tmpfs", iso._MS_NOSUID | iso._MS_NODEV, "mode=0755")
        # The private /tmp first: a folder given that lies in the machine's /tmp (a
        # checkout, a tenant's folder) is bound into it at its own path.
        size = f",size={tmpfs_size}" if tmpfs_size else ""
        os.makedirs(STAGE + "/tmp")
        iso._mount("tmpfs", STAGE + "/tmp", "tmpfs", iso._MS_NOSUID | iso._MS_NODEV,
                   "mode=1777" + size)
        for bind in view.binds:
            _bind(sources[bind.path], STAGE + bind.path, is_dir=kinds[bind.path])
        for path, text in view.links:
            target = STAGE + path
            if not os.path.lexists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(text, target)
        for path in view.covers:
            _cover(STAGE + path)
        _stage_etc(user, home)
        _stage_dev(tmpfs_size)
        os.makedirs(STAGE + "/proc", exist_ok=True)
    finally:
        for fd in opened.values():
            os.close(fd)


def _bind(fd: int, target: str, *, is_dir: bool) -> None:
    if not os.path.lexists(target):  # only ever inside the new root's own tmpfs
        os.makedirs(target if is_dir else os.path.dirname(target), exist_ok=True)
        if not is_dir:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
    iso._mount(f"/proc/self/fd/{fd}", target, None, iso._MS_BIND | iso._MS_REC)


def _cover(path: str) -> None:
    if os.path.isdir(path):
        iso._mount("tmpfs", path, "tmpfs", iso._MS_NOSUID | iso._MS_NODEV, "mode=0755,size=4k")
    elif os.path.lexists(path):
        iso._mount("/dev/null", path, None, iso._MS_BIND)


def _stage_etc(user: tuple[int, int, str] | None, home: str) -> None:
    """The view's own passwd and group: root, nobody and the tenant, nobody else."""
    etc = STAGE + "/etc"
    os.makedirs(etc, exist_ok=True)
    uid, gid, name = user if user is not None else (os.getuid(), os.getgid(), "tenant")
    users = {0: "root:x:0:0:root:/root:/bin/sh",
             65534: "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"}
    users[uid] = f"{name}:x:{uid}:{gid}:{name}:{home}:/bin/bash"
    groups = {0: "root:x:0:", 65534: "nogroup:x:65534:"}
    groups[gid] = f"{name}:x:{gid}:"
    for file, rows in (("passwd", users), ("group", groups)):
        with open(os.path.join(etc, file), "w") as f:
            f.write("".join(row + "\n" for _, row in sorted(rows.items())))


def _stage_dev(tmpfs_size: int | None) -> None:
    dev = STAGE + "/dev"
    os.makedirs(dev, exist_ok=True)
    iso._mount("tmpfs", dev, "tmpfs", iso._MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICE_NODES:
        source = os.path.join("/dev", name)
        if os.path.exists(source):
            target = os.path.join(dev, name)
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
            iso._mount(source, target, None, iso._MS_BIND)
    for name, text in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                       ("ptmx", "pts/ptmx")):
        os.symlink(text, os.path.join(dev, name))
    # A devpts of its own: /dev/pts lists the jail's terminals only.
    os.makedirs(os.path.join(dev, "pts"))
    iso._mount("devpts", os.path.join(dev, "pts"), "devpts", iso._MS_NOSUID | _MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=0620")
    os.makedirs(os.path.join(dev, "shm"))
    size = f",size={tmpfs_size}" if tmpfs_size else ""
    iso._mount("tmpfs", os.path.join(dev, "shm"), "tmpfs", iso._MS_NOSUID | iso._MS_NODEV,
               "mode=1777" + size)


# ---------------------------------------------------------------------------- reaching

def reach(paths: Sequence[str], uid: int, gid: int) -> None:
    """Let ``uid`` reach ``paths`` where a folder above one is closed to it (a server's
    root of mode 0700, a Python installed under ``/root``), for a root server's host at
    the ``landlock`` level, which has no view of its own: in a mount namespace of this
    process's own (root needs no user namespace for one), each such folder is covered
    by an empty one with the paths beneath it bound back. Landlock then allows what it
    allows, by the same paths."""
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    closed = {a for p in real for a in _above(p) if not _searchable(a, uid, gid)}
    tops = sorted(a for a in closed if not any(iso._within(a, b) and a != b for b in closed))
    if not tops:
        return
    iso._check(iso._libc().unshare(iso._CLONE_NEWNS), "unshare(mount)")
    iso._mount(None, "/", None, iso._MS_REC | iso._MS_PRIVATE)
    # Handles on mounts of this namespace (a bind takes no mount of another one).
    handles = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in real
               if any(iso._within(p, t) for t in tops)}
    try:
        for top in tops:
            iso._mount("tmpfs", top, "tmpfs", iso._MS_NOSUID | iso._MS_NODEV, "mode=0755,size=64k")
        for path, fd in sorted(handles.items()):
            _bind(fd, path, is_dir=stat.S_ISDIR(os.fstat(fd).st_mode))
    finally:
        for fd in handles.values():
            os.close(fd)


def _above(path: str) -> list[str]:
    found = []
    while path != "/":
        path = os.path.dirname(path)
        found.append(path)
    return found


def _searchable(folder: str, uid: int, gid: int) -> bool:
    try:
        st = os.stat(folder)
    except OSError:
        return False
    mode = st.st_mode
    return bool(mode & 0o001 or (st.st_uid == uid and mode & 0o100)
                or (st.st_gid == gid and mode & 0o010))


# ---------------------------------------------------------------------------- entering

def enter(writable: Sequence[str], read_only: Sequence[str] = ()) -> None:
    """Live in the staged root: a mount namespace of this process's own, a ``/proc`` of
    its pid namespace, ``pivot_root``, the machine's root detached, and every mount
    read-only but ``writable`` (then ``read_only`` again, for a folder inside one)."""
    iso._check(iso._libc().unshare(iso._CLONE_NEWNS), "unshare(mount)")
    # Mounted while the machine's /proc is still in sight: the kernel lets a user
    # namespace mount a proc only where one is fully visible.
    iso._mount("proc", STAGE + "/proc", "proc", iso._MS_NOSUID | iso._MS_NODEV | _MS_NOEXEC)
    os.chdir(STAGE)
    iso._check(iso._syscall(_NR_PIVOT_ROOT, b".", b"."), "pivot_root")
    iso._check(iso._libc().umount2(b".", iso._MNT_DETACH), "umount the machine's root")
    os.chdir("/")
    _set_read_only("/", True)
    for path in (*writable, "/proc", "/dev/pts"):
        if os.path.isdir(path):
            _set_read_only(path, False)
    for path in read_only:
        if os.path.isdir(path):
            _set_read_only(path, True)


def _set_read_only(path: str, read_only: bool) -> None:
    flag = iso._MOUNT_ATTR_RDONLY
    attr = (ctypes.c_uint64 * 4)(flag if read_only else 0, 0 if read_only else flag, 0, 0)
    iso._check(iso._syscall(iso._NR_MOUNT_SETATTR, ctypes.c_int(iso._AT_FDCWD),
                            os.fsencode(path), ctypes.c_uint(iso._AT_RECURSIVE),
                            ctypes.byref(attr), ctypes.c_size_t(32)), f"mount_setattr {path!r}")


__all__ = ["DEVICE_NODES", "ETC_FILES", "STAGE", "SYSTEM_DIRS", "Bind", "Plan", "enter",
           "landlock_reads", "plan", "reach", "resolve", "stage"]
