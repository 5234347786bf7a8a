"""File protection for read-only calls (SPEC section 1, guarantee 3).

:func:`protect` runs inside a freshly forked, single-threaded child, before any user
code, and makes sure that nothing the child writes outside its scratch folder survives
it. It tries the strongest mechanism first and reports the one that held:

``"discarded"``
    ``unshare(CLONE_NEWUSER | CLONE_NEWNS)`` gives the child a private mount table it
    may change without privilege. Each work folder (home, the session's cwd) gets an
    overlay mount whose lower layer is the real folder and whose upper layer lives on
    a tmpfs mounted for this call only, so the child sees its own writes and they
    vanish with its mount namespace. A private tmpfs also covers ``/dev/shm``. Then
    Landlock refuses writes everywhere else, except the scratch folder and a few
    character devices (``/dev/null``, ``/dev/tty``, ``/dev/pts``...).
``"refused"``
    Where user namespaces or overlayfs are unavailable (or a work folder cannot be
    overlaid), Landlock alone refuses every write outside the scratch folder; the code
    sees ``PermissionError`` and nothing on disk changes.
``"none"``
    Neither works (not Linux, kernel without Landlock, Landlock disabled at boot):
    nothing is promised. Overlays that could be mounted are still used as a best
    effort, but the caller must not claim protection.

The result is never a claim that did not hold: overlays are checked (the folder's
device changed) and Landlock's ``restrict_self`` must succeed before a mode is named.

Identity. The child keeps its uid/gid: an unprivileged user maps only itself; root has
a helper (``/bin/sh``, spawned before ``unshare`` so it keeps its host privilege) write
a full identity map, so every file keeps its owner and root can still read them all.
Root that cannot create a user namespace still gets ``"discarded"`` with a plain mount
namespace.

Mounts nested inside a work folder are not part of its overlay; they are bound back on
top read-only, so code reads them but writes fail with ``EROFS``. Overlayfs refuses such
a folder inside a user namespace (the copied mounts are locked), so root uses a plain
mount namespace then, and an unprivileged user gets ``"refused"``. If the scratch folder
lies inside a work folder it is bound back read-write. Every mount lives in the child's
own mount namespace and disappears with it (unless the child leaves a daemon behind).

What a protected call may still do (the limits). Guarantee 3 is about the disk: a
read-only call is a look that must not change the session or its files, not a sandbox
for hostile code. So, by decision:

* network access stays open (Landlock's network rules are deliberately not used: reading
  a URL or querying a database is a legitimate look), and so does talking to local
  daemons over pathname unix sockets (a daemon may write on the code's behalf, e.g.
  through the docker socket);
* host capabilities called from Python code run in the agent's process, unprotected
  (they are the agent's actions: a read-only copy calls back to run them there);
* processes the call leaves running keep the protected view until they exit: the bash
  copy's process group is ended with the call, but a fork child's background processes
  (own interpreter, environment worker) are not (a worker's end with its session);
* signals and abstract unix sockets are scoped to the child's own processes only where
  Landlock ABI >= 6; below that the code may signal any process its uid may signal;
* this module does not intercept writes through file descriptors or shared memory maps
  opened before the fork; the Python backends' copies handle those themselves
  (``worker/_coordex_copy.py``: reopened through the overlay or read-only, maps made
  private), and a bash copy gets fds 0-2 only;
* in ``"refused"`` mode root keeps its host capabilities apart from writing files
  (it may still e.g. reboot or reconfigure the network); in ``"discarded"`` mode the
  capabilities exist only inside the child's user namespace, except where root had to
  use a plain mount namespace (mounts nested in a work folder, user namespaces blocked);
* renaming a directory that exists in a work folder fails with ``EXDEV`` in
  ``"discarded"`` mode (overlayfs without ``redirect_dir``; ``mv`` falls back to a
  copy); Landlock ABI 1 refuses every cross-directory rename;
* discarded writes take memory (tmpfs, at most half of RAM);
* no file's mode, owner, times or extended attributes can be changed (``chmod``,
  ``chown``, ``touch`` of an existing file, ``setxattr``), not even in the scratch
  folder: Landlock has no right for them, so a seccomp filter makes them fail with
  ``EPERM`` (x86-64, aarch64, riscv64; on other machines the mode is ``"none"``);
* ``/proc/<pid>/{environ,fd,maps}`` of processes outside the child are unreadable
  (Landlock's ptrace rule), and ``/tmp`` outside the scratch folder is not writable.

Landlock ABI below 3 cannot refuse ``truncate(2)`` by path; there a seccomp filter makes
``truncate`` fail with ``EPERM`` (x86-64 and aarch64), or the mode is ``"none"``.

:func:`protect` must run single-threaded; in a threaded process it returns ``"none"``.
The module runs on CPython 3.8+ so a worker in an older environment can load it too.

Test hook: ``COORDEX_ISOLATION_FORCE=refused|none`` caps the strongest mode tried (see
:func:`force_unavailable`). This module is standard-library only so the bash backend's
launcher server (:mod:`.launcher`) and :func:`protected_bash_argv` can load it by path
without importing coordex.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import sys

# Only what protect() needs is imported at load: the bash launcher server loads this
# module in a fresh interpreter (as does protected_bash_argv() on every call), and json,
# re, tempfile, platform and typing would add ~12 ms there. Types are for the checker.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Literal, TypedDict

    FilesMode = Literal["discarded", "refused", "none"]

    IdentityMapper = Callable[[str, str], bool]

    class Capabilities(TypedDict):
        userns: bool
        overlay: bool
        landlock_abi: int

FORCE_ENV = "COORDEX_ISOLATION_FORCE"
# Exported to the protected bash so a script (and the bash backend) can read the mode.
MODE_ENV = "COORDEX_ISOLATION"

_RANK: dict[str, int] = {"none": 0, "refused": 1, "discarded": 2}
_MODES: tuple[FilesMode, ...] = ("none", "refused", "discarded")

# --- kernel constants (include/uapi/linux/{sched,mount,landlock,prctl,seccomp}.h) ---
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 1

# Landlock and mount_setattr use the unified syscall numbers on every architecture but
# alpha, which offsets new syscalls by 110.
_MACHINE = os.uname().machine if hasattr(os, "uname") else ""  # = platform.machine()
_NR_OFFSET = 110 if _MACHINE == "alpha" else 0
_NR_MOUNT_SETATTR = 442 + _NR_OFFSET
_NR_LANDLOCK_CREATE_RULESET = 444 + _NR_OFFSET
_NR_LANDLOCK_ADD_RULE = 445 + _NR_OFFSET
_NR_LANDLOCK_RESTRICT_SELF = 446 + _NR_OFFSET
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

_LL_WRITE_FILE = 1 << 1
_LL_REMOVE_DIR = 1 << 4
_LL_REMOVE_FILE = 1 << 5
_LL_MAKE_ALL = sum(1 << bit for bit in range(6, 13))  # CHAR DIR REG SOCK FIFO BLOCK SYM
_LL_REFER = 1 << 13  # ABI 2
_LL_TRUNCATE = 1 << 14  # ABI 3
_LL_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_LL_SCOPE_SIGNAL = 1 << 1  # ABI 6

# Character devices (and /dev/pts) code may still open for writing: terminals and sinks.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts",
            "/dev/random", "/dev/urandom")

# truncate(2) numbers for the seccomp fallback on Landlock ABI < 3: (audit arch, nrs).
_TRUNCATE_SYSCALLS: dict[str, tuple[int, tuple[int, ...]]] = {
    "x86_64": (0xC000003E, (76, 0x40000000 | 76)),  # native and x32
    "aarch64": (0xC00000B7, (45,)),
}
# Syscalls that change a file's mode, owner, times or extended attributes. Landlock has
# no right for them, so without this filter a read-only call could chmod, chown, touch
# or setxattr any file its user owns, outside the overlays too: (audit arch, nrs).
_X86_64_SETATTR = (90, 91, 92, 93, 94, 132, 188, 189, 190, 197, 198, 199, 235, 260, 261, 268,
                   280, 452, 463, 466)  # chmod .. utimensat, fchmodat2, setxattrat, removexattrat
_GENERIC_SETATTR = (5, 6, 7, 14, 15, 16, 52, 53, 54, 55, 88, 452, 463, 466)
_SETATTR_SYSCALLS: dict[str, tuple[int, tuple[int, ...]]] = {
    "x86_64": (0xC000003E, _X86_64_SETATTR + tuple(0x40000000 | n for n in _X86_64_SETATTR)),
    "aarch64": (0xC00000B7, _GENERIC_SETATTR),
    "riscv64": (0xC00000F3, _GENERIC_SETATTR),
}


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc_handle: ctypes.CDLL | None = None
_probe_cache: Capabilities | None = None
_abi_cache: int | None = None


def _libc() -> ctypes.CDLL:
    global _libc_handle
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
        _libc_handle.syscall.restype = ctypes.c_long
    return _libc_handle


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(nr: int, *args: object) -> int:
    return int(_libc().syscall(ctypes.c_long(nr), *args))


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    _check(_libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags),
                         enc(data)), f"mount {target!r}")


# --------------------------------------------------------------------------- Landlock

def landlock_abi() -> int:
    """The running kernel's Landlock ABI version, 0 when Landlock is unavailable.

    Asked once per process (a kernel's ABI does not change while it runs; through
    ctypes the question costs ~0.1 ms) and inherited by forked children.
    """
    global _abi_cache
    if _abi_cache is None:
        _abi_cache = _ask_landlock_abi()
    return _abi_cache


def _ask_landlock_abi() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = _syscall(_NR_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def _landlock_usable(abi: int) -> bool:
    # Below ABI 3 truncate(2) by path escapes Landlock; only a seccomp filter closes it.
    return abi >= 3 or (abi >= 1 and _MACHINE in _TRUNCATE_SYSCALLS)


def _deny_truncate() -> None:
    """Install a seccomp filter making truncate(2) fail with EPERM (Landlock ABI < 3)."""
    _deny_syscalls(*_TRUNCATE_SYSCALLS[_MACHINE])


def _deny_setattr() -> None:
    """Install a seccomp filter making every change of a file's metadata fail with EPERM;
    OSError where this machine's syscall numbers are not known."""
    if _MACHINE not in _SETATTR_SYSCALLS:
        raise OSError(errno.ENOSYS, f"no metadata syscall table for {_MACHINE!r}")
    _deny_syscalls(*_SETATTR_SYSCALLS[_MACHINE])


