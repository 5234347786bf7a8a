"""Tenants and confinement for the servers: which executor serves which token.

``coordex serve --tokens FILE`` is a router: each tenant's Executor runs in a confined
host of its own (:class:`~coordex.ConfinedExecutor`, SPEC section 9), so the server
process itself never runs a tenant's code. ``--confine DIR`` (``serve`` and ``mcp``)
runs the single tenant in one. The server keeps, per tenant, a thread limit of its own
(a tenant's calls beyond ``--max-calls`` wait for that tenant's turn without taking a
thread from anyone else) and a capped number of MCP sessions that expire when idle.

This module holds the checks and choices the command line makes at start: token
lengths, the warnings, the confinement level and whether it is enough, and how each
tenant's executor is built. The CLI calls it; nothing here parses arguments.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .contract import ExecutorLike

if TYPE_CHECKING:
    from .hosting.client import ConfinedExecutor

MIN_TOKEN_LENGTH = 16
# MCP sessions a tenant may hold open at once, and how long an idle one lives.
MCP_SESSIONS_PER_TENANT = 32
MCP_SESSION_IDLE_SECONDS = 900.0
GIB = 1 << 30


def add_confinement_options(parser: argparse.ArgumentParser, *, tenants: bool,
                            count: Callable[[str], int] = int) -> None:
    """The options of section 9 on ``coordex serve`` (``tenants=True``) or ``coordex mcp``;
    ``count`` parses (and checks) ``--max-calls``."""
    group = parser.add_argument_group("confinement (each tenant in a jail of its own)")
    group.add_argument("--confine", metavar="DIR",
                       help="run the executor in a confined host whose working folder and "
                       "home is DIR")
    group.add_argument("--memory-limit", type=_size, metavar="SIZE", default=4 * GIB,
                       help="memory per confined host, e.g. 512M, 4G (default 4G)")
    group.add_argument("--max-calls", type=count, metavar="N", default=8,
                       help="calls a confined host runs at once (default 8)")
    group.add_argument("--no-network", action="store_true",
                       help="confined hosts get loopback only")
    group.add_argument("--readable", action="append", default=[], metavar="DIR",
                       help="a folder of this machine confined hosts may read (bound "
                       "read-only at its own path; repeatable), e.g. a wheelhouse. Nothing "
                       "else of the machine is in their view but its program folders")
    if tenants:
        group.add_argument("--allow-unconfined", action="store_true",
                           help="serve several tenants even where no confinement holds")


def _size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    raw = text.strip().lower().removesuffix("b").removesuffix("i")
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "")
    try:
        value = int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 512M or 4G, got {text!r}")
    if value < 64 << 20:  # below this an interpreter with coordex cannot even start
        raise argparse.ArgumentTypeError(f"must be at least 64M, got {text!r}")
    return value


# --- checks at start ----------------------------------------------------------------


def short_tokens(named: Mapping[str, str]) -> str | None:
    """A message naming the tenants whose token is too short, or None."""
    short = [name or "COORDEX_TOKEN" for name, token in named.items()
             if len(token) < MIN_TOKEN_LENGTH]
    if not short:
        return None
    return (f"refusing tokens shorter than {MIN_TOKEN_LENGTH} characters ("
            + ", ".join(repr(n) for n in short)
            + "). Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")


def startup_warnings(host: str, allowed_hosts: Sequence[str], is_loopback: bool) -> list[str]:
    if is_loopback or allowed_hosts:
        return []
    return [f"bound to non-loopback {host!r} without --allowed-host: clients must use this "
            "exact address as the Host; pass --allowed-host NAME for each name clients use."]


# --- the options every front end takes (the command line's, here below it) ----------


def base_root(home: str | None = None) -> Path:
    """The data folder: ``--home``, else what the Executor uses (``COORDEX_HOME``, else
    the user data dir)."""
    if home:
        return Path(home).expanduser()
    from .core.root import default_root

    return default_root()


def executor_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Executor arguments every front end takes from its options: ``max_sessions``
    and ``timeout`` (the MCP front ends, which have the option, default below MCP
    clients' common 60 s request timeout: SPEC 8)."""
    options: dict[str, Any] = {}
    if getattr(args, "max_sessions", None) is not None:
        options["max_sessions"] = args.max_sessions
    if getattr(args, "timeout", None) is not None:
        options["timeout"] = args.timeout
    elif hasattr(args, "timeout"):
        from .tools import MCP_DEFAULT_TIMEOUT

        options["timeout"] = MCP_DEFAULT_TIMEOUT
    return options


def confinement_level(hidden: Sequence[str]) -> str:
    """The level a confined host reaches here, given what it must not see."""
    from .hosting.client import confinement_level as level

    return level(hidden)


