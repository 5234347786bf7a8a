"""``coordex demo``: the four-coordinate walkthrough, run for real and printed.

Six steps, each a real call through the public :class:`~coordex.Executor` API:

1. bash, stateless - list the demo's workspace;
2. Python, stateful, session "audit" - load a generated ledger (a few thousand rows);
3. Python, read_only - sort and truncate the ledger in place; row counts and
   ``inspect_session`` before and after show the session untouched, and the demo says
   what the same code run stateful would have cost (rows and totals lost);
4. a dedicated environment - a forecast with a tiny package from a local wheel the
   demo writes itself (stdlib ``zipfile``), so nothing is downloaded;
5. a stored function, its source shown, tried read_only before it runs stateful, and
   its effect on the session shown after;
6. one wrong coordinate, and the suggestion that fixes it.

Each step checks what it claims; the demo exits 0 when every step held, 1 if one did
not.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import csv
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import textwrap
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LEDGER_ROWS = 3000
WHEEL_NAME = "coordex_demo_forecast"
WHEEL_VERSION = "0.1.0"


# The stored function of step 5. It lives at module level so its source can be read,
# and it reads `ledger` from the session it runs in.
def mark_reviewed(limit):
    """Mark the first `limit` ledger rows as reviewed; return how many are reviewed."""
    for row in ledger[:limit]:  # noqa: F821
        row["reviewed"] = True
    return sum(1 for row in ledger if row.get("reviewed"))  # noqa: F821


class StepFailed(Exception):
    """A step's claim did not hold; the message says which."""


