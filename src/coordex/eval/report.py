"""The eval's report: ``report.json`` (SPEC 13's shape), ``report.md``, ``report.png``
and the table printed at the end.

A run writes its own report, and keeps a copy under ``runs/POLICY.json`` in the same
folder: the Markdown's comparison table and the chart put every policy run into that
folder side by side, so running ``fresh``, ``kept`` and ``reference`` (and a model) into
one ``--out`` builds the comparison. The chart needs matplotlib (``pip install
'coordex[eval]'``); without it the other files are still written and the run says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .runner import TaskResult

# The measures the comparison shows, in order: (total's key, heading, lower is better).
MEASURES = (("succeeded", "tasks succeeded", False), ("wall_s", "wall time (s)", True),
            ("redo_s", "redo time (s)", True), ("stale_errors", "stale-name errors", True),
            ("code_chars", "code sent (chars)", True), ("exec_s", "execution (s)", True))
WORK = ("calls", "code_chars", "result_chars", "exec_s")


def build(policy: str, model: str | None, results: Sequence[TaskResult],
          tools: str | None = None) -> dict[str, Any]:
    """The report as SPEC 13 gives it; ``tools`` names a model's arm (None for a fixed
    policy)."""
    tokens = [r.tokens for r in results if r.tokens is not None]
    return {
        "policy": policy,
        "model": model,
        "tools": tools,
        "tasks": [r.record() for r in results],
        "total": {
            "tasks": len(results),
            "succeeded": sum(r.success for r in results),
            "wall_s": round(sum(r.wall_s for r in results), 3),
            "redo_s": round(sum(r.redo_s for r in results), 3),
            "stale_errors": sum(r.stale_errors for r in results),
            "tokens": sum(tokens) if tokens else None,
            "calls": sum(r.work.calls for r in results),
            "code_chars": sum(r.work.code_chars for r in results),
            "result_chars": sum(r.work.result_chars for r in results),
            "exec_s": round(sum(r.work.exec_s for r in results), 3),
        },
    }


def label(report: dict[str, Any]) -> str:
    """A run's name in the comparison: the policy, or the model with its arm."""
    if not report.get("model"):
        return str(report["policy"])
    name = f"model {report['model']}"
    if report.get("tools") not in (None, "coordex"):
        name += f" ({report['tools']} only)"
    return name + (" stepwise" if report.get("stepwise") else "")


