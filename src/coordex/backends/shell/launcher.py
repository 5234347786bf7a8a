"""The launcher server: starts protected read-only copies of bash sessions cheaply.

How it works
------------
Protection (:mod:`.isolation`) needs a fresh single-threaded process that calls
:func:`isolation.protect` on itself before it ``exec``s bash. Starting a Python
interpreter for every call costs ~8 ms, so a :class:`LauncherServer` keeps one small
interpreter (``python -I -S`` running this file by path; standard library only, with
:mod:`.isolation` and ctypes already loaded) per bash session. Per call it ``fork``s a
child that becomes its own process-group leader, takes the call's stdout/stderr pipes
(passed with ``SCM_RIGHTS``), stdin ``/dev/null``, the session shell's cwd, umask and
resource limits (read from ``/proc/PID`` of that shell), calls ``protect()``, writes
the mode that held to the report file and ``exec``s the command with the environment
it was sent. The server itself never unshares, mounts or restricts anything.

The wire, host to server, over a private unix stream socket pair: a header
``!cii`` (kind, pid, payload length), then the payload. ``b"R"`` (run) carries the
call's fds on its header and a ``marshal``-ed dict (see :meth:`LauncherServer.start`);
``b"W"`` (wait over) lets the server reap child ``pid``. Server to host:
the handshake line :data:`HELLO` first, then ``!cii`` events: ``b"P"`` the child's pid
(its group exists already), ``b"X"`` the child ended with the given exit status
(minus the signal when a signal killed it), ``b"E"`` the fork failed (errno). A finished child
stays a zombie until the host says ``W``: its pid, and so its process group id, cannot
be reused while the host still signals that group. The server exits when the host
closes its end (killing a child still running).

A second socket pair, datagrams, carries the *layers*: the server is started holding
one end and each child inherits it by ``fork``. Once protected, before any code runs, a
child asked to (``uppers``) sends on it handles on its overlays' upper layers
(:func:`send_uppers`), and closes it before it ``exec``s. The host takes them once the
call is over (:meth:`LauncherServer.receive_layers`) and lists what the copy wrote,
for the call log. No socket ever travels inside a message, and no code holds it.
"""

from __future__ import annotations

import marshal
import os
import resource
import select
import signal
import socket
import struct
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping, Sequence
    from typing import Any