@dataclass
class Walkthrough:
    ex: Any
    workdir: Path
    out: Callable[[str], None]
    results: list[tuple[str, str]] = field(default_factory=list)

    # --- printing ----------------------------------------------------------------------

    def heading(self, number: int, title: str) -> None:
        self.out("")
        self.out(f"── {number}. {title} " + "─" * max(3, 66 - len(title)))

    def call(self, code: str, **coords: Any) -> dict[str, Any]:
        shown = ", ".join(f"{k}={v!r}" for k, v in coords.items())
        self.out(f">>> execute_code({shown})")
        self.out(textwrap.indent(code.strip("\n"), "    | "))
        record: dict[str, Any] = self.ex.execute_code(code, **coords)
        self.show(record)
        return record

    def show(self, record: dict[str, Any]) -> None:
        if "error_type" in record:
            self.out(f"    error_type: {record['error_type']}")
            self.out(f"    error:      {record['error']}")
            self.out(f"    suggestion: {record['suggestion']}")
            if record.get("traceback"):
                self.out(textwrap.indent(str(record["traceback"]).rstrip(), "    ! "))
            return
        for stream in ("stdout", "stderr"):
            text = str(record.get(stream) or "").rstrip("\n")
            if text:
                self.out(textwrap.indent(_clip(text), "    " if stream == "stdout" else "  ! "))
        if record.get("result") is not None:
            self.out(f"    => {_clip(str(record['result']), 300)}")
        if record.get("exit_code") not in (None, 0):
            self.out(f"    exit_code: {record['exit_code']}")
        if "isolation" in record:
            self.out(f"    isolation: {json.dumps(record['isolation'])}")

    def show_names(self, label: str, inspected: dict[str, Any]) -> None:
        self.out(f"    inspect_session(session_name='audit') {label}:")
        for entry in inspected.get("names", []):
            self.out(f"      {entry['name']:<7} {entry['type']:<6} {_one_line(entry['repr'], 56)}"
                     f"  (bound at call {entry.get('bound_at_call')})")

    # --- steps -------------------------------------------------------------------------

    def step_bash(self) -> None:
        record = self.call(f"cd {_sh_quote(str(self.workdir))} && ls -l && wc -l ledger.csv",
                           language="bash", state_mode="stateless")
        _expect(record, "ledger.csv" in record.get("stdout", ""),
                "the listing should show ledger.csv")

    def step_load(self) -> None:
        code = f"""
import csv
with open({str(self.workdir / 'ledger.csv')!r}, newline="") as file:
    ledger = [dict(row, amount=float(row["amount"])) for row in csv.DictReader(file)]
del file
totals = {{}}
for row in ledger:
    totals[row["account"]] = round(totals.get(row["account"], 0.0) + row["amount"], 2)
del row
print(f"{{len(ledger)}} rows, {{len(totals)}} accounts")
totals
"""
        record = self.call(code, state_mode="stateful", session_name="audit")
        _expect(record, f"{LEDGER_ROWS} rows" in record.get("stdout", ""),
                f"the session should hold {LEDGER_ROWS} rows")

    def counts(self, label: str) -> tuple[int, int]:
        """The session's (ledger rows, account totals), looked at read-only."""
        record = self.ex.execute_code("len(ledger), len(totals)", state_mode="read_only",
                                      session_name="audit")
        _expect(record, record.get("result") is not None, "the counts should come back")
        rows, accounts = ast.literal_eval(record["result"])
        self.out(f"    session 'audit' {label}: {rows} ledger rows, {accounts} account totals")
        return int(rows), int(accounts)

    def step_read_only(self) -> None:
        before = self.ex.inspect_session(session_name="audit")
        _expect(before, "names" in before, "inspect_session should list names")
        self.show_names("before", before)
        rows_before, accounts_before = self.counts("before")
        code = """
ledger.sort(key=lambda row: -row["amount"])   # in place
del ledger[10:]                                # and cut to the top ten
totals.clear()
print("inside the copy:", len(ledger), "rows,", len(totals), "totals, largest",
      ledger[0]["amount"])
len(ledger), len(totals)
"""
        record = self.call(code, state_mode="read_only", session_name="audit")
        _expect(record, "inside the copy: 10 rows" in record.get("stdout", ""),
                "the read-only copy should see its own changes")
        rows_copy, accounts_copy = ast.literal_eval(record["result"])
        after = self.ex.inspect_session(session_name="audit")
        self.show_names("after", after)
        if _names(before) != _names(after):
            raise StepFailed("inspect_session differs after the read-only call")
        rows_after, accounts_after = self.counts("after")
        if (rows_after, accounts_after) != (rows_before, accounts_before):
            raise StepFailed("the read-only call changed the session's row counts")
        check = self.call('ledger[0]["id"]', state_mode="stateful", session_name="audit")
        _expect(check, check.get("result") == "'T00000'",
                "the session's ledger should keep its order")
        lost = accounts_before - accounts_copy
        totals_lost = (f"all {lost}" if lost == accounts_before
                       else f"{lost} of its {accounts_before}")
        self.out(f"    run stateful, the same code would have cost the session "
                 f"{rows_before - rows_copy} of its {rows_before} ledger rows (and their "
                 f"order) and {totals_lost} account totals;")
        self.out("    read_only kept them all: same rows, same order, totals intact.")

    def step_environment(self) -> None:
        from .tools import build_environment

        environments = self.ex.environments
        # Under the data folder, so the spec (which names the wheel's path) and hence the
        # environment are the same on the next run with this COORDEX_HOME.
        wheel = write_forecast_wheel(Path(self.ex.root) / "demo-wheels")
        spec = f"{WHEEL_NAME.replace('_', '-')} @ {wheel.as_uri()}\n"
        self.out(f">>> environments.create({spec.strip()!r}, name='forecast')")
        created = environments.create(spec, name="forecast")
        if "error_type" in created:
            self.show(created)
        else:
            self.out(f"    => venv_id={created['venv_id']} (built on first use)")
        _expect(created, "venv_id" in created, "create should return a venv_id")
        self.out(f">>> environments.build({created['venv_id']})   (uv output on stderr)")
        built = build_environment(environments, created["venv_id"], _to_stderr)
        if "error_type" in built:
            self.show(built)
        _expect(built, True, "the environment should build")
        monthly = self.call(_MONTHLY_CODE, state_mode="read_only", session_name="audit")
        _expect(monthly, monthly.get("result") is not None, "monthly totals should come back")
        series = ast.literal_eval(monthly["result"])
        code = f"""
from {WHEEL_NAME} import linear_forecast
linear_forecast({series!r}, steps=3)
"""
        record = self.call(code, state_mode="stateless", venv_id=created["venv_id"])
        _expect(record, record.get("result") is not None, "the forecast should return values")

    def step_function(self) -> None:
        library = self.ex.functions
        self.out(">>> ex.functions.define()(mark_reviewed)")
        library.define()(mark_reviewed)
        fn = library["mark_reviewed"]
        shown = library.show("mark_reviewed")
        _expect(shown, "source" in shown, "the stored function should show its source")
        self.out(f"    stored {shown['name']} v{shown['version']}, source:")
        # The lint markers of this module's copy are not part of what the function does.
        source = re.sub(r"  # noqa: \w+", "", str(shown["source"])).rstrip()
        self.out(textwrap.indent(source, "    | "))
        self.out(">>> ex.functions['mark_reviewed'].read_only(session_name='audit')(5)")
        tried = fn.read_only(session_name="audit")(5)
        self.out(f"    => {tried!r}   (tried on a copy)")
        untouched = self.ex.execute_code('sum(1 for r in ledger if r.get("reviewed"))',
                                         state_mode="stateful", session_name="audit")
        _expect(untouched, untouched.get("result") == "0",
                "the read-only try should leave no row reviewed")
        self.out("    session after the try: 0 rows reviewed")
        self.out(">>> ex.functions['mark_reviewed'].stateful(session_name='audit')(5)")
        done = fn.stateful(session_name="audit")(5)
        self.out(f"    => {done!r}   (kept by the session)")
        if done != 5:
            raise StepFailed(f"the stateful run should review 5 rows, got {done!r}")
        effect = self.call('[row["id"] for row in ledger if row.get("reviewed")]',
                           state_mode="read_only", session_name="audit")
        _expect(effect, effect.get("result") is not None
                and len(ast.literal_eval(effect["result"])) == 5,
                "the session should now hold 5 reviewed rows")
        self.out("    the stateful run changed the session: those 5 rows are marked reviewed.")

    def step_wrong(self) -> None:
        record = self.call("ledger[:3]", state_mode="read_only", session_name="audti")
        if "error_type" not in record or not record.get("suggestion"):
            raise StepFailed("a misspelt session should be an error with a suggestion")
        self.out("    the suggestion names the fix; following it:")
        fixed = self.call('[row["id"] for row in ledger[:3]]',
                          state_mode="read_only", session_name="audit")
        _expect(fixed, fixed.get("result") is not None, "the corrected call should work")

    def run(self) -> int:
        steps: list[tuple[str, Callable[[], None]]] = [
            ("bash · stateless: a one-off look at the workspace", self.step_bash),
            ("python · stateful: load the ledger into session 'audit'", self.step_load),
            ("python · read_only: reshape a copy, the session stays intact",
             self.step_read_only),
            ("venv_id: a forecast in a dedicated environment", self.step_environment),
            ("stored function: read_only first, then stateful", self.step_function),
            ("a wrong coordinate and its suggestion", self.step_wrong),
        ]
        for number, (title, step) in enumerate(steps, start=1):
            self.heading(number, title)
            try:
                step()
            except StepFailed as why:
                self.out(f"    FAILED: {why}")
                self.results.append((title, "FAILED"))
            except Exception as exc:  # a coordex bug: report it and carry on
                self.out(f"    FAILED: {type(exc).__name__}: {exc}")
                self.results.append((title, "FAILED"))
            else:
                self.results.append((title, "ok"))
        self.out("")
        self.out("── summary " + "─" * 60)
        for title, status in self.results:
            self.out(f"    {status:<8} {title}")
        return 1 if any(status == "FAILED" for _, status in self.results) else 0


