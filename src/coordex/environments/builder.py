"""Build environments with uv into content-addressed folders, once, atomically.

How a build goes (``EnvironmentBuilder.ensure_built``):

1. Take the in-process lock and the cross-process file lock ``envs/.locks/<hash>.lock``,
   so two threads or two processes asking for one spec build it once: the second waits,
   then finds the marker and returns ``cached=True``.
2. If ``envs/<hash>/.coordex-built.json`` exists the environment is done: the marker is
   the last thing a build writes, so its presence means "complete".
3. Otherwise remove leftovers of crashed builds of this hash (``envs/.tmp-<hash>-*``),
   then ``uv venv --relocatable`` into a fresh temporary sibling, ``uv pip install`` the
   requirements into it, write the marker, and ``os.rename`` the sibling to
   ``envs/<hash>``. The rename is atomic on one filesystem, so a crash at any point leaves
   either no ``envs/<hash>`` at all or a complete one — never a half-made environment.
4. Before the marker is written, every requirement's top-level modules are imported in
   the new environment (``worker/_coordex_import_check.py``, run by its own
   interpreter). A failure is an ``environment`` error quoting the import error, with
   the likely fix where one is known (:func:`import_fix`), and nothing is kept: a spec
   that installs but cannot be imported is not an environment.

``--relocatable`` matters because the venv is built under a temporary name: it makes
console scripts use a relative shebang trampoline and the activation scripts locate
themselves, so ``bin/<script>`` and ``bash`` with ``PATH=env/bin`` keep working after the
rename (the interpreter symlink and ``pyvenv.cfg`` never held the folder's path).

uv runs in its own process session with a deadline shared by the whole build; on timeout
it is stopped by coordex's one stop policy (``backends/_reap.py``). Every line uv prints
goes to the build log under ``root/logs`` and to ``on_progress``, one line per call, on
the thread that asked for the build (uv's output is read by a pump thread, which only
queues it: a caller's progress callback may be bound to its own thread). While uv prints
nothing a heartbeat line goes to ``on_progress`` every :data:`HEARTBEAT_S` seconds, so
a long download or sdist build does not look hung. uv and its build backends run with
:func:`~.build_env.build_environ`: this process's environment plus ``[build.env]`` of
``root/coordex.toml``. The facts that change a build's result besides the spec —
interpreter, uv version, index settings — are gathered here (:func:`hash_inputs`) and
hashed into the folder name by :meth:`coordex.core.spec.EnvironmentSpec.spec_hash`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..backends import _reap
from ..core import messages
from ..core.errors import CoordexError
from ..core.spec import EnvironmentSpec
from .build_env import build_environ, read_settings

ProgressCallback = Callable[[str], None]
# How a confined host's builder runs each process a build starts (SPEC 9):
# ``confine_step(command, folder, step)`` returns the command to run instead, where
# ``folder`` is the build's own temporary folder and ``step`` is ``"uv"`` (uv, and the
# sdist build backends it runs) or ``"python"`` (the new environment's interpreter: the
# import check). See :func:`coordex.hosting.jail.confine_build_step`.
ConfineStep = Callable[[list[str], Path, str], list[str]]

IMPORT_CHECK = Path(__file__).resolve().parent.parent / "worker" / "_coordex_import_check.py"
IMPORT_CHECK_MARKER = "::coordex-import-check::"

MARKER = ".coordex-built.json"
TMP_PREFIX = ".tmp-"
LOCKS_DIR = ".locks"
LOG_TAIL_LINES = 40
# Seconds of silence after which ``on_progress`` hears that the build is still running
# (SPEC 5: at least every 5 s), and how often the waiting thread looks for new lines.
HEARTBEAT_S = 4.0
_POLL_S = 0.1

# Environment variables that change what uv resolves: part of the spec hash, so a
# different index never reuses a folder built from another one. PIP_* are listed
# because users set them expecting an effect; uv ignores them, hashing them is harmless.
INDEX_SETTINGS = (
    "UV_INDEX", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
    "UV_NO_INDEX", "UV_INDEX_STRATEGY", "UV_PRERELEASE", "UV_RESOLUTION", "UV_EXCLUDE_NEWER",
    "UV_TORCH_BACKEND", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS",
)

# uv reads configuration files (uv.toml, pyproject [tool.uv]) from the working folder and
# the user's config dir. Builds pass --no-config so that only what is hashed (the spec and
# INDEX_SETTINGS) decides the result: same hash, same environment, on any machine.
_UV_COMMON = ("--no-config", "--color", "never")

# --link-mode=copy: uv's default on Linux is to hardlink files from its cache into the
# venv. Code running in an environment can write to its own site-packages (a monkey
# patch saved to disk, `open(module.__file__, "w")`); with hardlinks that write lands in
# uv's cache and silently corrupts every environment built from it later (astral-sh/uv
# #10579 shows the effect). Copying costs time once per build — measured by
# benchmarks/bench_env_build.py: ~50 ms vs ~7 ms for a 400-file wheel — and builds
# happen once per spec, so the isolation is worth it.
LINK_MODE = "copy"


@dataclass(frozen=True)
class Interpreter:
    """The Python an environment is built on, and the facts about it that get hashed."""

    executable: str
    implementation: str
    version: str
    base: str
    platform: str

    def hash_facts(self) -> dict[str, str]:
        return {"implementation": self.implementation, "version": self.version,
                "base": self.base, "platform": self.platform}


@dataclass(frozen=True)
class BuildOutcome:
    path: Path
    python: Path
    duration_ms: float
    cached: bool


# -- facts about the machine ------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def uv_binary() -> str:
    """The uv executable shipped with the ``uv`` package (a coordex dependency)."""
    from uv import find_uv_bin

    return str(find_uv_bin())


@functools.lru_cache(maxsize=1)
def uv_version() -> str:
    done = _reap.run([uv_binary(), "--version"], "uv --version", timeout=30,
                     stdin=subprocess.DEVNULL)
    return (done.stdout.strip() or done.stderr.strip() or "uv unknown").splitlines()[0]


def index_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if environ is None else environ
    return {k: source[k] for k in INDEX_SETTINGS if source.get(k)}


def hash_inputs(interpreter: Interpreter, environ: Mapping[str, str] | None = None,
                ) -> dict[str, Any]:
    """Everything besides the spec that changes a build's result (hashed with it)."""
    return {"python": interpreter.hash_facts(), "uv": uv_version(),
            "index": index_settings(environ), "link_mode": LINK_MODE}