def _runs_key(report: dict[str, Any]) -> str:
    name = label(report)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def write(report: dict[str, Any], results: Sequence[TaskResult], out: Path,
          scale: float, stepwise: bool = False) -> list[str]:
    """Write the three files into ``out``; returns notes for the person (a chart that
    could not be drawn). Runs kept in ``out/runs`` join the comparison when they ran the
    same tasks at the same scale."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    runs = out / "runs"
    runs.mkdir(exist_ok=True)
    kept = dict(report, scale=scale, stepwise=stepwise)
    (runs / f"{_runs_key(kept)}.json").write_text(json.dumps(kept, indent=1) + "\n",
                                                    encoding="utf-8")
    compared = _gather(runs, kept)
    (out / "report.md").write_text(markdown(report, results, compared), encoding="utf-8")
    notes = []
    try:
        chart(compared, out / "report.png")
    except ImportError:
        notes.append("report.png was not drawn: matplotlib is missing "
                     "(pip install 'coordex[eval]').")
    return notes


def _gather(runs: Path, current: dict[str, Any]) -> list[dict[str, Any]]:
    """Every report kept in ``runs`` (the current one included): the fixed policies
    first, then models by name."""
    found = []
    for path in sorted(runs.glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (isinstance(report, dict) and "total" in report and label(report) != label(current)
                and report.get("scale") == current["scale"]
                and _names(report) == _names(current)):
            found.append(report)
    order = {"fresh": 0, "kept": 1, "reference": 2}
    found.append(current)
    found.sort(key=lambda r: (order.get(r["policy"], 3), label(r)))
    return found


def _names(report: dict[str, Any]) -> list[str]:
    return [str(t.get("name")) for t in report.get("tasks") or [] if isinstance(t, dict)]


# --- the table -------------------------------------------------------------------------

COLUMNS = ("task", "steps", "success", "wall_s", "redo_s", "stale", "calls", "tokens",
           "code_chars", "result_chars", "exec_s")


def rows(report: dict[str, Any]) -> list[list[str]]:
    out = []
    for t in report["tasks"]:
        out.append([t["name"], str(t["steps"]), "yes" if t["success"] else "NO",
                    f"{t['wall_s']:.2f}", f"{t['redo_s']:.2f}", str(t["stale_errors"]),
                    str(sum(t["calls_by_coordinate"].values())),
                    "-" if t["tokens"] is None else str(t["tokens"]),
                    str(t["code_chars"]), str(t["result_chars"]), f"{t['exec_s']:.2f}"])
    total = report["total"]
    out.append(["total", str(sum(t["steps"] for t in report["tasks"])),
                f"{total['succeeded']}/{total['tasks']}", f"{total['wall_s']:.2f}",
                f"{total['redo_s']:.2f}", str(total["stale_errors"]),
                str(sum(sum(t["calls_by_coordinate"].values()) for t in report["tasks"])),
                "-" if total["tokens"] is None else str(total["tokens"]),
                str(total["code_chars"]), str(total["result_chars"]), f"{total['exec_s']:.2f}"])
    return out


def table(report: dict[str, Any]) -> str:
    """The per-task table, as plain text."""
    cells = [list(COLUMNS), *rows(report)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def _md_table(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def _choice(c: dict[str, Any]) -> str:
    where = f"{c['language']}/{c['state_mode']}"
    if c.get("session") is not None:
        where += f" {c['session']!r}" if isinstance(c["session"], str) else f" #{c['session']}"
    if c.get("venv_id") is not None:
        where += f" venv {c['venv_id']}"
    return f"{c['step']}:{where}"


def markdown(report: dict[str, Any], results: Sequence[TaskResult],
             compared: Sequence[dict[str, Any]]) -> str:
    lines = [f"# coordex eval: {label(report)}", ""]
    if len(compared) > 1:
        lines += ["## Policies side by side", ""]
        head = ["run", "tasks succeeded", "wall (s)", "redo (s)", "stale", "calls",
                "code chars", "result chars", "exec (s)", "tokens"]
        body = [[label(r), f"{r['total']['succeeded']}/{r['total']['tasks']}",
                 f"{r['total']['wall_s']:.1f}", f"{r['total']['redo_s']:.1f}",
                 str(r["total"]["stale_errors"]),
                 *(str(r["total"].get(k, "-")) for k in ("calls", "code_chars", "result_chars")),
                 "-" if r["total"].get("exec_s") is None else f"{r['total']['exec_s']:.1f}",
                 "-" if r["total"]["tokens"] is None else str(r["total"]["tokens"])]
                for r in compared]
        lines += [*_md_table(head, body), ""]
    lines += [f"## {label(report)}: per task", ""]
    lines += [*_md_table(COLUMNS, rows(report)), ""]
    failed = [r for r in results if not r.success]
    if failed:
        lines += ["## Why tasks failed", ""]
        lines += [f"- **{r.name}**: {r.note}" for r in failed]
        lines.append("")
    lines += ["## Calls by coordinate", ""]
    totals: dict[str, int] = {}
    for t in report["tasks"]:
        for key, n in t["calls_by_coordinate"].items():
            totals[key] = totals.get(key, 0) + n
    lines += [*_md_table(["coordinate", "calls"], [[k, str(v)] for k, v in sorted(totals.items())]), ""]
    lines += ["## Coordinates chosen, step by step", ""]
    for t in report["tasks"]:
        lines.append(f"- **{t['name']}**: " + ", ".join(_choice(c) for c in t["choices"]))
    return "\n".join(lines) + "\n"


# --- the chart -------------------------------------------------------------------------


def chart(compared: Sequence[dict[str, Any]], path: Path) -> None:
    """One panel per measure, a bar per policy. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [label(r) for r in compared]
    figure, axes = plt.subplots(2, len(MEASURES) // 2, figsize=(3.4 * len(MEASURES) // 2, 6.4))
    palette = ["#9aa5b1", "#d08c60", "#4c8c6a", "#5b7fbf", "#a06cb4"]
    for ax, (key, heading, lower) in zip(axes.flat, MEASURES, strict=True):
        values = [float(r["total"].get(key) or 0) for r in compared]
        bars = ax.bar(range(len(names)), values,
                      color=[palette[i % len(palette)] for i in range(len(names))])
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values],
                     fontsize=8)
        ax.set_title(heading + (" (lower is better)" if lower else ""), fontsize=9)
        ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
        ax.spines[["top", "right"]].set_visible(False)
        # Every axis starts at zero; one whose bars are all zero still shows 0 to 1.
        top = max(r["total"]["tasks"] for r in compared) if key == "succeeded" else max(values)
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    figure.suptitle("coordex eval: " + ", ".join(names), fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