_MONTHLY_CODE = """
monthly = {}
for row in ledger:
    month = row["date"][:7]
    monthly[month] = monthly.get(month, 0.0) + row["amount"]
[round(monthly[m], 2) for m in sorted(monthly)]
"""


def _names(inspected: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((n["name"], n["type"], n["repr"]) for n in inspected.get("names", []))


def _expect(record: dict[str, Any], condition: bool, claim: str) -> None:
    if "error_type" in record:
        raise StepFailed(f"{claim}, but the call returned {record['error_type']}: "
                         f"{record['error']}")
    if not condition:
        raise StepFailed(claim)


def _clip(text: str, limit: int = 1500) -> str:
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2:]


def _to_stderr(stream: str, text: str) -> None:
    print(f"    [{stream}] {text.rstrip()}", file=sys.stderr, flush=True)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 12] + " ... " + text[-7:]


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# --- fixtures the demo writes itself ----------------------------------------------------


def write_ledger(path: Path, rows: int = LEDGER_ROWS, seed: int = 7) -> Path:
    """A deterministic CSV ledger: id, date, account, category, amount."""
    rng = random.Random(seed)
    accounts = ["ops", "sales", "research", "legal", "facilities", "travel"]
    categories = ["invoice", "refund", "payroll", "software", "hardware"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "date", "account", "category", "amount"])
        for i in range(rows):
            month = 1 + i * 12 // rows
            writer.writerow([
                f"T{i:05d}", f"2025-{month:02d}-{1 + rng.randrange(28):02d}",
                rng.choice(accounts), rng.choice(categories),
                f"{rng.lognormvariate(5, 1) * (1 + month / 24):.2f}",
            ])
    return path