@functools.lru_cache(maxsize=1)
def current_interpreter() -> Interpreter:
    base = getattr(sys, "_base_executable", None) or sys.executable
    return Interpreter(
        executable=sys.executable,
        implementation=sys.implementation.name,
        version=platform.python_version(),
        base=os.path.realpath(base),
        platform=f"{sys.platform}-{platform.machine()}",
    )


_PROBE = (
    "import json, os, platform, sys; "
    "b = getattr(sys, '_base_executable', None) or sys.executable; "
    "print(json.dumps({'implementation': sys.implementation.name, "
    "'version': platform.python_version(), 'base': os.path.realpath(b), "
    "'platform': sys.platform + '-' + platform.machine()}))"
)


# What could point uv's interpreter search at a Python the caller planted: a virtual
# environment named by the environment, or found in the working folder or a parent of it
# (``--no-project`` does not stop that search). Lookups run from "/" without these.
_LOOKUP_UNSET = ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME", "PYTHONPATH")


def _lookup_options() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LOOKUP_UNSET and not k.startswith("UV_PYTHON")}
    return {"cwd": "/", "env": env, "stdin": subprocess.DEVNULL}


@functools.lru_cache(maxsize=32)
def _probe(executable: str) -> Interpreter:
    done = _reap.run([executable, "-I", "-c", _PROBE], "interpreter probe", timeout=30,
                     check=True, **_lookup_options())
    facts = json.loads(done.stdout)
    return Interpreter(executable=executable, **facts)


