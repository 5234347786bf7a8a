"""The ``coordex`` command line: MCP servers, the demo, and environment/library upkeep.

Each subcommand is a small function that returns an exit code: 0 success, 1 failure
(an error dict came back, a step failed), 2 usage (bad arguments, an unsafe or
impossible configuration). argparse itself exits 2 on a malformed command line.
Messages go to stderr; data (tables, JSON) to stdout - except under ``coordex mcp``,
where stdout is the protocol and nothing else may touch it.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import secrets
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .contract import ExecutorLike
from .router import base_root, executor_options

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _say(*parts: object) -> None:
    print("coordex:", *parts, file=sys.stderr, flush=True)


def _cannot_start(exc: BaseException) -> None:
    """Why a server cannot start, with the frames that failed: an operator sees where."""
    import logging
    import traceback

    _say(f"cannot start the executor: {type(exc).__name__}: {exc}")
    server_log = logging.getLogger("coordex.server")
    if server_log.hasHandlers():  # --log-format / --log-level set a handler (SPEC 16)
        server_log.error("the server did not start", exc_info=exc)
        return
    sys.stderr.write("".join(traceback.format_exception(exc)))
    sys.stderr.flush()


def _show_error(record: dict[str, Any]) -> None:
    _say(f"error ({record.get('error_type', '?')}): {record.get('error', '')}")
    if record.get("suggestion"):
        print(f"  suggestion: {record['suggestion']}", file=sys.stderr)
    if record.get("log"):
        print("  log tail:\n" + _indent(str(record["log"])), file=sys.stderr)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip("\n").splitlines())


def _is_error(record: Any) -> bool:
    return isinstance(record, dict) and "error_type" in record


# --- executor construction ---------------------------------------------------------------


def make_executor(args: argparse.Namespace, root: Path | None = None,
                  envs_dir: Path | None = None) -> ExecutorLike:
    """An Executor from the common options. ``root=None`` lets the Executor resolve it."""

    from .executor import Executor

    kwargs = executor_options(args)
    if root is not None:
        kwargs["root"] = root
    elif getattr(args, "home", None):
        kwargs["root"] = Path(args.home).expanduser()
    # Built environments are content-addressed, so tenants may share them on disk.
    if envs_dir is not None:
        kwargs["envs_dir"] = envs_dir
    if getattr(args, "cluster", None):
        kwargs["cluster"] = args.cluster
    if hasattr(args, "no_persist"):  # coordex mcp and serve keep sessions (SPEC 12)
        kwargs["persist"] = not args.no_persist
    return Executor(**kwargs)


@contextlib.contextmanager
def open_executor(args: argparse.Namespace) -> Iterator[ExecutorLike]:
    ex = make_executor(args)
    try:
        yield ex
    finally:
        ex.close()


def _only_interrupts(exc: BaseException) -> bool:
    """True for KeyboardInterrupt, or an exception group holding only interrupts."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    inner = getattr(exc, "exceptions", None) or ()
    return bool(inner) and all(_only_interrupts(e) for e in inner)


def _terminate_as_interrupt() -> None:
    # SIGTERM (from a supervisor or an MCP client shutting us down) should unwind like
    # Ctrl-C, so `with Executor` closes and every child process is reaped. SIGINT gets
    # a handler of our own too: asyncio's runner replaces the default one with a handler
    # that only cancels the main task, which then waits on the transport's read of
    # stdin for as long as the client keeps it open.
    with contextlib.suppress(ValueError):  # not in the main thread
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _answer_then_interrupt(executors: list[Any]) -> None:
    """SIGTERM/SIGINT for ``coordex mcp``: every request in flight is answered first
    (``mcp_server.stop_answering``, on a thread), then the main thread is interrupted
    as before; a second signal interrupts at once."""
    import threading

    from .mcp_server import stop_answering

    state = {"asked": False, "answered": False}
    main = threading.main_thread().ident

    def answer() -> None:
        stop_answering(executors)
        state["answered"] = True
        # A real signal to the main thread: it wakes the event loop's wait, and runs the
        # handler below again, which now interrupts.
        if main is not None:
            signal.pthread_kill(main, signal.SIGINT)

    def handler(signum: int, frame: object) -> None:
        if state["asked"] or state["answered"]:
            raise KeyboardInterrupt
        state["asked"] = True
        threading.Thread(target=answer, name="coordex-stop", daemon=True).start()

    with contextlib.suppress(ValueError):  # not in the main thread
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def _leave_promptly(code: int) -> int:
    """``code``, once the executors are closed - or exit now if threads would hold it.

    After a signal, threads the server cannot stop may remain: the transport's read of
    a stdin the client keeps open, a call stuck in C in the agent's own interpreter.
    Python's exit waits for them (``threading._shutdown``), for good. Every process
    coordex started is ended by now, so give them a moment, then leave without them
    (SPEC section 8: out within 5 s of SIGTERM or SIGINT).
    """
    import atexit
    import threading
    import time

    deadline = time.monotonic() + LEAVE_GRACE
    waiting = [t for t in threading.enumerate()
               if t is not threading.current_thread() and not t.daemon]
    for thread in waiting:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in waiting):
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    return code