_FORECAST_MODULE = '''\
"""A tiny least-squares trend forecast (demo package written by coordex demo)."""


def linear_forecast(values, steps=3):
    n = len(values)
    if n < 2:
        return [values[-1] if values else 0.0] * steps
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    sxx = sum((x - mean_x) ** 2 for x in range(n))
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(range(n), values))
    slope = sxy / sxx
    return [round(mean_y + slope * (n + k - mean_x), 2) for k in range(steps)]
'''


def write_forecast_wheel(folder: Path) -> Path:
    """A pure-Python wheel for :data:`WHEEL_NAME`, built with zipfile (no network, no pip)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{WHEEL_NAME}-{WHEEL_VERSION}"
    files = {
        f"{WHEEL_NAME}/__init__.py": _FORECAST_MODULE,
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {WHEEL_NAME.replace('_', '-')}\n"
            f"Version: {WHEEL_VERSION}\nSummary: coordex demo forecast\n"
        ),
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: coordex-demo\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    return pack_wheel(folder, dist, files)


def pack_wheel(folder: Path, dist: str, files: dict[str, str]) -> Path:
    """``files`` (path in the wheel -> text) as ``folder/<dist>-py3-none-any.whl``, with
    its RECORD. A fixed timestamp keeps the wheel's bytes (and so an environment's spec
    hash) the same from run to run."""
    record_lines = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record_lines.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record_lines.append(f"{dist}.dist-info/RECORD,,")
    files = {**files, f"{dist}.dist-info/RECORD": "\n".join(record_lines) + "\n"}
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return wheel


@contextlib.contextmanager
def _demo_home(home: str | None, keep: bool) -> Iterator[tuple[Path, bool]]:
    """The data folder: ``home``, ``COORDEX_HOME``, or a temporary one (removed after)."""
    chosen = home or os.environ.get("COORDEX_HOME")
    if chosen:
        yield Path(chosen).expanduser(), False
        return
    temp = Path(tempfile.mkdtemp(prefix="coordex-demo-"))
    try:
        yield temp, True
    finally:
        if not keep:
            shutil.rmtree(temp, ignore_errors=True)


def run_demo(home: str | None = None, keep: bool = False,
             out: Callable[[str], None] | None = None) -> int:
    """Run the walkthrough; 0 when every step that ran held, 1 otherwise."""
    write = out or (lambda line: print(line, flush=True))
    from .executor import Executor

    with _demo_home(home, keep) as (root, temporary):
        workdir = Path(tempfile.mkdtemp(prefix="coordex-demo-work-"))
        try:
            write_ledger(workdir / "ledger.csv")
            write(f"coordex demo - data folder {root}" + (" (temporary)" if temporary else ""))
            write(f"workspace {workdir}: ledger.csv with {LEDGER_ROWS} rows")
            with Executor(root=root) as ex:
                code = Walkthrough(ex, workdir, write).run()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if temporary and keep:
            print(f"coordex: kept the data folder {root}", file=sys.stderr)
    return code


__all__ = ["pack_wheel", "run_demo", "write_forecast_wheel", "write_ledger"]