def find_interpreter(requires_python: str | None) -> Interpreter:
    """The agent's own Python when it satisfies ``requires_python``; else one uv finds.

    Raises:
        CoordexError: ``environment`` when no installed interpreter matches.
    """
    own = current_interpreter()
    if requires_python is None or SpecifierSet(requires_python).contains(
            Version(own.version), prereleases=True):
        return own
    command = [uv_binary(), "python", "find", "--no-project", *_UV_COMMON,
               "--no-python-downloads", requires_python]
    try:
        done = _reap.run(command, "uv python find", timeout=60, **_lookup_options())
        found = done.stdout.strip().splitlines()
        if done.returncode == 0 and found:
            return _probe(found[-1])
        log = (done.stderr or done.stdout).strip()
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log = f"{type(exc).__name__}: {exc}"
    raise CoordexError(
        "environment",
        f"No Python interpreter on this machine matches requires-python "
        f"{requires_python!r} (the agent's own is {own.version}).",
        f"Relax requires-python so it includes {own.version} (e.g. '>={_minor(own.version)}'), "
        f"or install a matching Python ('uv python install') and create the environment "
        f"again.",
        log=log[-4000:],
    )


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


# -- the builder ----------------------------------------------------------------------------------


class EnvironmentBuilder:
    """Builds specs into ``envs_dir/<spec_hash>``; see the module docstring for the steps."""

    def __init__(self, envs_dir: Path, logs_dir: Path, *, timeout: float = 900.0,
                 confine_step: ConfineStep | None = None,
                 settings_file: Path | None = None) -> None:
        self.envs_dir = envs_dir.absolute()
        self.logs_dir = logs_dir.absolute()
        self.timeout = timeout
        self.confine_step = confine_step
        # root/coordex.toml: its [build.env] is read at the start of every build.
        self.settings_file = settings_file
        self._guard = threading.Lock()
        self._thread_locks: dict[str, threading.Lock] = {}

    # -- layout -------------------------------------------------------------------------------

    def folder(self, spec_hash: str) -> Path:
        return self.envs_dir / spec_hash

    def marker(self, spec_hash: str) -> Path:
        return self.folder(spec_hash) / MARKER

    def is_built(self, spec_hash: str) -> bool:
        return self.marker(spec_hash).exists()

    @staticmethod
    def python_in(folder: Path) -> Path:
        if os.name == "nt":
            return folder / "Scripts" / "python.exe"
        return folder / "bin" / "python"

    def log_path(self, spec_hash: str) -> Path:
        return self.logs_dir / f"build-{spec_hash[:16]}.log"

    # -- building -----------------------------------------------------------------------------

    def ensure_built(self, spec: EnvironmentSpec, spec_hash: str, interpreter: Interpreter,
                     *, on_progress: ProgressCallback | None = None,
                     label: str = "environment") -> BuildOutcome:
        """Return the built environment for ``spec_hash``, building it if needed.

        Raises:
            CoordexError: ``environment`` when uv fails, times out, or the lock is held
                by another builder for longer than the build timeout; ``log`` holds the
                tail of the build log.
        """
        started = time.monotonic()
        folder = self.folder(spec_hash)
        if self.is_built(spec_hash):
            return self._outcome(folder, started, cached=True)
        deadline = started + self.timeout
        with self._locked(spec_hash, deadline, label, on_progress):
            if self.is_built(spec_hash):  # another thread or process built it meanwhile
                return self._outcome(folder, started, cached=True)
            try:
                self._build(spec, spec_hash, interpreter, deadline, on_progress, label)
            except OSError as exc:  # disk full, permissions, a vanished uv binary
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise _disk_full(label, self.envs_dir,
                                     _tail_of(self.log_path(spec_hash)) or str(exc)) from exc
                raise CoordexError(
                    "environment", f"Could not build {label}: {type(exc).__name__}: {exc}.",
                    f"Check that {self.envs_dir} is writable and has free space, then build "
                    "again.", log=_tail_of(self.log_path(spec_hash)))
        return self._outcome(folder, started, cached=False)

    def _outcome(self, folder: Path, started: float, *, cached: bool) -> BuildOutcome:
        return BuildOutcome(folder, self.python_in(folder),
                            round((time.monotonic() - started) * 1000, 3), cached)

    @contextlib.contextmanager
    def _locked(self, spec_hash: str, deadline: float, label: str,
                on_progress: ProgressCallback | None) -> Iterator[None]:
        with self._guard:
            thread_lock = self._thread_locks.setdefault(spec_hash, threading.Lock())
        if not thread_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._lock_timeout(label)
        try:
            lock_dir = self.envs_dir / LOCKS_DIR
            lock_dir.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(lock_dir / f"{spec_hash}.lock"))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                _emit(on_progress, f"Waiting for another process building {label}...")
                waited = time.monotonic()
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._lock_timeout(label)
                    try:
                        lock.acquire(timeout=min(remaining, HEARTBEAT_S))
                        break
                    except Timeout:
                        _emit(on_progress, f"... still waiting for another process building "
                              f"{label} ({time.monotonic() - waited:.0f} s)")
            try:
                yield
            finally:
                lock.release()
        finally:
            thread_lock.release()

    def _lock_timeout(self, label: str) -> CoordexError:
        return CoordexError(
            "environment",
            f"Gave up waiting for another build of {label}: it held the build lock for "
            f"more than build_timeout={self.timeout:g}s.",
            "Try again later, or raise build_timeout (Executor(build_timeout=...)) if builds "
            "of this spec are expected to take that long.",
            log="",
        )

    def _build(self, spec: EnvironmentSpec, spec_hash: str, interpreter: Interpreter,
               deadline: float, on_progress: ProgressCallback | None, label: str) -> None:
        self.envs_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._clear_leftovers(spec_hash)
        tmp = self.envs_dir / f"{TMP_PREFIX}{spec_hash}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        environ = build_environ(read_settings(self.settings_file).build_env, uv_version())
        log = _BuildLog(self.log_path(spec_hash), on_progress, label)
        started = time.monotonic()
        try:
            log.line(f"=== build of {label} ({spec_hash}) pid={os.getpid()} "
                     f"at {time.strftime('%Y-%m-%d %H:%M:%S')} with {uv_version()}")
            log.line(f"=== python {interpreter.implementation} {interpreter.version} "
                     f"({interpreter.executable})")
            for requirement in spec.requirements:
                log.line(f"=== requirement {requirement}")
            uv = uv_binary()
            if self.confine_step is not None:
                tmp.mkdir()  # a confined step may write only beneath it: it must exist
            self._run(log, deadline, label, spec,
                      [uv, "venv", "--relocatable", "--no-project", *_UV_COMMON,
                       "--no-python-downloads", "--python", interpreter.executable, str(tmp)],
                      tmp, environ)
            python = self.python_in(tmp)
            requirements_file = tmp / "coordex-requirements.txt"
            requirements_file.write_text(spec.requirements_txt(), encoding="utf-8")
            if spec.requirements:
                self._run(log, deadline, label, spec,
                          [uv, "pip", "install", *_UV_COMMON, "--python", str(python),
                           f"--link-mode={LINK_MODE}", "-r", str(requirements_file)], tmp,
                          environ)
                self._check_imports(log, deadline, label, spec, python, tmp)
            installed = self._freeze(uv, python, deadline, tmp)
            duration_ms = round((time.monotonic() - started) * 1000, 3)
            _write_marker(tmp / MARKER, {
                "spec_hash": spec_hash, "normalised": spec.normalised(),
                "python": asdict(interpreter), "uv": uv_version(), "link_mode": LINK_MODE,
                "installed": installed, "built_at": time.time(), "duration_ms": duration_ms,
                "builder_pid": os.getpid(),
            })
            os.rename(tmp, self.folder(spec_hash))
            log.line(f"=== built in {duration_ms:.0f} ms -> {self.folder(spec_hash)}")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            log.close()

    def _clear_leftovers(self, spec_hash: str) -> None:
        # Called with the hash's lock held, so no live build of this hash owns these.
        for leftover in self.envs_dir.glob(f"{TMP_PREFIX}{spec_hash}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        folder = self.folder(spec_hash)
        if folder.exists() and not self.marker(spec_hash).exists():
            shutil.rmtree(folder, ignore_errors=True)  # not ours: a folder without marker

    def _confined(self, command: list[str], folder: Path, step: str) -> list[str]:
        return command if self.confine_step is None else self.confine_step(command, folder,
                                                                           step)

    def _run(self, log: _BuildLog, deadline: float, label: str, spec: EnvironmentSpec,
             command: list[str], folder: Path, environ: Mapping[str, str]) -> None:
        log.line("$ " + " ".join(_display(c) for c in command))
        command = self._confined(command, folder, "uv")
        env = dict(environ)
        env.pop("VIRTUAL_ENV", None)  # --python names the target; never the caller's venv
        env["NO_COLOR"] = "1"
        # Its own session (``_reap.spawn``): a timeout stops uv and its children, and
        # so does the keeper if the host dies mid-build.
        process = _reap.spawn(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=str(self.envs_dir), env=env,
        )
        reader = threading.Thread(target=log.pump, args=(process.stdout,), daemon=True)
        reader.start()
        try:
            returncode = self._wait(process, reader, deadline, log)
        except BaseException:
            _reap.stop(process, "uv build")
            raise
        if returncode is None:
            _reap.stop(process, "uv build")
            reader.join(timeout=5)
            log.line(f"=== killed: build_timeout={self.timeout:g}s reached")
            raise CoordexError(
                "environment",
                f"Building {label} took longer than build_timeout={self.timeout:g}s; the "
                "build was stopped and nothing was kept.",
                "Raise build_timeout (Executor(build_timeout=...)) for large specs, or pin "
                "fewer or lighter packages.",
                log=log.tail(),
            )
        reader.join(timeout=5)
        log.deliver()
        # uv has exited: this ends what it may have left in its session and tells the
        # keeper to stop watching it.
        _reap.stop(process, "uv build")
        if returncode != 0:
            raise _uv_failed(label, spec, log.tail(), returncode, self.envs_dir,
                             environ, self._settings_name())

    def _settings_name(self) -> str:
        return str(self.settings_file) if self.settings_file is not None else "coordex.toml"

    @staticmethod
    def _wait(process: subprocess.Popen[bytes], reader: threading.Thread,
              deadline: float, log: _BuildLog) -> int | None:
        """uv's exit status, or None at the deadline; meanwhile uv's lines (and a
        heartbeat while it is silent) go to ``on_progress`` from this thread.

        ``Popen.wait(timeout=...)`` polls with sleeps of up to 50 ms, which added ~25 ms
        per uv call; the reader thread ends the moment uv closes its output (it exits),
        and joining it is a real blocking wait. The poll() check covers grandchildren
        that keep the pipe open after uv itself has exited.
        """
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return process.poll()
            reader.join(timeout=min(remaining, _POLL_S))
            log.deliver()
            if not reader.is_alive():
                return process.wait()
            if process.poll() is not None:
                return process.returncode
            log.heartbeat()

    def _check_imports(self, log: _BuildLog, deadline: float, label: str,
                       spec: EnvironmentSpec, python: Path, folder: Path) -> None:
        """Import each requirement's top-level modules in the new environment, or raise."""
        command = [str(python), "-I", str(IMPORT_CHECK), *spec.names()]
        log.line("$ " + " ".join(_display(c) for c in command))
        # The packages' own code runs here: confined, it may write only the new build.
        command = self._confined(command, folder, "python")
        # Its own session (``_reap.spawn``): whatever an import starts ends with it.
        process = _reap.spawn(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=str(python.parent.parent),
            env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
        try:
            output = self._communicate(process, deadline, log)
        except subprocess.TimeoutExpired:
            _reap.stop(process, "import check")
            process.communicate()
            raise CoordexError(
                "environment",
                f"Building {label}: importing the installed packages took longer than "
                f"build_timeout={self.timeout:g}s; nothing was kept.",
                "An import that hangs usually waits for a service or a device: check the "
                "package's requirements, or raise build_timeout (Executor(build_timeout=...)).",
                log=log.tail())
        finally:
            _reap.stop(process, "import check")
        text = output.decode("utf-8", "replace")
        body, _, report = text.rpartition(IMPORT_CHECK_MARKER)
        for line in (body if report else text).splitlines():
            if line.strip():
                log.line(line)
        try:
            failed = json.loads(report)["failed"] if report else None
        except (ValueError, KeyError, TypeError):
            failed = None
        if failed is None:
            raise CoordexError(
                "environment",
                f"Building {label}: the import check exited with status {process.returncode} "
                "before reporting; nothing was kept.",
                "Read the log: an import may have ended the interpreter (os._exit, a crash in "
                "native code). Pin another version of the package it names.",
                log=log.tail())
        for failure in failed:
            log.line(f"=== import {failure['module']} ({failure['dist']}) failed: "
                     f"{failure['error']}")
        if failed:
            raise _import_failed(label, failed, log.tail())

    @staticmethod
    def _communicate(process: subprocess.Popen[bytes], deadline: float, log: _BuildLog) -> bytes:
        """The import check's output, with a heartbeat while it runs (an import of a big
        package can take many seconds)."""
        while True:
            try:
                output, _ = process.communicate(
                    timeout=max(0.0, min(HEARTBEAT_S, deadline - time.monotonic())))
                return output
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
                log.heartbeat(force=True, doing="importing the installed packages")

    def _freeze(self, uv: str, python: Path, deadline: float, folder: Path) -> list[str]:
        command = [uv, "pip", "freeze", *_UV_COMMON, "--python", str(python)]
        try:
            done = _reap.run(
                self._confined(command, folder, "uv"), "uv pip freeze",
                stdin=subprocess.DEVNULL, cwd=str(self.envs_dir),
                timeout=max(1.0, deadline - time.monotonic()))
        except (OSError, subprocess.SubprocessError):
            return []
        return [line for line in done.stdout.splitlines() if line.strip()]

    # -- cleaning up ----------------------------------------------------------------------------

    def remove_unused(self, keep: set[str], *, remove_envs: bool = True) -> dict[str, Any]:
        """Delete crashed builds' temp folders, and (if ``remove_envs``) env folders whose
        hash is not in ``keep``. Folders whose lock another process holds are left alone."""
        removed: list[str] = []
        skipped: list[str] = []
        if not self.envs_dir.is_dir():
            return {"removed": removed, "skipped": skipped}
        for entry in sorted(self.envs_dir.iterdir()):
            name = entry.name
            if name == LOCKS_DIR or not entry.is_dir():
                continue
            if name.startswith(TMP_PREFIX):
                spec_hash = name[len(TMP_PREFIX):].split("-", 1)[0]
            elif remove_envs and name not in keep:
                spec_hash = name
            else:
                continue
            lock = FileLock(str(self.envs_dir / LOCKS_DIR / f"{spec_hash}.lock"))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                skipped.append(name)
                continue
            try:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(name)
            finally:
                lock.release()
        return {"removed": removed, "skipped": skipped}


# -- helpers ------------------------------------------------------------------------------------


class _BuildLog:
    """The build log file plus an in-memory tail; hands each line to ``on_progress``.

    Lines written on the thread that made the log go to ``on_progress`` at once; lines
    from other threads (the pump reading uv) wait in ``_pending`` until that thread
    calls :meth:`deliver`, so the callback always runs on the caller's thread.
    """

    def __init__(self, path: Path, on_progress: ProgressCallback | None,
                 label: str = "environment") -> None:
        self._file = path.open("a", encoding="utf-8")
        self._tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._on_progress = on_progress
        self._owner = threading.get_ident()
        self._pending: deque[str] = deque()
        self._label = label
        self._started = self._last = time.monotonic()
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            self._tail.append(text)
            if not self._file.closed:
                try:
                    self._file.write(text + "\n")
                    self._file.flush()
                except OSError:  # a full disk: keep the tail, so uv's own reason is seen
                    pass
            self._pending.append(text)
        if threading.get_ident() == self._owner:
            self.deliver()

    def deliver(self) -> None:
        """Send the queued lines to ``on_progress``, in order (the owner thread only)."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                text = self._pending.popleft()
                self._last = time.monotonic()
            _emit(self._on_progress, text)

    def heartbeat(self, *, force: bool = False, doing: str = "uv is working") -> None:
        """A progress line (not logged) when nothing was sent for :data:`HEARTBEAT_S`."""
        now = time.monotonic()
        if not force and now - self._last < HEARTBEAT_S:
            return
        self._last = now
        _emit(self._on_progress, f"... still building {self._label}: {now - self._started:.0f} s "
              f"so far ({doing})")

    def pump(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            self.line(raw.decode("utf-8", "replace").rstrip())
        stream.close()

    def tail(self) -> str:
        with self._lock:
            return "\n".join(self._tail)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _emit(on_progress: ProgressCallback | None, text: str) -> None:
    if on_progress is not None:
        try:
            on_progress(text)
        except Exception:  # a broken progress callback must not break the build
            pass


def _tail_of(path: Path) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace")
                         .splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""


def _write_marker(path: Path, record: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)


def _display(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_=./:@+" for c in arg) else repr(arg)


# How uv (Rust's io::Error) and Python word a full disk or quota.
_NO_SPACE = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")


def _disk_full(label: str, envs_dir: Path, tail: str) -> CoordexError:
    return CoordexError(
        "environment", f"Could not build {label}: the disk that holds {envs_dir} (or uv's "
        "cache) is full.",
        "Free space on that disk (environments.remove_unused() deletes built environments "
        "nothing refers to; 'uv cache clean' empties uv's cache), then run the call again. "
        "The spec itself is fine.", log=tail)


def _uv_failed(label: str, spec: EnvironmentSpec, tail: str, returncode: int,
               envs_dir: Path, environ: Mapping[str, str], settings: str) -> CoordexError:
    if any(marker in tail.lower() for marker in _NO_SPACE):
        return _disk_full(label, envs_dir, tail)
    lines = tail.splitlines()
    # uv's resolver explanation starts at its first "error:" line (older uv: "\u00d7" in
    # colour-free mode); "cause:" and "hint:" lines follow.
    start = next((i for i, line in enumerate(lines) if line.startswith(("error:", "\u00d7"))), None)
    reason_lines = lines[start:] if start is not None else lines[-6:]
    reason = "\n".join(line for line in reason_lines if line.strip()
                       and not line.startswith("==="))
    outside = messages.build_outside_spec(label, reason, settings)
    if outside is not None:
        outside.extra["log"] = tail
        return outside
    named = [n for n in spec.names() if n in reason.lower()]
    what = (f"the requirement(s) for {', '.join(repr(n) for n in named)}" if named
            else "the requirements uv names")
    offline = "network was disabled" in reason or environ.get("UV_OFFLINE")
    where = (" Offline, uv can only use its cache and file:// URLs." if offline else "")
    return CoordexError(
        "environment",
        f"Could not build {label}: uv exited with status {returncode}.\n{reason}",
        f"Change {what} in the spec: check the name and that the pinned version exists on "
        f"the index (or point at a wheel with 'name @ file:///...'), relax conflicting "
        f"pins, then create the environment again with the corrected spec.{where}",
        log=tail,
    )


def import_fix(dist: str, error: str) -> str | None:
    """The likely fix for a package that installed but does not import, where known."""
    if ("numpy.dtype size changed" in error or "compiled using NumPy 1.x" in error
            or "_ARRAY_API not found" in error or "numpy.core.multiarray failed" in error):
        return (f"{dist!r} was built against NumPy 1 and uv installed NumPy 2: pin "
                f"'numpy<2' next to it in the spec (or pin a newer {dist} built for NumPy 2).")
    missing = re.search(r"No module named '([^']+)'", error)
    if missing is not None:
        module = missing.group(1).split(".")[0]
        return (f"{dist!r} needs the module {module!r} but does not declare it: add the "
                f"package that provides {module!r} to the spec (often named {module!r}).")
    library = re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", error)
    if library is not None:
        return (f"{dist!r} needs the system library {library.group(1)!r}: install it on the "
                f"host (e.g. with the system package manager), or pin a version of {dist} "
                "whose wheels bundle it.")
    return None


def _import_failed(label: str, failed: list[dict[str, Any]], tail: str) -> CoordexError:
    first = failed[0]
    lines = [f"import {f['module']} ({f['dist']}): {f['error']}" for f in failed]
    fix = import_fix(first["dist"], first["error"] + "\n" + first.get("traceback", ""))
    return CoordexError(
        "environment",
        f"Built {label}, but its packages do not import, so it was not kept:\n"
        + "\n".join(lines),
        (fix or f"Pin another version of {first['dist']!r} (one that supports this Python "
         "and the versions of its dependencies uv chose), or remove it from the spec.")
        + " Then create the environment again with the corrected spec.",
        log=tail + "\n" + first.get("traceback", ""),
    )


__all__ = [
    "IMPORT_CHECK", "INDEX_SETTINGS", "LINK_MODE", "MARKER", "BuildOutcome", "ConfineStep",
    "EnvironmentBuilder",
    "Interpreter", "current_interpreter", "find_interpreter", "hash_inputs",
    "index_settings", "uv_binary", "uv_version",
]