def memory_bound() -> str | None:
    """What the start-up line says where no cgroup can bound a host's memory (SPEC 9:
    the limit then holds per process, not for the host's processes together), or None."""
    from .hosting.jail import _cgroup_base

    if _cgroup_base("memory") is not None:
        return None
    return ("memory: per-process (no cgroup can be made here: each process of a host may "
            "use up to --memory-limit; run the server as root, or delegate it a cgroup v2 "
            "subtree with the memory controller, e.g. systemd's Delegate=memory pids)")


def shared_users(root: Path, named: Mapping[str, str]) -> list[str]:
    """Tenants whose hosts would run as the same user (a root server numbers each
    tenant's user from its folder, hosting.identity): said at start, with the fix."""
    from .hosting.identity import collisions, tenant_user

    folders = [str(root.expanduser().absolute() / "tenants" / name) for name in named if name]
    if tenant_user(folders[0] if folders else "/", "x") is None:
        return []
    return [f"tenants' folders {a!r} and {b!r} map to one user; set COORDEX_TENANT_IDS to "
            "another range" for a, b in collisions(folders)]


def confinement_refusal(level: str, tenants: int, allow_unconfined: bool) -> str | None:
    """Why the server must not start, or None."""
    if level != "none" or tenants <= 1 or allow_unconfined:
        return None
    return (f"no confinement holds on this machine (level 'none'), so {tenants} tenants would "
            "share one OS user with nothing between them. Enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1 / "
            "user.max_user_namespaces) or Landlock, or pass --allow-unconfined.")


def hide_secrets_from_sessions() -> None:
    """Take ``COORDEX_TOKEN`` out of this process's environment once it has been read.

    Out of ``os.environ`` is not enough: ``/proc/PID/environ`` shows the environment the
    process started with, which the code of an unconfined tenant (in this process, or a
    child reading its parent's) can read. The value is overwritten there too, in place.
    """
    if "COORDEX_TOKEN" in os.environ:
        _wipe_initial_environment("COORDEX_TOKEN")
    os.environ.pop("COORDEX_TOKEN", None)