def _deny_syscalls(arch: int, numbers: Sequence[int]) -> None:
    """A seccomp filter: ``numbers`` fail with EPERM for ``arch``; all else is allowed."""
    _check(_libc().prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER,
                         ctypes.c_char_p(_filter_program(arch, numbers)), 0, 0), "seccomp")


# (arch, numbers) -> (struct sock_fprog, the instructions it points at): built once, in
# the long-lived process (see prepare()), and inherited by every forked child.
_PROGRAMS: dict[tuple[int, tuple[int, ...]], tuple[bytes, ctypes.Array[ctypes.c_char]]] = {}


def _filter_program(arch: int, numbers: Sequence[int]) -> bytes:
    key = (arch, tuple(numbers))
    if key not in _PROGRAMS:
        _PROGRAMS[key] = _build_filter(arch, numbers)
    return _PROGRAMS[key][0]


def _build_filter(arch: int, numbers: Sequence[int],
                  ) -> tuple[bytes, ctypes.Array[ctypes.c_char]]:
    ld_abs, jeq, ret = 0x20, 0x15, 0x06
    allow, eperm = 0x7FFF0000, 0x00050000 | 1
    prog: list[tuple[int, int, int, int]] = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, arch),
        (ret, 0, 0, allow),  # another ABI (e.g. 32-bit): leave it alone
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
    ]
    for index, nr in enumerate(numbers):
        remaining = len(numbers) - index - 1
        prog.append((jeq, remaining + 1, 0, nr))  # hit -> jump to the EPERM return
    prog += [(ret, 0, 0, allow), (ret, 0, 0, eperm)]
    return sock_fprog(prog)