HELLO = b"coordex-launcher 2\n"  # 2: the child sends its upper layers
HEADER = struct.Struct("!cii")
# A child's layers message (send_uppers): at most this many handles and bytes of pid and
# folder names; a larger one is not listed.
LAYERS_MAX_FDS = 16
LAYERS_MAX_BYTES = 1 << 15
_FD_SIZE = struct.calcsize("i")
# How long the server may take to start and answer its handshake.
START_TIMEOUT = 15.0
_LIMITS = tuple(getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_"))
LIMITS = _LIMITS  # the resource limits a child takes from the session shell


class LauncherError(RuntimeError):
    """The server could not be started or stopped answering."""


class LauncherServer:
    """One launcher server process, owned (started, reaped) by this object.

    Args:
        env: the server's environment; ``COORDEX_ISOLATION_FORCE`` in it caps the mode
            every child reaches. Children run with the environment each call sends.

    Not thread-safe: one call at a time (a bash session serialises its calls).
    Raises :class:`LauncherError` when the server cannot be started.
    """

    _proc: subprocess.Popen[bytes]

    def __init__(self, env: Mapping[str, str]) -> None:
        # Here: the server side (this file run as a script) needs neither.
        import subprocess

        from .. import _reap

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        layers, children = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            # A session of its own: the copies it forks stay in it (in groups of their
            # own), so the keeper ends them too if the host dies.
            self._proc = _reap.spawn(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(theirs.fileno()),
                 str(children.fileno())],
                pass_fds=(theirs.fileno(), children.fileno()), env=dict(env),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            layers.close()
            raise LauncherError(f"could not start the launcher server: {exc}") from exc
        finally:
            theirs.close()
            children.close()
        self._sock = ours
        self._layers = layers
        layers.setblocking(False)
        _hold(ours.fileno(), layers.fileno())
        self._buffer = b""
        self._sock.settimeout(START_TIMEOUT)
        try:
            hello = b""
            while not hello.endswith(b"\n"):
                chunk = self._sock.recv(64)
                if not chunk:
                    break
                hello += chunk
        except OSError:
            hello = b""
        if hello != HELLO:
            self.close()
            raise LauncherError(f"the launcher server did not start (said {hello!r})")
        self._sock.settimeout(None)

    def fileno(self) -> int:
        """The socket to poll for :meth:`read_event`."""
        return self._sock.fileno()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def start(self, argv: Sequence[str], fds: Sequence[int], *, session_pid: int,
              work_paths: Sequence[str], scratch: str, allow: str, report_path: str,
              splice: tuple[int, int], keep: Sequence[int] = (),
              uppers: bool = False) -> None:
        """Have the server fork a protected child; :meth:`started` gives its pid.

        ``fds`` are the child's stdout, stderr, the *go* pipe's read end, then one fd
        per number in ``keep`` (placed there in the child). With ``uppers`` the child,
        once protected, sends handles on its upper layers for :meth:`receive_layers`
        (where it overlaid nothing, nothing). The child sets itself up
        and protects itself at once, then waits: what is written to the go pipe, after
        one first byte, is spliced into ``argv[splice[0]]`` at offset ``splice[1]`` and
        it execs ``argv``; end-of-file with nothing written makes it exit quietly. It
        starts with an empty environment but ``TMPDIR``/``TMP``/``TEMP`` (the scratch
        folder) and ``COORDEX_ISOLATION`` (the mode). Raises :class:`LauncherError`
        when the server is gone.
        """
        payload = marshal.dumps({
            "argv": list(argv), "session_pid": session_pid, "work_paths": list(work_paths),
            "scratch": scratch, "allow": allow, "report": report_path,
            "splice": tuple(splice), "keep": list(keep), "uppers": uppers,
        })
        try:
            socket.send_fds(self._sock, [HEADER.pack(b"R", 0, len(payload))], list(fds))
            self._sock.sendall(payload)
        except OSError as exc:
            raise LauncherError(f"the launcher server is gone: {exc}") from exc

    def started(self) -> int:
        """The pid (= process group) of the child :meth:`start` asked for.

        Raises :class:`LauncherError` when the server is gone or could not fork.
        """
        try:
            kind, pid, value = self._read_blocking()
            while kind == b"X":  # a child called off before its pid was asked for
                kind, pid, value = self._read_blocking()
        except OSError as exc:
            raise LauncherError(f"the launcher server is gone: {exc}") from exc
        if kind != b"P":
            raise LauncherError(f"the launcher server could not fork: {os.strerror(value)}")
        return pid

    def read_events(self) -> list[tuple[bytes, int, int]]:
        """The complete events the socket holds now (call it once it is readable).

        Raises :class:`LauncherError` when the server has gone away.
        """
        try:
            data = self._sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            data = None
        except OSError as exc:
            raise LauncherError(f"the launcher server is gone: {exc}") from exc
        if data == b"":
            raise LauncherError("the launcher server is gone")
        if data:
            self._buffer += data
        events = []
        while (event := self._take()) is not None:
            events.append(event)
        return events

    def receive_layers(self, pid: int) -> tuple[list[str], list[int]] | None:
        """Child ``pid``'s upper layers, if its message has come: the overlaid folders
        and a handle (close-on-exec) on each one's upper layer, for the caller to list
        and close; ``([], [])`` for a message cut short; None while none has come.

        Never blocks or raises. Messages of other children (called off before they ran
        the code) are dropped on the way. The handles are not held (a fork meanwhile
        would close them): they live for one listing, and a handle on a discarded layer
        is no channel into anything.
        """
        tag = b"%d" % pid
        while True:
            try:
                # Not socket.recv_fds: before Python 3.12 it drops its flags.
                data, ancillary, flags, _addr = self._layers.recvmsg(
                    LAYERS_MAX_BYTES, socket.CMSG_SPACE(LAYERS_MAX_FDS * _FD_SIZE),
                    socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except OSError:  # BlockingIOError: no (more) messages
                return None
            fds = [fd for level, kind, payload in ancillary
                   if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                   for (fd,) in struct.iter_unpack("i", payload[:len(payload)
                                                             - len(payload) % _FD_SIZE])]
            sender, _, folders = data.partition(b"\0")
            lowers = [os.fsdecode(f) for f in folders.split(b"\0")] if folders else []
            whole = len(lowers) == len(fds) and not flags & (socket.MSG_TRUNC
                                                              | socket.MSG_CTRUNC)
            if sender == tag and whole:
                return lowers, fds
            for fd in fds:
                os.close(fd)
            if sender == tag:
                return [], []

    def release(self, pid: int) -> None:
        """Let the server reap child ``pid``: its process group is no longer signalled."""
        try:
            self._sock.sendall(HEADER.pack(b"W", pid, 0))
        except OSError:
            pass

    def close(self) -> str:
        """Stop the server by the one policy; returns the step reached.

        Closing the socket is how it is asked to leave: it kills a child still running,
        then exits.
        """
        from .. import _reap

        _release(self._sock.fileno(), self._layers.fileno())
        self._layers.close()  # handles still queued there go with it

        def hang_up() -> bool:
            try:
                self._sock.close()
            except OSError:
                pass
            return True

        step = _reap.stop(self._proc, "launcher server", ask=hang_up)
        hang_up()  # a server found dead was never asked: its socket is closed here
        return step

    def _take(self) -> tuple[bytes, int, int] | None:
        if len(self._buffer) < HEADER.size:
            return None
        event = HEADER.unpack_from(self._buffer)
        self._buffer = self._buffer[HEADER.size:]
        return event

    def _read_blocking(self) -> tuple[bytes, int, int]:
        while True:
            event = self._take()
            if event is not None:
                return event
            data = self._sock.recv(4096)
            if not data:
                raise LauncherError("the launcher server is gone")
            self._buffer += data


def _hold(*fds: int) -> None:
    """Note the sockets as coordex's, so read-only copies of Python sessions close them."""
    from ...worker import _coordex_copy

    _coordex_copy.hold(*fds)


def _release(*fds: int) -> None:
    from ...worker import _coordex_copy

    _coordex_copy.release(*fds)


# -- the server side (runs as a script: standard library and isolation.py only) ---------


def _exit_status(pid: int) -> int:
    """How zombie ``pid`` ended, leaving it unreaped: its exit status, or minus the
    signal that killed it (the copy's bash itself died; bash would say 128 + signal for
    a command of its own, which is not the same)."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    if info is None:
        return 0
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def _run_child(isolation: Any, request: dict[str, Any], fds: list[int],
               mapping: tuple[int, int] | None, layers: int) -> None:
    """In the forked child: set up, protect, wait for the go, exec. Never returns.

    ``mapping`` (root only): the pipes to ask the server for a full identity map;
    ``layers``: the socket to send the upper layers on (closed before the exec).
    """
    try:
        os.setpgid(0, 0)
        # Python ignores SIGPIPE and SIGXFSZ; a handler-less exec would pass that on, and
        # bash cannot undo a signal ignored on entry (`yes | head` would fail loudly).
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        out_fd, err_fd, go_fd, *extra = fds
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd, target in zip(extra, request["keep"], strict=True):
            os.dup2(fd, target)
        for fd in (null, out_fd, err_fd, *extra):
            if fd > 2 and fd not in request["keep"]:
                os.close(fd)
        shell = request["session_pid"]
        os.chdir(f"/proc/{shell}/cwd")  # the session's folder, even if renamed since
        with open(f"/proc/{shell}/status") as f:
            umask = next((int(line.split()[1], 8) for line in f if line.startswith("Umask:")),
                         0o022)
        limits = []
        for number in _LIMITS:
            try:
                limits.append((number, resource.prlimit(shell, number)))
            except (OSError, ValueError):
                pass
        with open(request["report"], "w") as report:  # before protect(): may lie anywhere
            mode = isolation.protect(request["work_paths"], request["scratch"],
                                     allow=request["allow"],
                                     map_identity=isolation.identity_asker(*mapping)
                                     if mapping else None)
            report.write(mode)
        if mode not in ("discarded", "refused"):
            # Protection works on this machine (the host asked for it) but did not hold
            # this once: the code must not run unprotected. The host makes another copy.
            raise RuntimeError(UNPROTECTED)
        if request.get("uppers"):
            send_uppers(isolation, layers)
        else:
            os.close(layers)
        for number, value in limits:
            try:
                resource.setrlimit(number, value)
            except (OSError, ValueError):
                pass
        os.umask(umask)
        scratch = os.environ["TMPDIR"]  # protect() resolved it
        env = {"TMPDIR": scratch, "TMP": scratch, "TEMP": scratch, isolation.MODE_ENV: mode}
        go = b""
        while chunk := os.read(go_fd, 4096):
            go += chunk
        if not go:
            os._exit(0)  # called off
        argv = request["argv"]
        index, offset = request["splice"]
        argv[index] = argv[index][:offset] + go[1:].decode() + argv[index][offset:]
        os.closerange(3, request["keep"][0] if request["keep"] else 1 << 16)
        for low, high in zip(request["keep"], [*request["keep"][1:], 1 << 16], strict=True):
            os.closerange(low + 1, high)
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # the child must never return
        try:
            os.write(2, f"{START_FAILED}{exc}\n".encode())
        finally:
            os._exit(127)


def send_uppers(isolation: Any, fd: int) -> None:
    """Send the handles on this protected child's upper layers over socket ``fd`` (then
    closed), for the host to list what the copy wrote once its code has finished: the
    layers outlive the child while the host holds them. One datagram: this pid and the
    overlaid folders, NUL-separated, one handle per folder; none where nothing was
    overlaid. Runs before the code, so what the code does cannot change what is sent
    (it never sees the socket). A failure costs the log entry, never the call."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM, fileno=fd) as sock:
        layers = isolation.upper_layers()
        if layers:
            folders = b"\0".join([b"%d" % os.getpid(), *(os.fsencode(lower)
                                                         for lower, _ in layers)])
            try:
                socket.send_fds(sock, [folders], [upper for _, upper in layers])
            except OSError:
                pass


# What a child that failed before the code ran writes to its stderr (then exits 127):
# the shell tells such an end from a command's own exit status 127 by it.
START_FAILED = "coordex: could not start the read-only copy: "
# What follows START_FAILED when protection did not hold (and the code did not run).
UNPROTECTED = "protection did not hold in this copy"


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def serve(sock: socket.socket, isolation: Any, layers: int) -> None:
    """The server loop: requests from ``sock``, children watched through pidfds.

    ``layers`` is the socket every child inherits to send its upper layers on.

    For root, each child also gets a pair of pipes to ask for its identity map once
    it has unshared its user namespace (a /bin/sh helper per call would cost ~1 ms).
    """
    sock.sendall(HELLO)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    watched: dict[int, int] = {}  # pidfd -> pid
    running: set[int] = set()  # pids not yet reaped
    released: set[int] = set()  # still running, but the host is done with them
    asking: dict[int, tuple[int, int]] = {}  # map request pipe -> (pid, answer pipe)
    try:
        while True:
            for fd, _events in poller.poll():
                if fd in asking:
                    pid, answer = asking.pop(fd)
                    poller.unregister(fd)
                    data = os.read(fd, 65536)
                    if data:
                        os.write(answer, b"1" if isolation.write_identity_maps(pid, data) else b"0")
                    os.close(fd)
                    os.close(answer)
                    continue
                if fd in watched:
                    pid = watched.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    if pid in released:  # the host no longer waits for it
                        released.discard(pid)
                        running.discard(pid)
                        os.waitpid(pid, 0)
                    else:
                        sock.sendall(HEADER.pack(b"X", pid, _exit_status(pid)))
                    continue
                msg, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, 8)
                if not msg:
                    return
                if len(msg) < HEADER.size:
                    rest = _recv_exact(sock, HEADER.size - len(msg))
                    if rest is None:
                        return
                    msg += rest
                kind, pid, length = HEADER.unpack(msg)
                payload = _recv_exact(sock, length) if length else b""
                if payload is None:
                    return
                if kind == b"W":
                    if pid in watched.values():
                        released.add(pid)  # reaped when it ends
                    elif pid in running:
                        running.discard(pid)
                        os.waitpid(pid, 0)
                    continue
                request = marshal.loads(payload)
                pipes = (*os.pipe(), *os.pipe()) if os.geteuid() == 0 else None
                try:
                    pid = os.fork()
                except OSError as exc:
                    sock.sendall(HEADER.pack(b"E", 0, exc.errno or 0))
                    pid = -1
                if pid == 0:  # pragma: no cover - the child
                    sock.close()
                    if pipes is not None:
                        os.close(pipes[0])
                        os.close(pipes[3])
                    _run_child(isolation, request, fds,
                               None if pipes is None else (pipes[1], pipes[2]), layers)
                for received in fds:
                    os.close(received)
                if pipes is not None:
                    os.close(pipes[1])
                    os.close(pipes[2])
                    if pid < 0:
                        os.close(pipes[0])
                        os.close(pipes[3])
                    else:
                        asking[pipes[0]] = (pid, pipes[3])
                        poller.register(pipes[0], select.POLLIN)
                if pid < 0:
                    continue
                try:
                    os.setpgid(pid, pid)  # also here: the host signals the group at once
                except OSError:
                    pass  # the child got there first (or already exec'd)
                running.add(pid)
                pidfd = os.pidfd_open(pid)
                watched[pidfd] = pid
                poller.register(pidfd, select.POLLIN)
                sock.sendall(HEADER.pack(b"P", pid, 0))
    finally:
        # The host is gone: end whatever it did not release, then reap.
        for pid in running:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass


def _main() -> None:
    # isolation.py sits one folder up, in backends/.
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import isolation

    isolation.prepare()  # libc, the ABI and the filters once here, not per child
    sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        serve(sock, isolation, int(sys.argv[2]))
    except (BrokenPipeError, ConnectionResetError):
        pass


if __name__ == "__main__":
    _main()