def _wipe_initial_environment(name: str) -> None:
    """Overwrite ``name``'s value with NULs where the C library's environment holds it
    (the block ``/proc/self/environ`` shows, unless it was set again since)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_void_p
        libc.getenv.argtypes = [ctypes.c_char_p]
        address = libc.getenv(name.encode())
        if address:
            ctypes.memset(address, 0, len(ctypes.string_at(address)))
    except (OSError, AttributeError, ValueError):
        pass


# --- executors ----------------------------------------------------------------------


def environments_folder(root: Path, name: str, folder: Path) -> Path:
    """Where a confined tenant's built environments live: under the server's root, which
    no host sees (its own folder is bound back into its jail, read-only), one folder per
    tenant (``tenants/NAME``) or per ``--confine DIR`` (named by the folder's path).
    Never shared between tenants: a build runs the tenant's setup code."""
    base = root.expanduser().absolute() / "environments"
    if name:
        return base / "tenants" / name
    import hashlib

    return base / "confined" / hashlib.sha256(
        os.path.realpath(folder).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def records_folder(root: Path, name: str, folder: Path) -> Path:
    """Where a confined tenant's call log and stored functions live: beside its
    environments under the server's root (``records/tenants/NAME``), written by the
    server alone and read-only in the tenant's jail (SPEC 9)."""
    environments = environments_folder(root, name, folder)
    base = root.expanduser().absolute() / "records"
    return base / environments.parent.name / environments.name


def confined_executor(args: argparse.Namespace, folder: Path, *, name: str,
                      hidden: Sequence[str | Path], environments: Path | None = None,
                      records: Path | None = None, lazy: bool = False,
                      nodes: Any = None) -> ConfinedExecutor:
    """A :class:`ConfinedExecutor` for one tenant, from the command-line options;
    ``environments`` is its folder of built environments (see :func:`environments_folder`);
    ``nodes`` (a NodeRelay) puts its bash and environment sessions on the cluster."""
    from .environments.build_env import settings_file
    from .hosting import ConfinedExecutor

    executor_args = executor_options(args)
    if hasattr(args, "no_persist"):  # SPEC 12: kept in its tenant's folder, in its jail
        executor_args["persist"] = not args.no_persist
    return ConfinedExecutor(folder, environments=environments, records=records,
                            build_settings=settings_file(base_root(getattr(args, "home", None))),
                            memory_limit=args.memory_limit,
                            network=not args.no_network, max_calls=args.max_calls,
                            hide=[str(p) for p in hidden], name=name or "default",
                            readable=getattr(args, "readable", None) or (),
                            lazy=lazy, nodes=nodes, **executor_args)


def secrets_to_hide(root: Path, tokens_file: str | None) -> list[str]:
    """What no confined host may see: the server's root and its tokens file."""
    hidden = [str(root.expanduser().absolute())]
    if tokens_file:
        hidden.append(str(Path(tokens_file).expanduser().absolute()))
    return hidden


def tenant_executor(args: argparse.Namespace, name: str, root: Path,
                    make_in_process: Callable[[], ExecutorLike]) -> ExecutorLike:
    """The executor of one ``serve`` tenant.

    Named tenants (``--tokens``) each get a confined host in ``root/tenants/NAME``; the
    single ``COORDEX_TOKEN`` tenant gets one in ``--confine DIR`` when given, else runs
    in this process (``make_in_process()``), with ``root`` as its data folder.
    """
    hidden = secrets_to_hide(root, getattr(args, "tokens", None))
    confined = bool(name or getattr(args, "confine", None))
    if confined and getattr(args, "cluster", None):
        from .hosting.tenant_node import ray_secrets

        hidden += ray_secrets()
    if name:
        folder = root / "tenants" / name
        return confined_executor(args, folder, name=name, hidden=hidden, lazy=True,
                                 environments=environments_folder(root, name, folder),
                                 records=records_folder(root, name, folder),
                                 nodes=tenant_nodes(args, name, root=root, hidden=hidden))
    if getattr(args, "confine", None):
        folder = Path(args.confine)
        return confined_executor(args, folder, name="default", hidden=hidden,
                                 environments=environments_folder(root, "", folder),
                                 records=records_folder(root, "", folder),
                                 nodes=tenant_nodes(args, "default", root=root, hidden=hidden))
    return make_in_process()


def tenant_nodes(args: argparse.Namespace, name: str, *, root: Path | None = None,
                 hidden: Sequence[str] = ()) -> Any:
    """With ``--cluster``: the tenant's actors on the cluster (SPEC 10, last bullet), each
    running the tenant's sessions in a confined host of the tenant on its node, with the
    limits its host has here. The server holds the cluster connection, never the host.
    The node hides what this server hides (``hidden``: its root, its tokens file), and
    keys the tenant's folder there by this server's identity (kept in ``root``)."""
    if not getattr(args, "cluster", None):
        return None
    from .hosting.identity import server_identity
    from .hosting.relay import NodeRelay

    server = server_identity(root) if root is not None else ""
    return NodeRelay(args.cluster, {"name": name, "memory_limit": args.memory_limit,
                                    "network": not args.no_network,
                                    "max_calls": args.max_calls,
                                    "readable": list(getattr(args, "readable", None) or ()),
                                    "hide": [str(p) for p in hidden], "server": server})


def join_cluster_for_tenants(address: str) -> tuple[Any, list[str], str | None]:
    """Join the cluster once for every tenant and probe each node's confinement.

    Returns the connection (close it last), the lines to print at start (one per node,
    saying which are not used for tenants), and why the server must not start (no node
    can confine), or None. Raises CoordexError when the cluster cannot be joined.
    """
    from .backends.ray import RayCluster
    from .hosting.tenant_node import probe

    cluster = RayCluster(address, capabilities=None, probe=probe)
    levels = cluster.node_levels()
    lines = []
    for node, found in sorted(levels.items(), key=lambda item: item[1].get("host", "")):
        level = found.get("level", "none")
        where = f"cluster node {node[:12]} ({found.get('host')})"
        lines.append(f"{where}: confinement {level}" if level != "none" else
                     f"{where}: confinement none - not used for tenants' sessions")
    if not any(found.get("level", "none") != "none" for found in levels.values()):
        return cluster, lines, (
            "no node of the cluster can confine tenants' sessions (level 'none' on every "
            "node). Enable unprivileged user namespaces or Landlock on the nodes, or serve "
            "without --cluster.")
    return cluster, lines, None


def tenant_options(args: argparse.Namespace, confined: bool) -> dict[str, Any]:
    """``make_tenant`` keyword arguments: the tenant's own thread limit and MCP sessions."""
    import anyio

    calls = args.max_calls if confined else 40  # 40: anyio's default, for one tenant
    return {"limiter": anyio.CapacityLimiter(calls + 2),  # +2: list/inspect during a long call
            "max_mcp_sessions": MCP_SESSIONS_PER_TENANT,
            "idle_timeout": MCP_SESSION_IDLE_SECONDS}


__all__ = [
    "MIN_TOKEN_LENGTH",
    "add_confinement_options",
    "confined_executor",
    "confinement_level",
    "confinement_refusal",
    "environments_folder",
    "hide_secrets_from_sessions",
    "join_cluster_for_tenants",
    "records_folder",
    "secrets_to_hide",
    "short_tokens",
    "startup_warnings",
    "tenant_executor",
    "tenant_nodes",
    "tenant_options",
]
