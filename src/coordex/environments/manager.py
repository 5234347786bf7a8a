"""The environments an agent has: create by spec, list, build on first use, find python.

:class:`EnvironmentManager` joins the pure spec model (:mod:`coordex.core.spec`), the
registry (:mod:`.store`, SQLite under ``root``) and the builder (:mod:`.builder`, uv into
``envs_dir/<spec_hash>``). ``venv_id`` is the agent's handle; the spec hash names the
folder. Equal normalised specs share one ``venv_id``; the hash also covers interpreter,
uv version and index settings, so when those change the same ``venv_id`` is built again
into a new folder (and the old one becomes garbage for :meth:`remove_unused`).

The hot path is :meth:`python_for` on an environment this process already built or saw
built: it answers from an in-memory map after one ``stat`` of the marker file (a few
microseconds), and records ``last_used_at`` at most once a minute.

Who writes: by default this process (the registry and the builds are local). Given a
``builder`` (a confined host's :class:`~coordex.hosting.builder.BuilderClient`),
everything that reads the registry or changes the environments folder is asked of the
builder process, which runs a plain manager of its own: the folder is read-only to the
code this process runs. The caches and the hot path stay here.

Public methods that return dicts never raise for bad input or failed builds: they return
the SPEC error dict. ``python_for`` raises :class:`CoordexError` (for the executor).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.coordinates import MAX_VENV_ID, is_valid_text
from ..core.errors import CoordexError, is_error, make_error
from ..core.spec import EnvironmentSpec, parse_spec
from .build_env import read_settings, settings_file
from .builder import (
    MARKER,
    ConfineStep,
    EnvironmentBuilder,
    Interpreter,
    find_interpreter,
    hash_inputs,
)
from .store import EnvironmentRecord, EnvironmentStore, NameTaken

ProgressCallback = Callable[[str], None]

DB_NAME = "environments.sqlite3"
MAX_NAME = 200
# last_used_at is informational; writing it on every call would put SQLite on the hot path.
TOUCH_INTERVAL_S = 60.0
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class _Ready:
    folder: Path
    python: Path
    marker: Path


class EnvironmentManager:
    """Create, list and build dedicated environments; thread-safe.

    Args:
        root: the data folder; the registry lives in ``root/environments.sqlite3`` and
            build logs in ``root/logs``.
        build_timeout: seconds one build may take (waiting for another process's build
            of the same spec included) before it is stopped.
        envs_dir: where built environments go, default ``root/envs``. Pass one shared
            folder to let several roots (tenants) reuse content-addressed builds.
        builder: where registry reads and builds happen: None (here), or an object whose
            ``call(op, args, on_progress)`` runs the manager method ``op`` elsewhere and
            returns its value (a confined host's builder process; see the module doc).
        confine_step: how each process a local build starts is confined (see
            :data:`~coordex.environments.builder.ConfineStep`); None: not at all.
    """

    def __init__(self, root: Path, *, build_timeout: float = 900.0,
                 envs_dir: Path | None = None, builder: Any = None,
                 confine_step: ConfineStep | None = None) -> None:
        # Absolute paths: uv runs with its own working folder, and the executor hands
        # these paths to other processes.
        self.root = Path(root).absolute()
        self.shared_envs = envs_dir is not None
        self.envs_dir = Path(envs_dir).absolute() if envs_dir is not None else self.root / "envs"
        self._remote = builder
        if builder is None:
            self._store = EnvironmentStore(self.root / DB_NAME)
            self._builder = EnvironmentBuilder(self.envs_dir, self.root / "logs",
                                               timeout=build_timeout,
                                               confine_step=confine_step,
                                               settings_file=settings_file(self.root))
        self._lock = threading.Lock()
        self._id_locks: dict[int, threading.Lock] = {}
        self._ready: dict[int, _Ready] = {}
        self._known: set[int] = set()
        self._touched: dict[int, float] = {}

    # -- creating and listing -----------------------------------------------------------------

    def create(self, spec: str, name: str | None = None) -> dict[str, Any]:
        """Register an environment spec (no build yet).

        Returns:
            ``{"venv_id", "name", "spec_hash", "built", "created"}``; ``created`` is False
            when an equal spec (after normalisation) already had an id, which is returned.
            A ``validation`` error for an unparseable spec or a name held by another
            spec; an ``environment`` error when no interpreter matches requires-python.
        """
        if self._remote is not None:
            made = self._remote.call("create", {"spec": spec, "name": name})
            if isinstance(made, dict) and "venv_id" in made:
                with self._lock:
                    self._known.add(made["venv_id"])
            return dict(made)
        try:
            parsed = parse_spec(spec)
            checked = _check_name(name)
            spec_hash = parsed.spec_hash(hash_inputs(find_interpreter(parsed.requires_python),
                                                     self._hash_environ()))
            try:
                record, created = self._store.add(
                    kind=parsed.kind, spec_text=spec, normalised=parsed.normalised(),
                    spec_hash=spec_hash, name=checked, now=time.time())
            except NameTaken as taken:
                raise CoordexError(
                    "validation",
                    f"The environment name {checked!r} already belongs to venv_id="
                    f"{taken.record.venv_id}, which has a different spec.",
                    f"Use venv_id={taken.record.venv_id} to run in that environment, or pick "
                    "another name (or none) for this spec.",
                )
        except CoordexError as exc:
            return exc.to_dict()
        with self._lock:
            self._known.add(record.venv_id)
        result: dict[str, Any] = {
            "venv_id": record.venv_id, "name": record.name, "spec_hash": record.spec_hash,
            "built": self._builder.is_built(record.spec_hash), "created": created,
        }
        if checked is not None and record.name != checked:
            result["note"] = (f"This spec already exists as venv_id={record.venv_id} named "
                              f"{record.name!r}; the name {checked!r} was not applied.")
        return result

    def list(self) -> dict[str, Any]:
        """``{"environments": [{"venv_id","name","spec_hash","built","created_at",
        "last_used_at"}...]}``; ``built`` is checked on disk, not trusted from the table."""
        if self._remote is not None:
            return dict(self._remote.call("list", {}))
        return {"environments": [
            {"venv_id": r.venv_id, "name": r.name, "spec_hash": r.spec_hash,
             "built": self._builder.is_built(r.spec_hash), "created_at": r.created_at,
             "last_used_at": r.last_used_at}
            for r in self._store.all()
        ]}

    def show(self, venv_id: int) -> dict[str, Any]:
        """One environment: its spec, whether it is built, and the packages in it.

        Returns:
            ``{"venv_id", "name", "spec", "requirements", "spec_hash", "built", "path",
            "packages": [{"name", "version"}...], "created_at", "last_used_at"}``
            (``packages`` from the installed distributions' metadata, empty until built), or a
            ``validation``/``not_found`` error dict.
        """
        if self._remote is not None:
            return dict(self._remote.call("show", {"venv_id": venv_id}))
        try:
            if not _is_id(venv_id):
                raise CoordexError(
                    "validation", f"venv_id must be an integer from 0 to {MAX_VENV_ID}, got "
                    f"{venv_id!r}"[:200] + ".", "Use a venv_id that environments.list() shows.")
            record = self._store.get(venv_id)
            if record is None:
                raise self._not_found(venv_id)
            spec = parse_spec(record.spec_text)
        except CoordexError as exc:
            return exc.to_dict()
        built = self._builder.is_built(record.spec_hash)
        return {
            "venv_id": record.venv_id, "name": record.name, "spec": record.spec_text,
            "requirements": list(spec.requirements), "spec_hash": record.spec_hash,
            "built": built,
            "path": str(self._builder.folder(record.spec_hash)) if built else None,
            "packages": _installed(self._builder.folder(record.spec_hash)) if built else [],
            "created_at": record.created_at, "last_used_at": record.last_used_at,
        }

    def exists(self, venv_id: int) -> bool:
        if venv_id in self._known:
            return True
        if self._remote is not None:
            if not _is_id(venv_id) or self._remote.call("exists", {"venv_id": venv_id}) is not True:
                return False
        elif not _is_id(venv_id) or self._store.get(venv_id) is None:
            return False
        with self._lock:
            self._known.add(venv_id)
        return True

    def env_dir(self, venv_id: int) -> Path | None:
        """The folder the environment is (or will be) built in; None for an unknown id."""
        ready = self._ready.get(venv_id)
        if ready is not None:
            return ready.folder
        if self._remote is not None:
            folder = self._remote.call("env_dir", {"venv_id": venv_id}) if _is_id(venv_id) else None
            return None if not isinstance(folder, str) else Path(folder)
        record = self._store.get(venv_id) if _is_id(venv_id) else None
        return None if record is None else self._builder.folder(record.spec_hash)

    def describe(self, venv_id: int) -> tuple[str, str, str]:
        """``(spec_text, spec_hash, label)`` of an environment, for a builder elsewhere
        (a cluster node builds it with the same hash). Raises like :meth:`python_for`."""
        if self._remote is not None:
            text, spec_hash, label = _raise_if_error(
                self._remote.call("describe", {"venv_id": venv_id}))
            return str(text), str(spec_hash), str(label)
        record = self._store.get(venv_id) if _is_id(venv_id) else None
        if record is None:
            raise self._not_found(venv_id)
        spec = parse_spec(record.spec_text)
        spec_hash = self._current_hash(record, spec, find_interpreter(spec.requires_python))
        label = f"environment venv_id={venv_id}" + (f" ({record.name!r})" if record.name else "")
        return record.spec_text, spec_hash, label

    # -- building -------------------------------------------------------------------------------

    def build(self, venv_id: int,
              on_progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Build now (else the first use builds). ``cached`` is True if it was already built.

        Returns:
            ``{"venv_id","built": True,"path","python","duration_ms","cached"}``, or a
            ``not_found``/``validation``/``environment`` error dict (the last with ``log``).
        """
        started = time.monotonic()
        try:
            ready, cached = self._ensure(venv_id, on_progress)
        except CoordexError as exc:
            return exc.to_dict()
        return {"venv_id": venv_id, "built": True, "path": str(ready.folder),
                "python": str(ready.python),
                "duration_ms": round((time.monotonic() - started) * 1000, 3),
                "cached": cached}

    def python_for(self, venv_id: int, on_progress: ProgressCallback | None = None) -> Path:
        """The environment's python executable, building the environment on first use.

        Raises:
            CoordexError: ``validation`` (bad id), ``not_found`` (unknown id) or
                ``environment`` (the build failed; ``log`` in ``extra``).
        """
        ready = self._ready.get(venv_id)
        # One stat verifies the folder is still there (someone may have removed it).
        if ready is not None and os.path.exists(ready.marker):
            self._touch(venv_id)
            return ready.python
        return self._ensure(venv_id, on_progress)[0].python

    def _ensure(self, venv_id: int, on_progress: ProgressCallback | None) -> tuple[_Ready, bool]:
        from ..observe.hook import watch_build

        with watch_build(venv_id) as build:  # a span and the build's figures (SPEC 16)
            ready, build["cached"] = self._ensure_now(venv_id, on_progress)
        return ready, build["cached"]

    def _ensure_now(self, venv_id: int,
                    on_progress: ProgressCallback | None) -> tuple[_Ready, bool]:
        if not _is_id(venv_id):
            raise CoordexError(
                "validation", f"venv_id must be an integer from 0 to {MAX_VENV_ID}, got "
                f"{venv_id!r}"[:200] + ".",
                "Use the venv_id returned by environments.create(...) or listed by "
                "environments.list().")
        if self._remote is not None:
            return self._ensure_remote(venv_id, on_progress)
        with self._lock:
            id_lock = self._id_locks.setdefault(venv_id, threading.Lock())
        with id_lock:  # one build per id in this process; the builder's file lock spans processes
            record = self._store.get(venv_id)
            if record is None:
                raise self._not_found(venv_id)
            spec = parse_spec(record.spec_text)
            interpreter = find_interpreter(spec.requires_python)
            spec_hash = self._current_hash(record, spec, interpreter)
            outcome = self._builder.ensure_built(
                spec, spec_hash, interpreter,
                on_progress=on_progress,
                label=f"environment venv_id={venv_id}"
                      + (f" ({record.name!r})" if record.name else ""))
            now = time.time()
            self._store.mark_built(venv_id, spec_hash, now)
            ready = _Ready(outcome.path, outcome.python, self._builder.marker(spec_hash))
            with self._lock:
                self._ready[venv_id] = ready
                self._known.add(venv_id)
                self._touched[venv_id] = now
            return ready, outcome.cached

    def _ensure_remote(self, venv_id: int,
                       on_progress: ProgressCallback | None) -> tuple[_Ready, bool]:
        built = _raise_if_error(self._remote.call("build", {"venv_id": venv_id}, on_progress))
        folder = Path(built["path"])
        ready = _Ready(folder, Path(built["python"]), folder / MARKER)
        with self._lock:
            self._ready[venv_id] = ready
            self._known.add(venv_id)
            self._touched[venv_id] = time.time()
        return ready, bool(built["cached"])

    def build_spec(self, spec_text: str, spec_hash: str, label: str,
                   on_progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Build ``spec_text`` with the ``spec_hash`` another process chose (a cluster
        node builds what the driver describes, with the driver's hash), with no registry
        row. ``{"path", "python", "cached"}``.

        The folder is named by that hash *and* the spec text: the caller may be the
        tenant's own code (a confined host's builder channel), and a hash of another
        spec must not let it fill that spec's folder with something else.

        Raises:
            CoordexError: ``validation`` for a hash that is not sha256 hex (it names a
                folder), else as :meth:`python_for`.
        """
        if self._remote is not None:
            return dict(_raise_if_error(self._remote.call(
                "build_spec", {"spec_text": spec_text, "spec_hash": spec_hash,
                               "label": label}, on_progress)))
        if not isinstance(spec_hash, str) or not _SHA256.fullmatch(spec_hash):
            raise CoordexError("validation", f"spec_hash must be sha256 hex, got "
                               f"{spec_hash!r}"[:200] + ".",
                               "Pass the spec_hash that describe(venv_id) returned.")
        spec = parse_spec(spec_text)
        outcome = self._builder.ensure_built(
            spec, spec.spec_hash({"given": spec_hash}), find_interpreter(spec.requires_python),
            on_progress=on_progress, label=str(label)[:200])
        return {"path": str(outcome.path), "python": str(outcome.python),
                "cached": outcome.cached}

    def _current_hash(self, record: EnvironmentRecord, spec: EnvironmentSpec,
                      interpreter: Interpreter) -> str:
        # Inputs besides the spec (uv upgraded, index changed) may differ from when the
        # row was created: then the same venv_id moves to a new folder.
        spec_hash = spec.spec_hash(hash_inputs(interpreter, self._hash_environ()))
        if spec_hash != record.spec_hash:
            self._store.set_hash(record.venv_id, spec_hash)
        return spec_hash

    def _hash_environ(self) -> dict[str, str]:
        """What a build here sees of the index settings: ``[build.env]`` of
        ``root/coordex.toml`` over this process's environment (raises ``validation`` for
        a file coordex cannot read as meant)."""
        return {**os.environ, **read_settings(settings_file(self.root)).build_env}

    def _touch(self, venv_id: int) -> None:
        now = time.time()
        if now - self._touched.get(venv_id, 0.0) < TOUCH_INTERVAL_S:
            return
        self._touched[venv_id] = now
        try:
            if self._remote is not None:
                self._remote.call("touch", {"venv_id": venv_id})
            else:
                self._store.touch(venv_id, now)
        except Exception:  # a busy database must not fail a run; the stamp is informational
            pass

    def touch(self, venv_id: int) -> None:
        """Record that ``venv_id`` was used (at most once a minute; a builder's host asks)."""
        if _is_id(venv_id) and self.exists(venv_id):
            self._touch(venv_id)

    def _not_found(self, venv_id: int) -> CoordexError:
        records = self._store.all()
        if records:
            known = ", ".join(
                f"venv_id={r.venv_id}" + (f" ({r.name!r})" if r.name else "")
                for r in records[:20])
            more = f" and {len(records) - 20} more" if len(records) > 20 else ""
            suggestion = (f"Use one of the existing environments: {known}{more}; or create "
                          "one with environments.create(spec) and use the venv_id it returns.")
        else:
            suggestion = ("No environments exist yet. Create one with "
                          "environments.create(spec) and use the venv_id it returns, or use "
                          "venv_id=None for the agent's own interpreter.")
        return CoordexError("not_found", f"No environment with venv_id={venv_id}.", suggestion)

    # -- housekeeping ---------------------------------------------------------------------------

    def close(self) -> None:
        """Forget the in-memory caches. Nothing runs between calls, so nothing to stop."""
        with self._lock:
            self._ready.clear()
            self._touched.clear()
        # A builder's channel is left open: it ends with the host process (closing it
        # first would end the builder, and the jail's init would end the host mid-close).

    def remove_unused(self) -> dict[str, Any]:
        """Delete leftovers of crashed builds and built folders no environment here uses.

        With a shared ``envs_dir`` other roots may use any folder, so only crashed-build
        leftovers are removed there (``"kept_shared": True``).
        """
        if self._remote is not None:
            return dict(self._remote.call("remove_unused", {}))
        keep = {r.spec_hash for r in self._store.all()}
        try:
            result = self._builder.remove_unused(keep, remove_envs=not self.shared_envs)
        except OSError as exc:
            return make_error("environment", f"Could not clean {self.envs_dir}: {exc}.",
                              "Check the folder's permissions and try again.", log="")
        if self.shared_envs:
            result["kept_shared"] = True
        return result


def _installed(folder: Path) -> list[dict[str, str]]:
    """The distributions installed in the environment at ``folder``, from their metadata."""
    from importlib import metadata

    found: dict[str, str] = {}
    for site in [*folder.glob("lib/python*/site-packages"), folder / "Lib" / "site-packages"]:
        if site.is_dir():
            for dist in metadata.distributions(path=[str(site)]):
                name = dist.metadata["Name"]
                if name:
                    found[name] = dist.version
    return [{"name": name, "version": found[name]} for name in sorted(found, key=str.lower)]


def _raise_if_error(value: Any) -> Any:
    """A builder's answer, or the CoordexError its error dict stands for."""
    if isinstance(value, dict) and is_error(value):
        extra = {k: v for k, v in value.items() if k not in ("error", "error_type", "suggestion")}
        raise CoordexError(value["error_type"], value["error"], value["suggestion"], **extra)
    return value


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_VENV_ID


def _check_name(name: Any) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or "\x00" in name \
            or not is_valid_text(name):
        raise CoordexError(
            "validation", f"An environment name must be a non-empty string of at most "
            f"{MAX_NAME} characters, got {name!r}"[:300] + ".",
            "Pass a short text name (no NUL or undecodable characters) such as "
            "name='ledger-v1', or omit name.")
    return name


__all__ = ["EnvironmentManager"]