# How long threads left after a signal get to finish before the process leaves them.
LEAVE_GRACE = 0.5


def _log_start_failure() -> None:
    """A server that cannot start logs why, with the traceback (SPEC 16)."""
    import logging

    logging.getLogger("coordex.server").error("the server did not start", exc_info=True)


# --- mcp -----------------------------------------------------------------------------------


def _load_mcp_sdk(failed: list[BaseException]) -> None:
    try:
        import coordex.mcp_server  # noqa: F401 - loaded here, used by the main thread
    except BaseException as exc:  # the main thread reports it
        failed.append(exc)


# The MCP SDK is the `mcp` extra of coordex-slim (the `coordex` distribution has it): a
# library-only install says how to add the server before anything starts.
MCP_SDK = "mcp>=2.3,<3"
SERVER_INSTALL = ("pip install coordex  (or: pip install 'coordex-slim[mcp]'; "
                  "or run it without installing: uvx coordex mcp)")


def missing_server_sdk() -> str | None:
    """Why ``coordex mcp`` / ``serve`` cannot run here (no MCP SDK 2.x), or None."""
    import importlib.metadata
    import importlib.util

    from packaging.requirements import Requirement

    if importlib.util.find_spec("mcp") is None:
        found = "is not installed"
    else:
        try:
            version = importlib.metadata.version("mcp")
        except importlib.metadata.PackageNotFoundError:
            return None  # an unpackaged SDK on the path: let the import decide
        if Requirement(MCP_SDK).specifier.contains(version, prereleases=True):
            return None
        found = f"is version {version}"
    return (f"the MCP server needs the MCP SDK ({MCP_SDK}), which {found} in this "
            f"environment ({sys.executable}). Install the server: {SERVER_INSTALL}. The "
            "library (import coordex, Executor) works without it.")


def cmd_mcp(args: argparse.Namespace) -> int:
    import threading

    from .mcp_hello import claim_stdio, greet

    # First, before the executor starts a thread or child: nothing may reach fd 1 but us.
    wire = claim_stdio()
    _terminate_as_interrupt()
    # The MCP SDK takes ~0.5 s to import: it loads while initialize is answered (SPEC 8).
    # Python 3.11's sysconfig fills its cache of build settings non-atomically, and that
    # import fills it (zoneinfo) while the executor starting here reads it (uv asks for
    # "EXE"): the reader could get None. Filled now, before the second thread exists.
    import sysconfig

    sysconfig.get_config_vars()
    failed: list[BaseException] = []
    loading = threading.Thread(target=_load_mcp_sdk, args=(failed,), daemon=True,
                               name="coordex-load-mcp")
    loading.start()
    greeting = greet(wire)
    from .observe import command as observe

    problem = observe.start(args)  # logging, --otel (SPEC 16)
    if problem is not None:
        _say(problem)
        return EXIT_USAGE
    ex: ExecutorLike
    try:
        if args.confine:
            from . import router

            hidden = router.secrets_to_hide(base_root(args.home), None)
            _say(f"confinement: {router.confinement_level(hidden)}")
            if (bound := router.memory_bound()) is not None:
                _say(bound)
            folder = Path(args.confine)
            ex = router.confined_executor(args, folder, name="default", hidden=hidden,
                                          environments=router.environments_folder(
                                              base_root(args.home), "", folder),
                                          records=router.records_folder(
                                              base_root(args.home), "", folder))
        else:
            ex = make_executor(args)
    except Exception as exc:
        _cannot_start(exc)
        return EXIT_FAILURE
    if args.ui is not None:
        page = ex.serve_ui(port=args.ui, host=args.ui_host)
        if _is_error(page):
            _show_error(page)
            ex.close()
            return EXIT_USAGE
        _say(f"the page with this server's sessions and call log: {page['url']}")
    loading.join()
    if failed:
        ex.close()
        raise failed[0]
    import anyio

    from . import mcp_server
    from .mcp_server import serve_stdio

    if args.max_wait is not None:
        mcp_server.MAX_WAIT = args.max_wait
    _answer_then_interrupt([ex])
    interrupted = False
    try:
        anyio.run(serve_stdio, ex, wire, greeting)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        ex.close()
    return _leave_promptly(EXIT_OK) if interrupted else EXIT_OK