def sock_fprog(prog: Sequence[tuple[int, int, int, int]],
               ) -> tuple[bytes, ctypes.Array[ctypes.c_char]]:
    """A BPF program as ``struct sock_fprog`` for ``PR_SET_SECCOMP``, and the buffer of
    its instructions, which must outlive its use."""
    raw = b"".join(struct.pack("=HBBI", *insn) for insn in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    return struct.pack("@HP", len(prog), ctypes.addressof(buf)), buf


def prepare() -> None:
    """Do once, in the long-lived process that forks the copies, what each copy's
    :func:`protect` would repeat: load libc, ask the Landlock ABI, build the seccomp
    programs, read root's identity maps. Forked children inherit all of it."""
    landlock_abi()
    for table in (_SETATTR_SYSCALLS, _TRUNCATE_SYSCALLS):
        if _MACHINE in table:
            _filter_program(*table[_MACHINE])
    if sys.platform.startswith("linux") and os.geteuid() == 0:
        try:
            _identity_map("uid_map")
            _identity_map("gid_map")
        except OSError:
            pass


def _landlock_restrict(abi: int, writable: Sequence[str], *, may_chmod: bool = False) -> None:
    """Refuse every filesystem write except beneath ``writable``; scope IPC (ABI >= 6).
    ``may_chmod``: leave out the seccomp filter that refuses metadata changes."""
    handled = _LL_WRITE_FILE | _LL_REMOVE_DIR | _LL_REMOVE_FILE | _LL_MAKE_ALL
    if abi >= 2:
        handled |= _LL_REFER
    if abi >= 3:
        handled |= _LL_TRUNCATE
    scoped = _LL_SCOPE_SIGNAL | _LL_SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    # struct landlock_ruleset_attr grew: fs (v1), net (v4), scoped (v6). Pass only the
    # fields this kernel knows; network is deliberately not handled (left open).
    attr = (ctypes.c_uint64 * 3)(handled, 0, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _check(_syscall(_NR_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                              ctypes.c_size_t(size), ctypes.c_uint32(0)),
                     "landlock_create_ruleset")
    try:
        for path in writable:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # e.g. no /dev/tty without a terminal
            try:
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                # Rights on a non-directory must be file rights, else EINVAL.
                rule = _PathBeneath(handled if is_dir else
                                    handled & (_LL_WRITE_FILE | _LL_TRUNCATE), fd)
                _check(_syscall(_NR_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)),
                       f"landlock_add_rule {path!r}")
            finally:
                os.close(fd)
        # no_new_privs: required without CAP_SYS_ADMIN, and keeps setuid programs (sudo)
        # from regaining what the sandbox took away.
        _check(_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        if abi < 3:
            _deny_truncate()
        if not may_chmod:
            _deny_setattr()
        _check(_syscall(_NR_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset),
                        ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def restrict_writes(writable: Sequence[str], *, may_chmod: bool = False) -> None:
    """Give this process a Landlock domain of its own: writes only beneath ``writable``
    (and the terminal and sink devices), signals and abstract sockets scoped to it.

    Reads are not handled, so they stay what an enclosing domain allows; domains stack,
    so this only takes rights away. ``may_chmod`` keeps ``chmod``/``chown``/``utime``
    (which Landlock does not see) for programs that set modes on what they write (uv);
    otherwise a seccomp filter refuses them where this machine's numbers are known.
    Raises OSError where Landlock cannot hold.
    """
    abi = landlock_abi()
    if not _landlock_usable(abi):
        raise OSError(errno.ENOSYS, "Landlock is not available")
    _landlock_restrict(abi, [*writable, *_DEVICES],
                       may_chmod=may_chmod or _MACHINE not in _SETATTR_SYSCALLS)


# ------------------------------------------------------------------------ namespaces

def _enter_namespaces(*, userns: bool = True, map_identity: IdentityMapper | None = None,
                      ) -> bool:
    """unshare a user + mount namespace keeping uid/gid; False when only a mount ns.

    Root falls back to (or, with ``userns=False``, goes straight to) a plain mount
    namespace. Raises OSError when no namespace can be created.
    """
    uid, gid = os.geteuid(), os.getegid()
    if not userns and uid == 0:
        _check(_libc().unshare(_CLONE_NEWNS), "unshare(mount)")
        return False
    maps: tuple[str, str] | None = None
    helper, go = None, None
    if uid == 0:
        try:
            maps = _identity_map("uid_map"), _identity_map("gid_map")
        except OSError:
            maps = None
        if maps is not None and map_identity is None:
            helper, go = _spawn_map_helper(*maps)
    try:
        _check(_libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare(user, mount)")
    except OSError:
        _reap_helper(helper, go, proceed=False)
        if uid != 0:
            raise
        # Root where user namespaces are blocked: a mount namespace alone still works.
        _check(_libc().unshare(_CLONE_NEWNS), "unshare(mount)")
        return False
    if helper is not None:
        if _reap_helper(helper, go, proceed=True):
            return True
    elif maps is not None and map_identity is not None and map_identity(*maps):
        return True
    # Unprivileged (or the helper failed): map only ourselves, to ourselves.
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    return True


def _spawn_map_helper(uid_map: str, gid_map: str) -> tuple[int | None, int | None]:
    # Only a process with CAP_SETUID in the *parent* namespace may map more than its own
    # id, and after unshare() we no longer have it; a shell spawned just before does.
    # posix_spawn (vfork) costs the same however large the session process is.
    script = (f'read _ && printf %s "$1" > /proc/{os.getpid()}/uid_map'
              f' && printf %s "$2" > /proc/{os.getpid()}/gid_map')
    read_end, write_end = os.pipe()
    try:
        helper = os.posix_spawn("/bin/sh", ["sh", "-c", script, "sh", uid_map, gid_map],
                                {"PATH": "/usr/bin:/bin"},
                                file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0),
                                              # a refused map is reported by the
                                              # fallback, not as noise in the call
                                              (os.POSIX_SPAWN_OPEN, 2, os.devnull,
                                               os.O_WRONLY, 0)])
    except OSError:
        os.close(write_end)
        return None, None
    finally:
        os.close(read_end)
    return helper, write_end


def identity_asker(ask: int, answer: int) -> IdentityMapper:
    """A ``map_identity`` for :func:`protect` in a forked child of a process that kept
    root's privilege: it asks that parent over ``ask`` and reads its verdict (``b"1"``)
    from ``answer``; the parent answers with :func:`write_identity_maps`. Cheaper than
    the default helper shell (~1 ms), and the same ids are mapped."""
    def map_identity(uid_map: str, gid_map: str) -> bool:
        import marshal

        os.write(ask, marshal.dumps((uid_map, gid_map)))
        return os.read(answer, 1) == b"1"

    return map_identity


def write_identity_maps(pid: int, request: bytes) -> bool:
    """In the parent: write child ``pid``'s maps from what its :func:`identity_asker`
    sent (the parent kept the privilege its user namespace lacks). Writing a map
    succeeds only once per namespace, so a child cannot widen what it got."""
    import marshal

    try:
        uid_map, gid_map = marshal.loads(request)
        for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
            fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
    except (OSError, ValueError, EOFError, TypeError, AttributeError):
        return False
    return True


# (user namespace inode, "uid_map" or "gid_map") -> its identity map. A namespace's
# maps never change once written, so prepare() reads them once for every fork child.
_IDENTITY_MAPS: dict[tuple[int, str], str] = {}


def _identity_map(name: str) -> str:
    # Every id mapped in our namespace, mapped to itself: on a plain host that is all of
    # them; inside a container it is the container's ranges.
    key = (os.stat("/proc/self/ns/user").st_ino, name)
    if key in _IDENTITY_MAPS:
        return _IDENTITY_MAPS[key]
    with open(f"/proc/self/{name}") as f:
        ranges = [line.split() for line in f if line.strip()]
    identity = "".join(f"{inside} {inside} {count}\n" for inside, _, count in ranges)
    if identity:  # not yet written (a namespace just made): ask again next time
        _IDENTITY_MAPS[key] = identity
    return identity


def _reap_helper(helper: int | None, go: int | None, *, proceed: bool) -> bool:
    if helper is None or go is None:
        return False
    try:
        if proceed:
            os.write(go, b"go\n")
    finally:
        os.close(go)  # EOF makes `read` fail, so a cancelled helper exits at once
    _, status = os.waitpid(helper, 0)
    return proceed and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# -------------------------------------------------------------------------- overlays

def _work_dirs(work_paths: Sequence[str], scratch: str) -> list[str]:
    """Existing directories, resolved, deduplicated, nested ones dropped, "/" skipped."""
    found: set[str] = set()
    for path in work_paths:
        try:
            real = os.path.realpath(os.path.expanduser(path))  # "." is the cwd
        except OSError:
            continue  # "." in a deleted folder: nothing to overlay, Landlock refuses it
        if real != "/" and os.path.isdir(real) and not _within(real, scratch):
            found.add(real)
    ordered = sorted(found)
    return [p for p in ordered if not any(_within(p, q) and p != q for q in ordered)]


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", "rb", buffering=0) as f:  # no buffer: fewer faults
        for line in f.readall().splitlines():
            field = line.split(b" ", 5)[4]
            if b"\\" in field:  # space, tab, newline and backslash come octal: \040
                import re

                field = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), field)
            points.append(os.fsdecode(field))
    return points


