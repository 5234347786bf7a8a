"""Who a jail runs as (SPEC 9, "Identity").

An unprivileged server's hosts keep its user: they can be no one else. A root server
never runs a tenant as root: each tenant's host runs as a user and group of its own,
numbered from its folder's real path (so the same tenant of the same server gets the
same user at every start, and its files stay its own), in a range the operator may set
with ``COORDEX_TENANT_IDS=START-END`` (default :data:`DEFAULT_RANGE`; keep it apart from
the machine's users and its ``/etc/subuid`` ranges). Two folders whose numbers collide
would share a user; with a range of 2**24 ids and a hundred tenants the odds are about
one in three thousand, and the server says so at start when it sees it
(:func:`collisions`).

The keeper (root, outside) hands the tenant's folders over to that user
(:func:`hand_over`) and, at the ``namespaces+landlock`` level, writes the jail's
identity map (:func:`map_writer`); the warden then takes the user itself before it
forks anything (:func:`become`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Sequence

DEFAULT_RANGE = (1_500_000_000, 1_500_000_000 + (1 << 24))
_PR_SET_DUMPABLE = 4


def id_range(text: str | None = None) -> tuple[int, int]:
    """The range ``COORDEX_TENANT_IDS`` names (``START-END``, END excluded), or the
    default; raises ValueError on a malformed or unsafe range."""
    text = os.environ.get("COORDEX_TENANT_IDS", "") if text is None else text
    if not text.strip():
        return DEFAULT_RANGE
    start_text, _, end_text = text.partition("-")
    try:
        start, end = int(start_text), int(end_text)
    except ValueError:
        raise ValueError(f"COORDEX_TENANT_IDS must be START-END, got {text!r}") from None
    if not 1000 <= start < end <= 4_294_967_294:
        raise ValueError(f"COORDEX_TENANT_IDS {text!r}: ids must lie in 1000..4294967294, "
                         "START below END")
    return start, end


def tenant_user(folder: str, name: str, *, ids: tuple[int, int] | None = None,
                euid: int | None = None) -> tuple[int, int, str] | None:
    """(uid, gid, name) for the host of ``folder`` where this process is root, else None."""
    if (os.geteuid() if euid is None else euid) != 0:
        return None
    start, end = ids or id_range()
    digest = hashlib.sha256(os.path.realpath(folder).encode("utf-8", "surrogateescape"))
    number = start + int.from_bytes(digest.digest()[:8], "big") % (end - start)
    if euid is None and not _mapped(number):
        return None  # root of a user namespace that has no such user: it can be no one else
    return number, number, _user_name(name)


SERVER_ID_FILE = "server-id"


def server_identity(root: str | os.PathLike[str]) -> str:
    """This server's identity: a random name kept in its root (made at the first start),
    so two servers sharing a cluster never share a tenant's folder, user or
    environments on a node, even for tenants of the same name."""
    import secrets

    path = os.path.join(os.fspath(root), SERVER_ID_FILE)
    for _ in range(3):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
            if len(text) == 16 and all(c in "0123456789abcdef" for c in text):
                return text
            os.unlink(path)  # damaged: a new identity (its node folders are left behind)
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError):
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.makedirs(os.fspath(root), exist_ok=True)
        text = secrets.token_hex(8)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # another process of this server made it first: read that one
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text + "\n")
        return text
    raise OSError(f"cannot keep the server's identity in {path!r}")


def _mapped(uid: int) -> bool:
    """True when this process's user namespace has ``uid`` (and the same gid)."""
    for file in ("/proc/self/uid_map", "/proc/self/gid_map"):
        try:
            with open(file) as f:
                rows = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
        except (OSError, ValueError):
            return False
        if not any(inside <= uid < inside + count for inside, _, count in rows):
            return False
    return True


def _user_name(name: str) -> str:
    clean = "".join(c if c.isalnum() or c in "-_" else "_" for c in name.lower())[:24]
    return clean if clean and clean[0].isalpha() else f"t_{clean}"[:24]


def collisions(folders: Iterable[str], ids: tuple[int, int] | None = None) -> list[tuple[str, str]]:
    """Pairs of folders whose hosts would run as the same user."""
    seen: dict[int, str] = {}
    pairs = []
    for folder in folders:
        user = tenant_user(folder, "x", ids=ids, euid=0)
        assert user is not None
        if user[0] in seen:
            pairs.append((seen[user[0]], folder))
        seen.setdefault(user[0], folder)
    return pairs


def hand_over(paths: Sequence[str], uid: int, gid: int) -> None:
    """Make ``paths`` (and all they hold) the tenant's, where they are not yet: a folder
    a root server made, or one kept from before tenants had users of their own. Its
    top folder is made the user's alone (0700), so no other tenant reaches it even by
    name (the ``landlock`` level)."""
    for top in paths:
        try:
            st = os.lstat(top)
        except OSError:
            continue
        if (st.st_uid, st.st_gid) != (uid, gid):
            for folder, dirs, files in os.walk(top):
                for name in (*dirs, *files):
                    os.lchown(os.path.join(folder, name), uid, gid)
            os.chown(top, uid, gid)
        os.chmod(top, stat.S_IMODE(os.stat(top).st_mode) & ~0o077 | 0o700)


def map_writer(pid: int, uid: int, gid: int) -> Callable[[], None]:
    """What the keeper (root, outside) writes for the warden ``pid`` once it has made
    its user namespace: the tenant's user and group map to themselves, nothing else
    (the warden's own root then has no name inside and no file of root's is its own)."""

    def write() -> None:
        for file, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/{pid}/{file}", "w") as f:
                f.write(text)

    return write


def become(uid: int, gid: int) -> None:
    """Take the tenant's user and group for good (real, effective and saved ids).

    The kernel marks a process that gave up root as not dumpable, which makes its
    ``/proc/self`` root's: it could no longer read its own descriptors (a bind from
    ``/proc/self/fd/N``, a subprocess closing its fds). It is the tenant's own process
    now, so it is made dumpable again.
    """
    from ..backends import isolation as iso

    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    iso._libc().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


__all__ = ["DEFAULT_RANGE", "SERVER_ID_FILE", "become", "collisions", "hand_over", "id_range",
           "map_writer", "server_identity", "tenant_user"]