# --- serve ---------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _read_tokens(path: str) -> dict[str, str]:
    from .mcp_server import parse_tokens

    file = Path(path).expanduser()
    text = file.read_text(encoding="utf-8")
    if os.name == "posix" and file.stat().st_mode & 0o077:
        _say(f"warning: {path} is readable by other users; consider 'chmod 600 {path}'.")
    return parse_tokens(text, source=str(path))


def cmd_serve(args: argparse.Namespace) -> int:
    import anyio

    from . import mcp_server, router
    from .mcp_server import (
        BearerTenantApp,
        TokenFileError,
        bind_socket,
        make_tenant,
        serve_http,
    )
    from .observe import command as observe

    if args.max_wait is not None:
        mcp_server.MAX_WAIT = args.max_wait

    tenants: list[Any] = []
    problem = observe.start(args, tenants=bool(args.tokens), sources=lambda: [
        (t.name if args.tokens else None, t.executor) for t in tenants])
    if problem is not None:
        _say(problem)
        return EXIT_USAGE
    metrics_token = observe.metrics_token()
    env_token = (os.environ.get("COORDEX_TOKEN") or "").strip() or None
    root = base_root(args.home)
    named: dict[str, str]
    if args.tokens:
        try:
            named = _read_tokens(args.tokens)
        except (OSError, TokenFileError) as exc:
            _say(f"cannot use --tokens {args.tokens!r}: {exc}")
            return EXIT_USAGE
        if env_token:
            _say("warning: --tokens replaces COORDEX_TOKEN; that token is not accepted.")
    elif env_token:
        named = {"": env_token}
    elif not is_loopback(args.host):
        _say(
            f"refusing to serve on non-loopback host {args.host!r} without a token. "
            "Set COORDEX_TOKEN or pass --tokens FILE, or bind --host 127.0.0.1."
        )
        return EXIT_USAGE
    else:
        named = {"": secrets.token_urlsafe(32)}
    router.hide_secrets_from_sessions()
    problem = router.short_tokens(
        {**named, **({"COORDEX_METRICS_TOKEN": metrics_token} if metrics_token else {})})
    if problem is not None:
        _say(problem)
        return EXIT_USAGE
    confined = bool(args.tokens or args.confine)
    if confined:
        level = router.confinement_level(router.secrets_to_hide(root, args.tokens))
        _say(f"confinement: {level}")
        if level != "none" and (bound := router.memory_bound()) is not None:
            _say(bound)
        for warning in router.shared_users(root, named):
            _say(f"warning: {warning}")
        refusal = router.confinement_refusal(level, len(named), args.allow_unconfined)
        if refusal is not None:
            _say(f"refusing to start: {refusal}")
            return EXIT_USAGE
    else:
        _say("confinement: none (the single tenant runs in this process; --confine DIR "
             "runs it in a jail)")
    for warning in router.startup_warnings(args.host, args.allowed_host, is_loopback(args.host)):
        _say(f"warning: {warning}")

    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        _say(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return EXIT_FAILURE
    if not (args.tokens or env_token):  # shown once it can be used: the port is ours
        _say("COORDEX_TOKEN is not set; this run's bearer token (shown once):")
        print(f"  {named['']}", file=sys.stderr, flush=True)
    _terminate_as_interrupt()
    tenants_cluster = None  # with several tenants the server holds the one connection
    if args.cluster and (args.tokens or args.confine):  # every confined tenant
        from .core.errors import CoordexError

        try:
            tenants_cluster, lines, refusal = router.join_cluster_for_tenants(args.cluster)
        except CoordexError as exc:
            sock.close()
            _say(f"cannot use --cluster {args.cluster!r}: {exc.error} {exc.suggestion}")
            return EXIT_FAILURE
        for line in lines:
            _say(line)
        if not args.no_network:
            _say("warning: tenants have network, so their code can reach the cluster's Ray "
                 "ports; unless the cluster uses Ray's token authentication, pass "
                 "--no-network or firewall the cluster from the tenants.")
        if refusal is not None:
            sock.close()
            tenants_cluster.close()
            _say(f"refusing to start: {refusal}")
            return EXIT_USAGE
    try:
        for name, token in named.items():
            # Named tenants run confined in root/tenants/NAME; the single COORDEX_TOKEN
            # tenant lives in root itself (or in --confine DIR).
            ex = router.tenant_executor(args, name, root, lambda: make_executor(args, root=root))
            tenants.append(make_tenant(name or "default", token, ex, args.host, args.allowed_host,
                                       **router.tenant_options(args, confined),
                                       tenant_label=name or None))
    except Exception as exc:
        sock.close()
        for tenant in tenants:
            tenant.executor.close()
        if tenants_cluster is not None:
            tenants_cluster.close()
        _cannot_start(exc)
        return EXIT_FAILURE

    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    try:
        oauth = _oauth_gate(args, shown, port)
    except Exception as exc:  # the issuer's metadata or keys cannot be found
        sock.close()
        for tenant in tenants:
            tenant.executor.close()
        _say(f"cannot use --oauth-issuer {args.oauth_issuer!r}: {exc}")
        return EXIT_USAGE
    if oauth is not None:
        _say(f"OAuth: JWTs of {args.oauth_issuer} for {oauth.resource}; metadata at "
             f"{oauth.metadata_url}")
    app = BearerTenantApp(tenants, ui_root=root, oauth=oauth)
    app.metrics_token = metrics_token

    def ready() -> None:
        _say(f"serving MCP on http://{shown}:{port}/mcp ({len(tenants)} tenant(s))")
        # The page: each tenant's token shows that tenant alone.
        _say(f"the page with sessions and call log: http://{shown}:{port}/ui/?token=<token>")

    interrupted = False
    try:
        anyio.run(serve_http, app, sock, ready)
    except SystemExit as exc:  # uvicorn exits on a failed startup (e.g. the lifespan)
        _say(f"the HTTP server stopped during startup (code {exc.code}).")
        _log_start_failure()
        return EXIT_FAILURE
    except BaseException as exc:
        # SIGTERM arrives as KeyboardInterrupt, which anyio may wrap in an exception group.
        if not _only_interrupts(exc):
            _log_start_failure()
            raise
        interrupted = True
    finally:
        sock.close()
        # The app's lifespan closes executors on a clean shutdown; closing twice is safe.
        for tenant in tenants:
            with contextlib.suppress(Exception):
                tenant.executor.close()
        if tenants_cluster is not None:
            with contextlib.suppress(Exception):
                tenants_cluster.close()
    return _leave_promptly(EXIT_OK) if interrupted else EXIT_OK


# --- log -----------------------------------------------------------------------------------


def cmd_log(args: argparse.Namespace) -> int:
    from .core.errors import CoordexError
    from .log import LOG_FILE, show
    from .log.calls import history, read
    from .log.stats import STATS_COLUMNS, summarize
    from .log.store import LogReader, decode_row

    source = LogReader(base_root(args.home) / LOG_FILE)
    try:
        if args.stats:
            rows = [decode_row(r) for r in read(source, f"SELECT {STATS_COLUMNS} FROM calls", [])]
            report = summarize(rows)
            if args.json:
                print(json.dumps(report, indent=2))
                return EXIT_OK
            sessions, places, totals = show.stats_tables(report)
            columns = ["calls", "errors", "state_losses", "rebuilds", "read_only_changed"]
            print("per session:")
            _print_table(sessions, ["session", "place", *columns])
            print("\nper coordinate:")
            _print_table(places, ["place", "state_mode", *columns])
            print("\n" + totals)
            return EXIT_OK
        if args.seq is not None:
            one = history(source, seq=args.seq)
            if args.json:
                print(json.dumps(one, indent=2, default=str))
            else:
                print("\n".join(show.call_detail(one["call"])))
            return EXIT_OK
        name = args.session
        by_id = name is not None and name.isdigit()
        calls = history(source, session_id=int(name) if by_id else None,
                        session_name=None if by_id else name, limit=args.limit)
    except CoordexError as exc:
        _show_error(exc.to_dict())
        return EXIT_FAILURE
    if args.json:  # JSON escapes every control character itself
        print(json.dumps(calls, indent=2, default=str))
        return EXIT_OK
    if not calls["calls"]:
        _say(f"no calls in the log under {base_root(args.home)}.")
        return EXIT_OK
    _print_table([show.call_line(c) for c in calls["calls"]],
                 ["seq", "at", "where", "state_mode", "outcome", "ms", "code"])
    return EXIT_OK


# --- env -----------------------------------------------------------------------------------


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column.endswith("_at") and isinstance(value, (int, float)):
        import datetime

        return datetime.datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    cells = [[_cell(c, r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())



def cmd_env_list(args: argparse.Namespace) -> int:
    from .environments.manager import DB_NAME

    if not (base_root(args.home) / DB_NAME).exists():  # a listing creates nothing
        print(json.dumps({"environments": []}, indent=2) if args.json else
              "No environments yet. Create one with 'coordex env create SPEC', "
              "environments.create(spec) or the create_environment tool.")
        return EXIT_OK
    with open_executor(args) as ex:
        envs = ex.environments
        listing = envs.list()
    if _is_error(listing):
        _show_error(listing)
        return EXIT_FAILURE
    if args.json:
        print(json.dumps(listing, indent=2))
    elif not listing.get("environments"):
        print("No environments yet. Create one with 'coordex env create SPEC', "
              "environments.create(spec) or the create_environment tool.")
    else:
        _print_table(listing["environments"],
                     ("venv_id", "name", "built", "spec_hash", "last_used_at"))
    return EXIT_OK


def _print_build_line(stream: str, text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()


def cmd_env_create(args: argparse.Namespace) -> int:
    spec = args.spec
    if spec == "-":
        spec = sys.stdin.read()
    elif "\n" not in spec and Path(spec).is_file():  # a pyproject.toml, script or list
        spec = Path(spec).read_text(encoding="utf-8")
    with open_executor(args) as ex:
        made = ex.environments.create(spec, args.name)
    if _is_error(made):
        _show_error(made)
        return EXIT_FAILURE
    print(json.dumps(made, indent=2))
    return EXIT_OK


def cmd_env_show(args: argparse.Namespace) -> int:
    with open_executor(args) as ex:
        shown = ex.environments.show(args.venv_id)
    if _is_error(shown):
        _show_error(dict(shown))
        return EXIT_FAILURE
    if args.json:
        print(json.dumps(shown, indent=2))
        return EXIT_OK
    name = f" ({shown['name']!r})" if shown.get("name") else ""
    print(f"venv_id {shown['venv_id']}{name}, built: {'yes' if shown['built'] else 'no'}")
    if shown.get("path"):
        print(f"path: {shown['path']}")
    print("spec:")
    print(_indent(shown["spec"].rstrip("\n")))
    if shown["built"]:
        print("packages:")
        print(_indent("\n".join(f"{p['name']}=={p['version']}" for p in shown["packages"])
                      or "(none)"))
    else:
        print("packages: not built yet (coordex env build ID, or the first call builds it)")
    return EXIT_OK


def cmd_env_build(args: argparse.Namespace) -> int:
    from .tools import build_environment

    with open_executor(args) as ex:
        envs = ex.environments
        known = envs.show(args.venv_id)
        if _is_error(known):
            _show_error(dict(known))
            return EXIT_FAILURE
        _say(f"building environment {args.venv_id} with uv ...")
        result = build_environment(envs, args.venv_id, _print_build_line)
    if _is_error(result):
        _show_error(result)
        return EXIT_FAILURE
    _say(f"environment {args.venv_id} is built.")
    print(json.dumps(result, indent=2))
    return EXIT_OK


def cmd_env_remove_unused(args: argparse.Namespace) -> int:
    with open_executor(args) as ex:
        result = ex.environments.remove_unused()
    if _is_error(result):
        _show_error(result)
        return EXIT_FAILURE
    print(json.dumps(result, indent=2))
    return EXIT_OK


# --- functions -----------------------------------------------------------------------------



def cmd_functions_list(args: argparse.Namespace) -> int:
    with open_executor(args) as ex:
        listing = ex.functions.list()
    if _is_error(listing):
        _show_error(listing)
        return EXIT_FAILURE
    functions = listing["functions"]
    if args.json:
        print(json.dumps({"functions": functions}, indent=2, default=str))
    elif not functions:
        print("No stored functions yet. Define one with @ex.functions.define().")
    else:
        _print_table(functions, ["name", "version", "signature", "env", "created_at"])
    return EXIT_OK


def cmd_functions_show(args: argparse.Namespace) -> int:
    with open_executor(args) as ex:
        record = ex.functions.show(args.name)
    if _is_error(record):
        _show_error(record)
        return EXIT_FAILURE
    source = record.get("source") if isinstance(record, dict) else None
    meta = {k: v for k, v in record.items() if k != "source"}
    print(json.dumps(meta, indent=2, default=str))
    if source:
        print()
        print(source.rstrip("\n"))
    return EXIT_OK


# --- demo, version -------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(home=args.home, keep=args.keep)


def cmd_eval(args: argparse.Namespace) -> int:
    from .eval.command import run

    return run(args)


def cmd_version(args: argparse.Namespace) -> int:
    print(f"coordex {__version__}")
    return EXIT_OK


# --- parser --------------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535 (0 picks a free port), got {text!r}")
    return value


def _add_confinement_options(parser: argparse.ArgumentParser, *, tenants: bool) -> None:
    from .router import add_confinement_options

    add_confinement_options(parser, tenants=tenants, count=_positive_int)


_NO_PERSIST_HELP = ("do not keep sessions on disk: by default a session's state is kept "
                    "under HOME/snapshots and found again after a restart or a crash")


def _add_oauth_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "OAuth", "also accept JWT access tokens of one authorization server (hosted "
        "connectors); bearer tokens keep working")
    group.add_argument("--oauth-issuer", metavar="URL",
                       help="the authorization server whose JWTs are accepted (its RFC 8414 "
                       "or OpenID metadata names its keys)")
    group.add_argument("--oauth-audience", metavar="VALUE",
                       help="the 'aud' a token must hold (default: the resource URL, "
                       "PUBLIC_URL/mcp)")
    group.add_argument("--oauth-jwks", metavar="URL",
                       help="the issuer's JWKS URL, instead of finding it in its metadata")
    group.add_argument("--oauth-tenant-claim", metavar="CLAIM", default=None,
                       help="the claim naming the token's tenant (default coordex_tenant; "
                       "optional with one tenant)")
    group.add_argument("--public-url", metavar="URL",
                       help="the URL clients reach this server at (default "
                       "http://HOST:PORT), for the resource URL and its metadata")


def _oauth_gate(args: argparse.Namespace, host: str, port: int) -> Any:
    """The OAuth gate ``--oauth-issuer`` asks for, or None (raises OAuthSetupError)."""
    if not args.oauth_issuer:
        return None
    from .oauth import DEFAULT_TENANT_CLAIM, JWTVerifier, OAuthGate, discover_jwks

    public = (args.public_url or f"http://{host}:{port}").rstrip("/")
    resource = f"{public}/mcp"
    jwks = args.oauth_jwks or discover_jwks(args.oauth_issuer)
    verifier = JWTVerifier(args.oauth_issuer, args.oauth_audience or resource, jwks)
    return OAuthGate(resource, args.oauth_issuer, verifier,
                     args.oauth_tenant_claim or DEFAULT_TENANT_CLAIM)


def _add_observe_options(parser: argparse.ArgumentParser, *, serve: bool) -> None:
    from .observe.command import add_options

    add_options(parser, serve=serve)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", metavar="DIR",
                        help="data folder (default: $COORDEX_HOME, else the user data dir)")
    limits = argparse.ArgumentParser(add_help=False)
    limits.add_argument("--max-sessions", type=_positive_int, metavar="N",
                        help="sessions alive at once (default 20)")
    limits.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                        help="default per-call timeout (default 50, below the common "
                        "60 s client request timeout)")
    limits.add_argument("--max-wait", type=_positive_float, metavar="SECONDS",
                        help="seconds a tool call waits before it answers 'running' with "
                        "a call_id (the code goes on; wait_call fetches its result); the "
                        "default and most of the tools' wait argument (default 45)")

    parser = argparse.ArgumentParser(
        prog="coordex",
        description="One execute_code tool for LLM agents: Python or bash; stateless, "
        "stateful or read-only; in the agent's own interpreter or a uv-built environment.",
        epilog="Try 'coordex demo' for a walkthrough of the four coordinates.",
    )
    parser.add_argument("--version", action="version", version=f"coordex {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("mcp", parents=[common, limits], help="serve MCP over stdio",
                       description="Serve the coordex tools over MCP stdio (for a client "
                       "that starts this process).")
    p.add_argument("--ui", type=_port, metavar="PORT",
                   help="also serve the page of sessions and call log on this port (0 = any "
                   "free); its URL, with the token, is printed to stderr")
    p.add_argument("--ui-host", default="127.0.0.1", metavar="HOST",
                   help="address the page binds to (default 127.0.0.1)")
    p.add_argument("--no-persist", action="store_true", help=_NO_PERSIST_HELP)
    _add_confinement_options(p, tenants=False)
    _add_observe_options(p, serve=False)
    p.set_defaults(func=cmd_mcp)

    p = sub.add_parser("serve", parents=[common, limits], help="serve MCP over streamable HTTP",
                       description="Serve the coordex tools over streamable HTTP at /mcp. Every "
                       "request needs 'Authorization: Bearer <token>' (COORDEX_TOKEN, or a "
                       "generated one printed once).")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument("--tokens", metavar="FILE",
                   help="tenants file: lines 'NAME TOKEN'; each tenant gets its own executor "
                   "under HOME/tenants/NAME (replaces COORDEX_TOKEN)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="extra Host name clients may use (DNS-rebinding protection)")
    p.add_argument("--no-persist", action="store_true", help=_NO_PERSIST_HELP)
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="run bash and environment sessions on a Ray cluster: 'auto' (the "
                   "cluster this machine belongs to), 'ray://HOST:PORT', or an address; "
                   "needs pip install 'coordex[ray]'. With --tokens, each tenant's sessions "
                   "on a node run in a confined host of that tenant there")
    _add_confinement_options(p, tenants=True)
    _add_oauth_options(p)
    _add_observe_options(p, serve=True)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("log", parents=[common], help="show the call log",
                       description="Show the calls recorded under the data folder, newest "
                       "last (the same records as Executor.history).")
    p.add_argument("--session", metavar="NAME", help="only this session (a name, or an id)")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N",
                   help="newest N calls (default 50)")
    p.add_argument("--stats", action="store_true",
                   help="per session and per coordinate: calls, errors by type, state "
                   "losses, rebuilds, read-only calls whose copy changed something")
    p.add_argument("--seq", type=_positive_int, metavar="N",
                   help="one call with everything the log keeps of it (output, result, "
                   "error, suggestion, isolation, changed names)")
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("demo", parents=[common], help="run the four-coordinate walkthrough",
                       description="Run the walkthrough for real: bash, a stateful audit "
                       "session, a read-only look, a dedicated environment, a stored function "
                       "and a wrong coordinate. Uses a temporary data folder unless "
                       "--home/COORDEX_HOME is set.")
    p.add_argument("--keep", action="store_true", help="keep the temporary data folder")
    p.set_defaults(func=cmd_demo)

    env = sub.add_parser("env", help="create, list, show, build or clean dedicated environments")
    env_sub = env.add_subparsers(dest="env_command", metavar="ACTION", required=True)
    p = env_sub.add_parser("create", parents=[common], help="register an environment spec",
                           description="Register an environment spec (built on first use, or "
                           "with 'coordex env build ID'); an equal spec keeps its venv_id.")
    p.add_argument("spec", metavar="SPEC|FILE",
                   help="a requirements line or list, or a file holding a pyproject.toml, a "
                   "PEP 723 script or a requirements list ('-' reads stdin)")
    p.add_argument("--name", help="a name for the environment")
    p.set_defaults(func=cmd_env_create)
    p = env_sub.add_parser("list", parents=[common], help="list environments")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=cmd_env_list)
    p = env_sub.add_parser("show", parents=[common],
                           help="show an environment's spec and its packages and versions")
    p.add_argument("venv_id", type=int, metavar="ID", help="venv_id from 'coordex env list'")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=cmd_env_show)
    p = env_sub.add_parser("build", parents=[common], help="build an environment now")
    p.add_argument("venv_id", type=int, metavar="ID", help="venv_id from 'coordex env list'")
    p.set_defaults(func=cmd_env_build)
    p = env_sub.add_parser("remove-unused", parents=[common],
                           help="delete built environments no registered spec uses")
    p.set_defaults(func=cmd_env_remove_unused)

    fns = sub.add_parser("functions", help="list or show stored functions (the library)")
    fn_sub = fns.add_subparsers(dest="functions_command", metavar="ACTION", required=True)
    p = fn_sub.add_parser("list", parents=[common], help="list stored functions")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=cmd_functions_list)
    p = fn_sub.add_parser("show", parents=[common], help="show one stored function")
    p.add_argument("name", help="the function's name")
    p.set_defaults(func=cmd_functions_show)

    p = sub.add_parser("eval", help="measure how coordinates are chosen over long tasks",
                       description="Run the task suite under a policy (SPEC 13) and write "
                       "report.json, report.md and report.png into --out; prints the table.")
    p.add_argument("--policy", choices=("fresh", "kept", "reference", "model"),
                   default="reference",
                   help="fresh: every call stateless; kept: every call stateful in one session; "
                   "reference: coordinates chosen by hand per step; model: an OpenAI-compatible "
                   "endpoint chooses (default reference)")
    p.add_argument("--tasks", metavar="NAME,...", help="only these tasks (see --list)")
    p.add_argument("--suite", choices=("default", "hard"), default="default",
                   help="default: twelve tasks of nine steps; hard: six tasks of 24 steps with "
                   "1 GiB of state at --scale 1, state that cannot be pickled, and left-overs "
                   "planted ten steps before the step they spoil")
    p.add_argument("--out", metavar="DIR", default="coordex-eval",
                   help="where the reports go (default ./coordex-eval); runs of other policies "
                   "kept there are compared")
    p.add_argument("--scale", type=_positive_float, default=1.0, metavar="X",
                   help="data size: 1 the default run, 0.02 a quick one")
    p.add_argument("--list", action="store_true", help="name the tasks, one a line")
    p.add_argument("--base-url", metavar="URL",
                   help="model: the endpoint's base URL, before /chat/completions")
    p.add_argument("--model", metavar="NAME", help="model: the model's name")
    p.add_argument("--max-turns", type=_positive_int, default=40, metavar="N",
                   help="model: requests per task before it fails (default 40)")
    p.add_argument("--tools", choices=("coordex", "kept", "fresh"), default="coordex",
                   help="model: coordex's own tools (default), or one execute_code with a fixed "
                   "policy: one interpreter and shell kept for the task (kept), a fresh one "
                   "every call (fresh)")
    p.add_argument("--stepwise", action="store_true",
                   help="model: give the steps one at a time, a new user message each time the "
                   "model answers without a tool call")
    p.add_argument("--request-timeout", type=_positive_float, default=300.0, metavar="SECONDS",
                   help="model: seconds per request (default 300); the key is read from "
                   "OPENAI_API_KEY")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("version", help="print the version")
    p.set_defaults(func=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.func in (cmd_mcp, cmd_serve) and (why := missing_server_sdk()) is not None:
        _say(why)
        return EXIT_FAILURE
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        _say("interrupted.")
        return 130


__all__ = ["base_root", "build_parser", "is_loopback", "main", "make_executor"]