def _mount_overlays(dirs: Sequence[str], scratch: str, userns: bool,
                    points: Sequence[str]) -> tuple[list[str], bool]:
    """Overlay every dir in ``dirs``; return (paths now writable, all dirs overlaid).

    ``points`` are the mount points (from :func:`_mount_points`) before any change.
    """
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing we mount reaches the host
    # Submounts inside a work dir are hidden by its overlay; keep handles to bind them
    # back. Only the outermost ones: MS_REC carries what is mounted below them.
    nested = sorted({p for p in points for d in dirs if _within(p, d) and p != d
                     and not _within(p, scratch)})
    nested = [p for p in nested if not any(_within(p, q) and p != q for q in nested)]
    keep: dict[str, int] = {}
    for path in [*nested, scratch]:
        try:
            keep[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            pass
    # The layers tmpfs goes on /dev/shm and is then covered by the call's private
    # /dev/shm: hidden from the code without an unmount (a lazy unmount waits for an RCU
    # grace period, ~1.5 ms). Without /dev/shm it sits in scratch and is detached.
    on_shm = os.path.isdir("/dev/shm")
    layers = "/dev/shm" if on_shm else os.path.join(scratch, ".coordex-overlay")
    if not on_shm:
        os.mkdir(layers, 0o700)
    _mount("tmpfs", layers, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700")
    layers_fd = os.open(layers, os.O_PATH | os.O_CLOEXEC)
    overlaid: list[str] = []
    writable: list[str] = []
    try:
        for index, lower in enumerate(dirs):
            if _overlay_one(index, lower, layers, layers_fd, userns):
                overlaid.append(lower)
        # The overlays hold their own references to the layers, so covering or detaching
        # the tmpfs keeps the code from reaching the upper dirs behind their back.
        if on_shm:
            _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
            writable.append("/dev/shm")
        else:
            _check(_libc().umount2(os.fsencode(f"/proc/self/fd/{layers_fd}"), _MNT_DETACH),
                   "detach layers")
            try:
                os.rmdir(layers)
            except OSError:
                pass
        for path, fd in keep.items():
            if any(_within(path, d) for d in overlaid):
                _rebind(fd, path, read_only=path != scratch)
        writable += overlaid
    finally:
        os.close(layers_fd)
        for fd in keep.values():
            os.close(fd)
    return writable, len(overlaid) == len(dirs)


def _overlay_one(index: int, lower: str, layers: str, layers_fd: int, userns: bool) -> bool:
    try:
        info = os.stat(lower)
        upper, work = os.path.join(layers, f"u{index}"), os.path.join(layers, f"w{index}")
        os.mkdir(upper)
        os.mkdir(work)
        # The merged root takes the upper dir's owner and mode: copy the real folder's.
        try:
            os.chown(upper, info.st_uid, info.st_gid)
        except OSError:
            pass  # an owner outside our uid map
        os.chmod(upper, stat.S_IMODE(info.st_mode))
        lower_fd = os.open(lower, os.O_PATH | os.O_CLOEXEC)
        try:
            # /proc/self/fd paths: no escaping of ',' ':' in user folder names needed.
            options = (f"lowerdir=/proc/self/fd/{lower_fd},"
                       f"upperdir=/proc/self/fd/{layers_fd}/u{index},"
                       f"workdir=/proc/self/fd/{layers_fd}/w{index}")
            # userxattr: overlay metadata in user.* xattrs, required inside a userns.
            _mount("overlay", lower, "overlay", 0, options + (",userxattr" if userns else ""))
        finally:
            os.close(lower_fd)
    except OSError:
        return False  # e.g. a lower fs overlayfs refuses; Landlock then refuses writes
    # Verify rather than trust: the path must now lead to another filesystem.
    if os.stat(lower).st_dev == info.st_dev:
        return False
    try:  # a handle on the upper layer, so written() can list it once the code ran
        _UPPERS.append((lower, os.open(upper, os.O_PATH | os.O_CLOEXEC)))
    except OSError:
        pass
    return True


# In a protected copy: each overlaid folder and a handle on its upper layer, which holds
# exactly what the copy wrote there (and whiteouts for what it deleted).
_UPPERS: list[tuple[str, int]] = []
WRITTEN_LIMIT = 200
# The layers live on tmpfs, whose directories are 20 bytes per entry plus 40 for "." and
# "..": a copy that wrote nothing in a folder is told by one fstat, not a walk.
_EMPTY_TMPFS_DIR = 40


def upper_layers() -> list[tuple[str, int]]:
    """Each folder this process overlaid, with an ``O_PATH`` handle (close-on-exec) on
    its upper layer: what :func:`written` lists. The bash launcher sends them to the
    host, which lists them once the copy's code has finished."""
    return list(_UPPERS)


def written(limit: int = WRITTEN_LIMIT,
            uppers: Sequence[tuple[str, int]] | None = None) -> list[str]:
    """The paths in protected folders this copy wrote, created or deleted (all of it
    discarded), for the call log: what the overlays' upper layers hold. At most
    ``limit`` paths; a last entry ``"..."`` says there were more.

    ``uppers``: ``(folder, handle)`` pairs held by this process (default: this copy's
    own, :func:`upper_layers`), handles on tmpfs directories. Symbolic links are
    listed, never followed, so the listing stays inside the layers whoever made them.
    """
    found: list[str] = []
    for lower, fd in _UPPERS if uppers is None else uppers:
        try:
            if os.fstat(fd).st_size == _EMPTY_TMPFS_DIR:
                continue
        except OSError:
            continue
        top = f"/proc/self/fd/{fd}"
        for folder, dirs, files in os.walk(top):
            rel = os.path.relpath(folder, top)
            names = list(files) + [d for d in dirs if _a_leaf(os.path.join(folder, d))]
            for name in sorted(names):
                if len(found) >= limit:
                    return [*found, "..."]
                found.append(os.path.normpath(os.path.join(lower, rel, name)))
    return found


def _a_leaf(path: str) -> bool:
    """Whether a directory entry of an upper layer is listed itself: a symbolic link, an
    empty (or unreadable) directory; a directory with entries is listed by them."""
    try:
        if os.path.islink(path):
            return True
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return True


def _rebind(fd: int, path: str, *, read_only: bool) -> None:
    try:
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
    except OSError:
        return  # stays hidden behind the overlay: writes there are discarded
    if not read_only:
        return
    attr = (ctypes.c_uint64 * 4)(_MOUNT_ATTR_RDONLY, 0, 0, 0)  # set, clr, propagation, userns
    result = _syscall(_NR_MOUNT_SETATTR, ctypes.c_int(_AT_FDCWD), os.fsencode(path),
                      ctypes.c_uint(_AT_RECURSIVE), ctypes.byref(attr), ctypes.c_size_t(32))
    if result < 0:
        # No mount_setattr (kernel < 5.12): a writable bind would let writes reach the
        # disk through the overlay's Landlock grant, so hide the submount again.
        _libc().umount2(os.fsencode(path), _MNT_DETACH)


# ---------------------------------------------------------------------------- public

def forced_ceiling() -> FilesMode:
    """The strongest mode allowed by ``COORDEX_ISOLATION_FORCE`` (default: no cap)."""
    value = os.environ.get(FORCE_ENV, "").strip().lower()
    return value if value in ("refused", "none") else "discarded"  # type: ignore[return-value]


def force_unavailable(mode: FilesMode | None) -> FilesMode | None:
    """Test hook: make :func:`protect` act as if stronger modes were unavailable.

    Sets ``COORDEX_ISOLATION_FORCE`` in this process's environment, which forked and
    spawned children inherit. ``"refused"`` skips namespaces and overlays; ``"none"``
    skips Landlock too; ``None`` or ``"discarded"`` removes the cap.

    Returns:
        The previous forced value, for restoring it.
    """
    previous = os.environ.get(FORCE_ENV)
    if mode in (None, "discarded"):
        os.environ.pop(FORCE_ENV, None)
    elif mode in ("refused", "none"):
        os.environ[FORCE_ENV] = mode
    else:
        raise ValueError(f"mode must be 'refused', 'none' or None, not {mode!r}")
    return previous if previous in ("refused", "none") else None  # type: ignore[return-value]


def _weaker(a: FilesMode, b: FilesMode) -> FilesMode:
    return a if _RANK[a] <= _RANK[b] else b


def protect(work_paths: Sequence[str], scratch: str, *,
            allow: FilesMode = "discarded",
            map_identity: IdentityMapper | None = None) -> FilesMode:
    """Make disk writes outside ``scratch`` not outlive this process.

    Call it in a freshly forked, single-threaded child before any user code: it changes
    the calling process for good (namespaces, Landlock) and cannot be undone.

    Args:
        work_paths: folders whose writes the code should see but that must not change
            (typically home and the session cwd). Missing ones and "/" are skipped;
            nested ones are covered by their parent.
        scratch: the call's private scratch folder, created and removed by the caller;
            it stays writable and becomes ``TMPDIR``/``TMP``/``TEMP``.
        allow: the strongest mode to try; ``COORDEX_ISOLATION_FORCE`` may lower it.
        map_identity: for root only: ``map_identity(uid_map, gid_map)`` has a process
            outside the new user namespace (that kept its privilege) write those maps
            for this process, and returns whether it did. Default: a ``/bin/sh`` helper
            spawned just before ``unshare`` (~1 ms); the bash launcher server does it
            itself. Without a full map, root maps only itself.

    Returns:
        The mode that holds now: ``"discarded"``, ``"refused"`` or ``"none"``.
    """
    if allow not in _RANK:
        raise ValueError(f"allow must be one of {_MODES}, not {allow!r}")
    scratch = os.path.realpath(scratch)
    for name in ("TMPDIR", "TMP", "TEMP"):
        os.environ[name] = scratch
    if "tempfile" in sys.modules:  # the forked copy may have cached the old folder
        import tempfile  # already loaded: free
        tempfile.tempdir = scratch
    ceiling = _weaker(allow, forced_ceiling())
    if ceiling == "none" or not sys.platform.startswith("linux"):
        return "none"
    if len(os.listdir("/proc/self/task")) != 1:
        # Landlock binds only the calling thread and unshare(CLONE_NEWUSER) refuses a
        # threaded process: other threads would write freely, so promise nothing.
        return "none"
    abi = landlock_abi()
    mode: FilesMode = "refused"
    writable = [scratch, *_DEVICES]
    if ceiling == "discarded":
        dirs = _work_dirs(work_paths, scratch)
        try:
            # Mounts copied into a user namespace are locked, and overlayfs refuses a
            # lower dir with locked mounts below it. Root can skip the user namespace
            # then; anyone else gets those dirs refused instead of discarded.
            points = _mount_points()
            nested = any(_within(p, d) and p != d for p in points for d in dirs)
            userns = _enter_namespaces(userns=not nested, map_identity=map_identity)
            overlaid, complete = _mount_overlays(dirs, scratch, userns, points)
            writable += overlaid
            if complete:
                mode = "discarded"
            try:
                os.chdir(os.getcwd())  # re-enter: the old dentry bypasses the overlay
            except OSError:
                pass
        except OSError:
            pass  # no namespaces here: fall through to Landlock alone
    if not _landlock_usable(abi):
        return "none"
    try:
        _landlock_restrict(abi, writable)
    except OSError:
        return "none"
    return mode


def best_mode(allow: FilesMode = "discarded") -> FilesMode:
    """The mode :func:`protect` is expected to reach here, from :func:`probe` (cached)."""
    ceiling = _weaker(allow, forced_ceiling())
    caps = probe()
    if ceiling == "none" or not _landlock_usable(caps["landlock_abi"]):
        return "none"
    if ceiling == "discarded" and caps["overlay"]:
        return "discarded"
    return "refused"


def probe() -> Capabilities:
    """What this machine supports, tried once in a throwaway forked child, then cached.

    Returns:
        ``{"userns": bool, "overlay": bool, "landlock_abi": int}`` - whether the child
        could enter a user namespace, whether it could mount a working overlay (in a
        user namespace or, for root, a plain mount namespace), and the Landlock ABI
        version (0: none).
    """
    global _probe_cache
    if _probe_cache is None:
        _probe_cache = _probe_in_child()
    return dict(_probe_cache)  # type: ignore[return-value]


def _probe_in_child() -> Capabilities:
    import json
    import tempfile
    import warnings

    result: Capabilities = {"userns": False, "overlay": False, "landlock_abi": landlock_abi()}
    if not sys.platform.startswith("linux"):
        return result
    _libc()  # load before fork: the child should only make syscalls
    base = tempfile.mkdtemp(prefix="coordex-probe-")
    read_end, write_end = os.pipe()
    try:
        os.mkdir(os.path.join(base, "lower"))
        with warnings.catch_warnings():
            # 3.12+ warns about fork() in a threaded process; the child only makes
            # syscalls and leaves with os._exit.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            report = {"userns": False, "overlay": False}
            try:
                os.close(read_end)
                userns = _enter_namespaces()
                report["userns"] = userns
                lower = os.path.join(base, "lower")
                _, complete = _mount_overlays([lower], base, userns, _mount_points())
                with open(os.path.join(lower, "probe"), "w") as f:
                    f.write("x")
                report["overlay"] = complete
            except BaseException:
                pass
            finally:
                os.write(write_end, json.dumps(report).encode())
                os._exit(0)
        os.close(write_end)
        write_end = -1
        data = b""
        while chunk := os.read(read_end, 4096):
            data += chunk
        os.waitpid(pid, 0)
        report = json.loads(data or b"{}")
        result["userns"] = bool(report.get("userns"))
        result["overlay"] = bool(report.get("overlay"))
        # The overlay was private to the child: the probe file never reached the disk.
        result["overlay"] &= not os.path.exists(os.path.join(base, "lower", "probe"))
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
        _remove_tree(base)
    return result


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# argv: this file's folder, scratch, allow, report path or "", "1" for a new process
# group or "", the number of work paths, the work paths, then the command to exec.
# Plain argv and a sys.path import (appended: the standard library still comes first)
# rather than json and importlib.util, whose imports would double the launcher's cost.
_LAUNCHER = """\
import os, sys
sys.path.append(sys.argv[1])
import isolation as module
scratch, allow, report_path, new_group, count = sys.argv[2:7]
paths = sys.argv[7:7 + int(count)]
command = sys.argv[7 + int(count):]
if new_group:
    os.setpgid(0, 0)
report = open(report_path, "w") if report_path else None
mode = module.protect(paths, scratch, allow=allow)
os.environ[module.MODE_ENV] = mode
if report is not None:
    report.write(mode)
    report.close()
os.execvp(command[0], command)
"""


# argv: this file's folder, "1" to keep chmod or "", the number of writable folders,
# the folders, then the command to exec (as for _LAUNCHER).
_STEP = """\
import os, sys
sys.path.append(sys.argv[1])
import isolation as module
may_chmod, count = sys.argv[2:4]
writable = sys.argv[4:4 + int(count)]
command = sys.argv[4 + int(count):]
module.restrict_writes(writable, may_chmod=bool(may_chmod))
os.execv(command[0], command)
"""


def restricted_argv(writable: Sequence[str], command: Sequence[str], *,
                    may_chmod: bool = False) -> list[str]:
    """An argv that runs ``command`` under :func:`restrict_writes` (one more exec: this
    interpreter in isolated mode, without site, loading this file by path). If the
    domain cannot be made, the command does not run: the argv exits with status 1."""
    folders = list(writable)
    return [sys.executable, "-I", "-S", "-c", _STEP, os.path.dirname(os.path.abspath(__file__)),
            "1" if may_chmod else "", str(len(folders)), *folders, *command]


def protected_bash_argv(work_paths: Sequence[str], scratch: str, *,
                        allow: FilesMode = "discarded",
                        bash: Sequence[str] = ("bash", "--norc", "--noprofile"),
                        report_path: str | None = None, new_group: bool = False,
                        ) -> tuple[list[str], FilesMode] | None:
    """How to start a bash under the same protection as :func:`protect`, in one go.

    (The bash backend does not pay for a new interpreter per call: its launcher server,
    :mod:`.launcher`, forks a protected child instead.) The argv runs a small Python
    launcher (this interpreter, isolated mode, importing this
    file from its folder) that calls :func:`protect` in itself and then execs ``bash``; bash
    sees the mode in ``$COORDEX_ISOLATION``.

    Args:
        work_paths, scratch, allow: as for :func:`protect`.
        bash: the command to exec once protected.
        report_path: if given, the launcher writes the mode that actually held there
            (opened before protection, so it may be anywhere writable).
        new_group: the launcher first makes itself a process group leader, so its
            caller can signal (and end) everything the protected bash starts at once.

    Returns:
        ``(argv, expected_mode)``, or None when nothing can be protected here
        (expected mode "none"): start bash as usual then.
    """
    expected = best_mode(allow)
    if expected == "none":
        return None
    paths = list(work_paths)
    argv = [sys.executable, "-I", "-S", "-c", _LAUNCHER,
            os.path.dirname(os.path.abspath(__file__)), scratch, allow, report_path or "",
            "1" if new_group else "", str(len(paths)), *paths, *bash]
    return argv, expected
