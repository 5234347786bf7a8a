"""The suite: twelve long tasks of nine steps each, from the work agents do.

Every task mixes the coordinates' reasons: an expensive load kept for several steps of
analysis, a look that must not change anything, a one-off check, shell work on files,
and one **planted** stale value: an attempt the task abandons (a name rebound, rows
changed in place, a shell variable pointed elsewhere) that a later step must not pick
up. Each checker reads what the task wrote and knows the value the left-over would
give, so a stale-name error is detected by its value, not guessed. One task needs two
environments whose pins of ``ledgerlib`` cannot meet, through stored functions.
"""

from __future__ import annotations

import csv
import gzip
import statistics
from pathlib import Path
from typing import Any

from . import data, kit
from .hard import HARD
from .tasks import Step, Task, Verdict, all_of, judge_file

_LOAD = "(slow: it checks every row)"


def _out(ws: Path) -> Path:
    (ws / "out").mkdir(parents=True, exist_ok=True)
    return ws


# --- 1. ledger-audit: a quarter-only attempt rebinds the ledger ---------------------------


def _prepare_ledger(ws: Path, scale: float, seed: int) -> dict[str, Any]:
    data.write_ledger(_out(ws) / "ledger.csv", scale, seed)
    return {}


def _check_audit(ws: Path, facts: dict[str, Any]) -> Verdict:
    rows = kit.read_ledger(str(ws / "ledger.csv"))
    q1 = [r for r in rows if r["date"] < "2025-04"]
    return judge_file(
        ws, "out/audit.json",
        {"totals": kit.totals_by(rows, "account"), "by_month": kit.monthly(rows)},
        {"ledger": {"totals": kit.totals_by(q1, "account"), "by_month": kit.monthly(q1)}})


_LEDGER = {"ledger": ((), 'ledger = kit.load_ledger("{ws}/ledger.csv")')}

AUDIT = Task(
    name="ledger-audit",
    title="Audit a ledger: totals per account and per month",
    brief="Audit the ledger {ws}/ledger.csv and write {ws}/out/audit.json.",
    builders={**_LEDGER,
              "totals": (("ledger",), 'totals = kit.totals_by(ledger, "account")'),
              "by_month": (("ledger",), "by_month = kit.monthly(ledger)")},
    steps=(
        Step("Look at the workspace {ws}: list it and count the lines of ledger.csv.",
             "ls -l {ws} && wc -l {ws}/ledger.csv", "stateless", "bash"),
        Step(f"Load the ledger with kit.load_ledger('{{ws}}/ledger.csv') {_LOAD} as `ledger` "
             "and keep it for the steps that follow; print how many rows it has.",
             'print(len(ledger), "rows")', needs=("ledger",)),
        Step("Look at how many rows each category has, without changing anything.",
             'sorted({r["category"]: sum(1 for x in ledger if x["category"] == r["category"]) '
             "for r in ledger[:500]}.items())", "read_only", needs=("ledger",)),
        Step("An attempt you will abandon: rebind `ledger` to the rows dated before 2025-04 "
             "(the first quarter) and total its refunds, to see if the refund spike is there.",
             'ledger = [r for r in ledger if r["date"] < "2025-04"]\n'
             'round(sum(r["amount"] for r in ledger if r["category"] == "refund"), 2)',
             "read_only", needs=("ledger",)),
        Step("A one-off check: how many distinct accounts does {ws}/ledger.csv name? "
             "(kit.read_ledger reads it quickly, without checks.)",
             'len({r["account"] for r in kit.read_ledger("{ws}/ledger.csv")})', "stateless"),
        Step("The quarter attempt is abandoned. Total the whole year's ledger per account "
             "as `totals` (kit.totals_by(ledger, 'account')).",
             'totals = kit.totals_by(ledger, "account")\ntotals', needs=("ledger",)),
        Step("Total the whole ledger per month as `by_month` (kit.monthly(ledger)).",
             "by_month = kit.monthly(ledger)\nby_month", needs=("ledger",)),
        Step("Write {ws}/out/audit.json with keys 'totals' and 'by_month' (kit.write_json).",
             'kit.write_json("{ws}/out/audit.json", {"totals": totals, "by_month": by_month})',
             needs=("totals", "by_month")),
        Step("Check with the shell that the report exists and is not empty.",
             "test -s {ws}/out/audit.json && wc -c {ws}/out/audit.json", "stateless", "bash"),
    ),
    prepare=lambda ws, scale: _prepare_ledger(ws, scale, 1),
    check=_check_audit,
)


# --- 2. fx-report: a look in EUR leaves the rate behind -----------------------------------


def _check_fx(ws: Path, facts: dict[str, Any]) -> Verdict:
    rows = kit.read_ledger(str(ws / "ledger.csv"))

    def report(rate: float) -> dict[str, Any]:
        by = {k: round(v * rate, 2) for k, v in kit.totals_by(rows, "category").items()}
        return {"by_category": by, "grand": round(sum(r["amount"] for r in rows) * rate, 2)}

    return judge_file(ws, "out/fx.json", report(1.0), {"rate": report(0.92)})


_IN_REPORT = "rate = 1.0\ndef in_report(x):\n    return round(x * rate, 2)"

FX = Task(
    name="fx-report",
    title="A ledger report in the report currency",
    brief="Report the ledger {ws}/ledger.csv in USD into {ws}/out/fx.json.",
    builders={**_LEDGER,
              "in_report": ((), _IN_REPORT),
              "by_category": (("ledger", "in_report"),
                              "by_category = {k: in_report(v) for k, v in "
                              'kit.totals_by(ledger, "category").items()}'),
              "grand": (("ledger", "in_report"),
                        'grand = in_report(sum(r["amount"] for r in ledger))')},
    steps=(
        Step(f"Load the ledger with kit.load_ledger('{{ws}}/ledger.csv') {_LOAD} as `ledger` "
             "and keep it; print its row count.", 'print(len(ledger), "rows")', needs=("ledger",)),
        Step("Reports are in USD: set `rate = 1.0` and define `in_report(x)`, which returns "
             "round(x * rate, 2) with the session's `rate`.", _IN_REPORT),
        Step("Look at the largest single amount in report currency, changing nothing.",
             'in_report(max(r["amount"] for r in ledger))', "read_only",
             needs=("ledger", "in_report")),
        Step("The board asks what the grand total would be in EUR: set `rate = 0.92` and "
             "show in_report of the ledger's total. Only a look: the report stays in USD.",
             'rate = 0.92\nin_report(sum(r["amount"] for r in ledger))', "read_only",
             needs=("ledger", "in_report")),
        Step("A one-off: how many lines of {ws}/ledger.csv are refunds? Count with grep.",
             "grep -c ',refund,' {ws}/ledger.csv", "stateless", "bash"),
        Step("Total per category, in report currency, as `by_category`.",
             "by_category = {k: in_report(v) for k, v in "
             'kit.totals_by(ledger, "category").items()}\nby_category',
             needs=("ledger", "in_report")),
        Step("The grand total in report currency as `grand`.",
             'grand = in_report(sum(r["amount"] for r in ledger))\ngrand',
             needs=("ledger", "in_report")),
        Step("Write {ws}/out/fx.json with keys 'by_category' and 'grand'.",
             'kit.write_json("{ws}/out/fx.json", {"by_category": by_category, "grand": grand})',
             needs=("by_category", "grand")),
        Step("Show the report's first lines with the shell.",
             "head -5 {ws}/out/fx.json", "stateless", "bash"),
    ),
    prepare=lambda ws, scale: _prepare_ledger(ws, scale, 2),
    check=_check_fx,
)


# --- 3. events-triage: health checks dropped in place -------------------------------------


def _check_triage(ws: Path, facts: dict[str, Any]) -> Verdict:
    events = kit.read_events(str(ws / "events.log"))
    kept = [e for e in events if e["path"] != "/health"]
    return judge_file(
        ws, "out/triage.json",
        {"statuses": kit.status_counts(events), "p95": kit.p95_by_path(events)},
        {"events": {"statuses": kit.status_counts(kept), "p95": kit.p95_by_path(kept)}})


TRIAGE = Task(
    name="events-triage",
    title="Triage a web server's access log",
    brief="Triage the access log {ws}/events.log into {ws}/out/triage.json.",
    builders={"events": ((), 'events = kit.load_events("{ws}/events.log")'),
              "statuses": (("events",), "statuses = kit.status_counts(events)"),
              "p95": (("events",), "p95 = kit.p95_by_path(events)")},
    steps=(
        Step("Look at the first lines of {ws}/events.log and count its lines.",
             "head -3 {ws}/events.log; wc -l {ws}/events.log", "stateless", "bash"),
        Step("Load the events with kit.load_events('{ws}/events.log') (slow: it parses and "
             "anonymises every line) as `events` and keep them; print how many.",
             'print(len(events), "events")', needs=("events",)),
        Step("Look at how many requests each path had, changing nothing.",
             'sorted({e["path"] for e in events})', "read_only", needs=("events",)),
        Step("An attempt you will abandon: drop the /health checks from `events` in place "
             "(events[:] = [...]) and look at the status counts without them.",
             'events[:] = [e for e in events if e["path"] != "/health"]\n'
             "kit.status_counts(events)", "read_only", needs=("events",)),
        Step("A one-off: how many lines of {ws}/events.log have a 5xx status? Use grep.",
             "grep -cE ' 5[0-9]{2} [0-9]+ [0-9]+$' {ws}/events.log", "stateless", "bash"),
        Step("The /health attempt is abandoned. Count requests per status over all events "
             "as `statuses` (kit.status_counts).",
             "statuses = kit.status_counts(events)\nstatuses", needs=("events",)),
        Step("The 95th percentile latency per path as `p95` (kit.p95_by_path).",
             "p95 = kit.p95_by_path(events)\np95", needs=("events",)),
        Step("Write {ws}/out/triage.json with keys 'statuses' and 'p95'.",
             'kit.write_json("{ws}/out/triage.json", {"statuses": statuses, "p95": p95})',
             needs=("statuses", "p95")),
        Step("Check with the shell that the report is there.",
             "ls -l {ws}/out/triage.json", "stateless", "bash"),
    ),
    prepare=lambda ws, scale: {"log": data.write_events(_out(ws) / "events.log", scale, 3)},
    check=_check_triage,
)


# --- 4. sensor-drift: a narrower window rebinds the smoothed series ---------------------


def _check_drift(ws: Path, facts: dict[str, Any]) -> Verdict:
    readings = kit.read_readings(str(ws / "readings.csv"))

    def report(window: int) -> dict[str, Any]:
        drifts = kit.drift(kit.smooth(readings, window, quiet=True))
        return {"drift": drifts, "worst": max(drifts, key=lambda s: abs(drifts[s]))}

    return judge_file(ws, "out/drift.json", report(101), {"smoothed": report(9)})


DRIFT = Task(
    name="sensor-drift",
    title="Drift of eight sensors, smoothed",
    brief="Measure the drift of the sensors in {ws}/readings.csv into {ws}/out/drift.json.",
    builders={"readings": ((), 'readings = kit.load_readings("{ws}/readings.csv")'),
              "smoothed": (("readings",), "smoothed = kit.smooth(readings, 101)"),
              "drifts": (("smoothed",), "drifts = kit.drift(smoothed)")},
    steps=(
        Step("Look at the first lines of {ws}/readings.csv.",
             "head -4 {ws}/readings.csv", "stateless", "bash"),
        Step("Load the readings with kit.load_readings('{ws}/readings.csv') as `readings` "
             "(sensor -> values in time order) and keep them; print the sensors.",
             "print(sorted(readings))", needs=("readings",)),
        Step("Smooth every sensor with a moving median over 101 readings: `smoothed = "
             "kit.smooth(readings, 101)` (slow). Keep it.",
             "smoothed = kit.smooth(readings, 101)", needs=("readings",)),
        Step("Look at sensor s00's first five smoothed values, changing nothing.",
             'smoothed["s00"][:5]', "read_only", needs=("smoothed",)),
        Step("An attempt you will abandon: rebind `smoothed` with a narrower window of 9 "
             "(kit.smooth(readings, 9), slow) and look at its drift, to see if spikes show.",
             "smoothed = kit.smooth(readings, 9)\nkit.drift(smoothed)", "read_only",
             needs=("readings",)),
        Step("A one-off: how many readings per sensor does {ws}/readings.csv hold? "
             "(kit.read_readings reads it quickly.)",
             '{s: len(v) for s, v in kit.read_readings("{ws}/readings.csv").items()}',
             "stateless"),
        Step("The narrow window is abandoned. The drift per sensor of the 101-reading "
             "smoothing as `drifts` (kit.drift(smoothed)).",
             "drifts = kit.drift(smoothed)\ndrifts", needs=("smoothed",)),
        Step("The sensor with the largest absolute drift as `worst`.",
             "worst = max(drifts, key=lambda s: abs(drifts[s]))\nworst", needs=("drifts",)),
        Step("Write {ws}/out/drift.json with keys 'drift' (the drifts) and 'worst'.",
             'kit.write_json("{ws}/out/drift.json", {"drift": drifts, '
             '"worst": max(drifts, key=lambda s: abs(drifts[s]))})', needs=("drifts",)),
    ),
    prepare=lambda ws, scale: {"f": data.write_readings(_out(ws) / "readings.csv", scale, 4)},
    check=_check_drift,
)


# --- 5. warehouse-exports: a scratch OUTDIR left in the shell -------------------------------


def _check_exports(ws: Path, facts: dict[str, Any]) -> Verdict:
    orders = kit.read_orders(str(ws / "orders.csv"))
    qty: dict[str, int] = {}
    for o in orders:
        qty[o["warehouse"]] = qty.get(o["warehouse"], 0) + o["qty"]
    summary = judge_file(ws, "out/summary.json", {"qty": dict(sorted(qty.items()))}, {})
    missing = [n for n in ("counts.txt", "parts.tar.gz") if not (ws / "out" / n).is_file()]
    if not missing:
        return summary
    astray = [n for n in missing if (ws / "scratch" / n).is_file()]
    files = Verdict(False, ("OUTDIR",) if astray else (),
                    f"out/{', out/'.join(missing)} missing"
                    + (" (written into scratch/ by the left-over 'OUTDIR')" if astray else ""))
    return all_of(summary, files)


_PARTS = """import csv, os
os.makedirs("{ws}/out/parts", exist_ok=True)
for w in sorted({o["warehouse"] for o in orders}):
    with open(f"{ws}/out/parts/{w}.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["warehouse", "sku", "qty"])
        out.writerows([o["warehouse"], o["sku"], o["qty"]] for o in orders if o["warehouse"] == w)
sorted(os.listdir("{ws}/out/parts"))"""

EXPORTS = Task(
    name="warehouse-exports",
    title="Per-warehouse exports, counted and packed in the shell",
    brief="Export the orders in {ws}/orders.csv per warehouse into {ws}/out.",
    builders={"orders": ((), 'orders = kit.load_orders("{ws}/orders.csv")')},
    steps=(
        Step("In a shell session you keep, set OUTDIR={ws}/out and create that folder.",
             'OUTDIR={ws}/out; mkdir -p "$OUTDIR"', "stateful", "bash"),
        Step("Load the orders with kit.load_orders('{ws}/orders.csv') (slow: every row is "
             "checked) as `orders` and keep them.", 'print(len(orders), "orders")',
             needs=("orders",)),
        Step("Write one CSV per warehouse into {ws}/out/parts/ (columns warehouse, sku, qty).",
             _PARTS, needs=("orders",)),
        Step("A trial you will abandon, in the shell session: point OUTDIR at {ws}/scratch, "
             "create it and list it.", 'OUTDIR={ws}/scratch; mkdir -p "$OUTDIR"; ls -la "$OUTDIR"',
             "read_only", "bash"),
        Step("In the shell session: count the lines of every part file into $OUTDIR/counts.txt "
             "(OUTDIR defaults to {ws}/out).",
             ': "${OUTDIR:={ws}/out}"; wc -l {ws}/out/parts/*.csv > "$OUTDIR/counts.txt" && '
             'cat "$OUTDIR/counts.txt"', "stateful", "bash"),
        Step("Look at the three largest orders by amount, changing nothing.",
             'sorted(orders, key=lambda o: -o["amount"])[:3]', "read_only", needs=("orders",)),
        Step("A one-off: how much disk do the part files use? (du)",
             "du -sh {ws}/out/parts", "stateless", "bash"),
        Step("In the shell session: pack the part files into $OUTDIR/parts.tar.gz.",
             ': "${OUTDIR:={ws}/out}"; tar -czf "$OUTDIR/parts.tar.gz" -C {ws}/out parts && '
             'ls -l "$OUTDIR/parts.tar.gz"', "stateful", "bash"),
        Step("Write {ws}/out/summary.json with key 'qty': the total quantity per warehouse.",
             "qty = {}\nfor o in orders:\n    qty[o['warehouse']] = qty.get(o['warehouse'], 0) "
             "+ o['qty']\nkit.write_json('{ws}/out/summary.json', {'qty': dict(sorted(qty.items()))})",
             needs=("orders",)),
    ),
    prepare=lambda ws, scale: {"f": data.write_orders(_out(ws) / "orders.csv", scale, 5)},
    check=_check_exports,
)


# --- 6. pinned-totals: two stored functions, two pins that cannot meet ------------------

_TOTAL_V1 = ('import ledgerlib\n\n\ndef total_v1(xs):\n'
             '    """Total with ledgerlib 1.0 (plain numbers)."""\n'
             "    return ledgerlib.total(xs)\n")
_TOTAL_V2 = ('import ledgerlib\n\n\ndef total_v2(xs, currency):\n'
             '    """Total with ledgerlib 2.0 (carries a currency)."""\n'
             "    return ledgerlib.total(xs, currency=currency)\n")


def _check_pinned(ws: Path, facts: dict[str, Any]) -> Verdict:
    series = list(kit.monthly(kit.read_ledger(str(ws / "ledger.csv"))).values())
    right = {"old_total": round(sum(series), 2), "new_total": f"{sum(series):.2f} USD",
             "versions": ["1.0", "2.0"]}
    return judge_file(ws, "out/pinned.json", right,
                      {"currency": dict(right, new_total=f"{sum(series):.2f} EUR")})


PINNED = Task(
    name="pinned-totals",
    title="Old and new ledgerlib side by side, through stored functions",
    brief="Total the ledger {ws}/ledger.csv with both versions of ledgerlib into "
          "{ws}/out/pinned.json. Environment {venv:v1} has ledgerlib 1.0, environment "
          "{venv:v2} has ledgerlib 2.0; the stored functions total_v1 and total_v2 run in "
          "them.",
    builders={**_LEDGER,
              "series": (("ledger",), "series = list(kit.monthly(ledger).values())"),
              "currency": ((), 'currency = "USD"')},
    environments={"v1": "ledgerlib @ {wheels}/ledgerlib-1.0-py3-none-any.whl",
                  "v2": "ledgerlib @ {wheels}/ledgerlib-2.0-py3-none-any.whl"},
    functions=((_TOTAL_V1, "v1"), (_TOTAL_V2, "v2")),
    steps=(
        Step(f"Load the ledger with kit.load_ledger('{{ws}}/ledger.csv') {_LOAD} as `ledger` "
             "and keep it.", 'print(len(ledger), "rows")', needs=("ledger",)),
        Step("The monthly totals as a plain list of numbers in month order, `series` "
             "(list(kit.monthly(ledger).values())).",
             "series = list(kit.monthly(ledger).values())\nseries", needs=("ledger",)),
        Step("In environment {venv:v1}, check which ledgerlib it has (ledgerlib.VERSION).",
             "import ledgerlib\nledgerlib.VERSION", "stateless", env="v1"),
        Step("In environment {venv:v2}, check which ledgerlib it has.",
             "import ledgerlib\nledgerlib.VERSION", "stateless", env="v2"),
        Step("Total `series` with the stored function total_v1 (ledgerlib 1.0) as "
             "`old_total` (functions.total_v1(series)).",
             "old_total = functions.total_v1(series)\nold_total", needs=("series",)),
        Step("Reports carry a currency: set `currency = 'USD'`.", 'currency = "USD"'),
        Step("Look at how the total would read in EUR: set currency = 'EUR' and format "
             "f'{sum(series):.2f} {currency}'. Only a look: the report stays in USD.",
             'currency = "EUR"\nf"{sum(series):.2f} {currency}"', "read_only",
             needs=("series",)),
        Step("Total `series` with total_v2 (ledgerlib 2.0) in the report's currency as "
             "`new_total` (functions.total_v2(series, currency)).",
             "new_total = functions.total_v2(series, currency)\nnew_total",
             needs=("series", "currency")),
        Step("Write {ws}/out/pinned.json with keys 'old_total', 'new_total' and 'versions' "
             "(['1.0', '2.0']).",
             'kit.write_json("{ws}/out/pinned.json", {"old_total": functions.total_v1(series), '
             '"new_total": functions.total_v2(series, currency), "versions": ["1.0", "2.0"]})',
             needs=("series", "currency")),
    ),
    prepare=lambda ws, scale: _prepare_ledger(ws, scale, 6),
    check=_check_pinned,
)


# --- 7. corpus-terms: a stemmed index left behind -----------------------------------------


def _check_terms(ws: Path, facts: dict[str, Any]) -> Verdict:
    docs = kit.read_corpus(str(ws / "docs"))

    def report(stem: bool) -> dict[str, Any]:
        index = kit.index_corpus(docs, stem, quiet=True)
        return {"top": kit.top_terms(index, 20), "vocabulary": len(index)}

    return judge_file(ws, "out/terms.json", report(False), {"index": report(True)})


TERMS = Task(
    name="corpus-terms",
    title="The commonest terms of a document folder",
    brief="Index the documents in {ws}/docs and write {ws}/out/terms.json.",
    builders={"docs": ((), 'docs = kit.read_corpus("{ws}/docs")'),
              "index": (("docs",), "index = kit.index_corpus(docs)")},
    steps=(
        Step("List the first documents in {ws}/docs and count them.",
             "ls {ws}/docs | head -3; ls {ws}/docs | wc -l", "stateless", "bash"),
        Step("Read the documents with kit.read_corpus('{ws}/docs') as `docs` and keep them.",
             'docs = kit.read_corpus("{ws}/docs")\nlen(docs)'),
        Step("Build the inverted index with kit.index_corpus(docs) (slow) as `index`; keep it.",
             "index = kit.index_corpus(docs)\nlen(index)", needs=("docs",)),
        Step("Look: in how many documents does 'ledger' appear? Change nothing.",
             'len(index.get("ledger", {}))', "read_only", needs=("index",)),
        Step("An attempt you will abandon: rebind `index` to a stemmed index "
             "(kit.index_corpus(docs, stem=True), slow) and look at its ten top terms.",
             "index = kit.index_corpus(docs, stem=True)\nkit.top_terms(index, 10)", "read_only",
             needs=("docs",)),
        Step("A one-off: how many documents mention 'coordinate'? Use grep.",
             "grep -l coordinate {ws}/docs/*.txt | wc -l", "stateless", "bash"),
        Step("Stemming is abandoned. The twenty top terms of the plain index as `top` "
             "(kit.top_terms(index, 20)).", "top = kit.top_terms(index, 20)\ntop",
             needs=("index",)),
        Step("The vocabulary size (terms in the index) as `vocabulary`.",
             "vocabulary = len(index)\nvocabulary", needs=("index",)),
        Step("Write {ws}/out/terms.json with keys 'top' and 'vocabulary'.",
             'kit.write_json("{ws}/out/terms.json", {"top": kit.top_terms(index, 20), '
             '"vocabulary": len(index)})', needs=("index",)),
    ),
    prepare=lambda ws, scale: {"f": data.write_corpus(_out(ws) / "docs", scale, 7)},
    check=_check_terms,
)


# --- 8. cohort-retention: weekly cohorts left behind --------------------------------------


def _check_retention(ws: Path, facts: dict[str, Any]) -> Verdict:
    orders = kit.read_orders(str(ws / "orders.csv"))

    def report(by: str) -> dict[str, Any]:
        table = kit.cohorts(orders, by, quiet=True)
        return {"retention": kit.retention(table), "sizes": {k: v[k] for k, v in table.items()}}

    return judge_file(ws, "out/retention.json", report("month"), {"table": report("week")})


RETENTION = Task(
    name="cohort-retention",
    title="Monthly cohorts of customers and how many stay",
    brief="Compute customer retention from {ws}/orders.csv into {ws}/out/retention.json.",
    builders={"orders": ((), 'orders = kit.load_orders("{ws}/orders.csv")'),
              "table": (("orders",), "table = kit.cohorts(orders)")},
    steps=(
        Step("Look at the first lines of {ws}/orders.csv.", "head -3 {ws}/orders.csv",
             "stateless", "bash"),
        Step("Load the orders with kit.load_orders('{ws}/orders.csv') (slow) as `orders`; "
             "keep them.", 'print(len(orders), "orders")', needs=("orders",)),
        Step("Monthly cohorts with kit.cohorts(orders) (slow) as `table`; keep it.",
             "table = kit.cohorts(orders)\nsorted(table)", needs=("orders",)),
        Step("Look at the first cohort's row, changing nothing.",
             "table[min(table)]", "read_only", needs=("table",)),
        Step("An attempt you will abandon: rebind `table` to weekly cohorts "
             "(kit.cohorts(orders, by='week'), slow) and look at how many cohorts that makes.",
             'table = kit.cohorts(orders, by="week")\nlen(table)', "read_only",
             needs=("orders",)),
        Step("A one-off: how many distinct customers does {ws}/orders.csv hold? "
             "(kit.read_orders reads it quickly.)",
             'len({o["customer"] for o in kit.read_orders("{ws}/orders.csv")})', "stateless"),
        Step("Weekly cohorts are abandoned. Retention per monthly cohort as `kept` "
             "(kit.retention(table)).", "kept = kit.retention(table)\nkept", needs=("table",)),
        Step("Each cohort's size (its first period's count) as `sizes`.",
             "sizes = {k: v[k] for k, v in table.items()}\nsizes", needs=("table",)),
        Step("Write {ws}/out/retention.json with keys 'retention' and 'sizes'.",
             'kit.write_json("{ws}/out/retention.json", {"retention": kit.retention(table), '
             '"sizes": {k: v[k] for k, v in table.items()}})', needs=("table",)),
    ),
    prepare=lambda ws, scale: {"f": data.write_orders(_out(ws) / "orders.csv", scale, 8)},
    check=_check_retention,
)


# --- 9. trend-forecast: a fit without outliers left behind ------------------------------

_ROUNDS = 8000
_CLEAN = "[p for p in prices if p <= 3 * statistics.median(prices)]"


def _check_forecast(ws: Path, facts: dict[str, Any]) -> Verdict:
    with (ws / "prices.csv").open(newline="") as file:
        prices = [float(r["price"]) for r in csv.DictReader(file)]
    clean = [p for p in prices if p <= 3 * statistics.median(prices)]

    def report(values: list[float]) -> dict[str, Any]:
        trend = kit.fit_trend(values, _ROUNDS, quiet=True)
        return {"trend": trend, "ahead": kit.forecast(trend, len(prices), 30)}

    return judge_file(ws, "out/forecast.json", report(prices), {"trend": report(clean)})


FORECAST = Task(
    name="trend-forecast",
    title="A price trend and thirty days ahead",
    brief="Fit a trend to {ws}/prices.csv and forecast into {ws}/out/forecast.json.",
    builders={"prices": ((), 'prices = [float(r["price"]) for r in kit.read_csv("{ws}/prices.csv")]'),
              "trend": (("prices",), f"trend = kit.fit_trend(prices, {_ROUNDS})")},
    steps=(
        Step("Look at {ws}/prices.csv's first lines and count them.",
             "head -3 {ws}/prices.csv; wc -l {ws}/prices.csv", "stateless", "bash"),
        Step("Read the prices (column 'price', in day order; kit.read_csv reads a CSV file) "
             "into a list of numbers `prices`; keep it.",
             "len(prices)", needs=("prices",)),
        Step(f"Fit a trend to all prices with kit.fit_trend(prices, {_ROUNDS}) (slow) as "
             "`trend` ([slope, intercept]); keep it.",
             f"trend = kit.fit_trend(prices, {_ROUNDS})\ntrend", needs=("prices",)),
        Step("Look at the slope per day, changing nothing.", "trend[0]", "read_only",
             needs=("trend",)),
        Step("An attempt you will abandon: drop prices above three times the median, rebind "
             f"`trend` to a fit of what is left (kit.fit_trend(clean, {_ROUNDS}), slow) and "
             "look at it.",
             f"import statistics\nclean = {_CLEAN}\ntrend = kit.fit_trend(clean, {_ROUNDS})\ntrend",
             "read_only", needs=("prices",)),
        Step("A one-off: the highest price in the file, with sort in the shell.",
             "tail -n +2 {ws}/prices.csv | cut -d, -f2 | sort -g | tail -1", "stateless", "bash"),
        Step("The outlier fit is abandoned. Forecast 30 days past the data from the fit of "
             "all prices as `ahead` (kit.forecast(trend, len(prices), 30)).",
             "ahead = kit.forecast(trend, len(prices), 30)\nahead[:3]",
             needs=("prices", "trend")),
        Step("Look at the forecast's first week, changing nothing.",
             "kit.forecast(trend, len(prices), 7)", "read_only", needs=("prices", "trend")),
        Step("Write {ws}/out/forecast.json with keys 'trend' and 'ahead'.",
             'kit.write_json("{ws}/out/forecast.json", {"trend": trend, '
             '"ahead": kit.forecast(trend, len(prices), 30)})', needs=("prices", "trend")),
    ),
    prepare=lambda ws, scale: {"f": data.write_prices(_out(ws) / "prices.csv", scale, 9)},
    check=_check_forecast,
)


# --- 10. log-rotation: a trial KEEP left in the shell -------------------------------------


def _errors_by_day(folder: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in sorted(folder.iterdir()):
        opener: Any = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as file:
            counts[path.name.split(".")[0][4:]] = sum(" ERROR " in line for line in file)
    return counts


def _check_rotation(ws: Path, facts: dict[str, Any]) -> Verdict:
    names = sorted(p.name for p in (ws / "logs").iterdir())
    plain = [n for n in names if n.endswith(".log")]
    days = facts["days"]
    expected = {"errors": facts["errors"], "plain": days[-7:]}
    return judge_file(ws, "out/rotation.json", expected,
                      {"KEEP": dict(expected, plain=days[-3:])}) if plain else \
        Verdict(False, (), "no plain logs are left")


_COUNT_ERRORS = """import gzip, os
errors = {}
for name in sorted(os.listdir("{ws}/logs")):
    opener = gzip.open if name.endswith(".gz") else open
    with opener(os.path.join("{ws}/logs", name), "rt") as f:
        errors[name.split(".")[0][4:]] = sum(" ERROR " in line for line in f)"""


def _prepare_rotation(ws: Path, scale: float) -> dict[str, Any]:
    folder = data.write_logs(_out(ws) / "logs", scale, 10)
    names = sorted(p.name for p in folder.iterdir())
    return {"days": names, "errors": _errors_by_day(folder)}


ROTATION = Task(
    name="log-rotation",
    title="Rotate a month of logs in the shell, keep the error counts",
    brief="Rotate the logs in {ws}/logs (keep the newest 7 plain, gzip the rest) and write "
          "{ws}/out/rotation.json.",
    builders={"errors": ((), _COUNT_ERRORS)},
    steps=(
        Step("List {ws}/logs and count the files.", "ls {ws}/logs | head -3; ls {ws}/logs | wc -l",
             "stateless", "bash"),
        Step("In a shell session you keep: go to {ws}/logs and set KEEP=7 (the newest logs "
             "that stay uncompressed).", "cd {ws}/logs && KEEP=7 && pwd", "stateful", "bash"),
        Step("Look at how many log lines there are in all, changing nothing.",
             "cat {ws}/logs/*.log | wc -l", "read_only", "bash"),
        Step("A trial you will abandon, in the shell session: set KEEP=3 and see how much "
             "compressing all but the newest KEEP logs would free. The policy stays 7.",
             'KEEP=3; ls -1 {ws}/logs/app-*.log | sort | head -n -"$KEEP" | xargs du -ch | tail -1',
             "read_only", "bash"),
        Step("In the shell session: gzip every log but the newest KEEP (KEEP defaults to 7).",
             ': "${KEEP:=7}"; ls -1 {ws}/logs/app-*.log | sort | head -n -"$KEEP" | '
             "xargs -r gzip -f; ls {ws}/logs | tail -3", "stateful", "bash"),
        Step("Count the ERROR lines of each day, plain and gzipped logs alike, as `errors` "
             "(day YYYYMMDD -> count).", _COUNT_ERRORS + "\nlen(errors)"),
        Step("A one-off: how many logs are gzipped now? (shell)",
             "ls {ws}/logs | grep -c '\\.gz$'", "stateless", "bash"),
        Step("Write {ws}/out/rotation.json with keys 'errors' and 'plain' (the names of the "
             "logs left uncompressed, sorted).",
             'import os\nkit.write_json("{ws}/out/rotation.json", {"errors": errors, "plain": '
             'sorted(n for n in os.listdir("{ws}/logs") if n.endswith(".log"))})',
             needs=("errors",)),
        Step("Check with the shell that the report exists.",
             "test -s {ws}/out/rotation.json && echo ok", "stateless", "bash"),
    ),
    prepare=_prepare_rotation,
    check=_check_rotation,
)


# --- 11. contact-dedupe: a looser threshold left behind -----------------------------------


def _check_people(ws: Path, facts: dict[str, Any]) -> Verdict:
    contacts = kit.read_contacts(str(ws / "contacts.csv"))

    def report(threshold: float) -> dict[str, Any]:
        people = kit.dedupe(contacts, threshold, quiet=True)
        return {"people": people, "duplicates": len(contacts) - people}

    return judge_file(ws, "out/people.json", report(0.85), {"threshold": report(0.6)})


PEOPLE = Task(
    name="contact-dedupe",
    title="How many people are behind a contact list",
    brief="Count the distinct people in {ws}/contacts.csv into {ws}/out/people.json.",
    builders={"contacts": ((), 'contacts = kit.load_contacts("{ws}/contacts.csv")'),
              "threshold": ((), "threshold = 0.85"),
              "people": (("contacts", "threshold"), "people = kit.dedupe(contacts, threshold)")},
    steps=(
        Step("Look at the first lines of {ws}/contacts.csv.", "head -4 {ws}/contacts.csv",
             "stateless", "bash"),
        Step("Load the contacts with kit.load_contacts('{ws}/contacts.csv') (slow) as "
             "`contacts`; keep them.", 'print(len(contacts), "contacts")', needs=("contacts",)),
        Step("Names match at a threshold of 0.85: set `threshold = 0.85`.", "threshold = 0.85"),
        Step("Look at the five cities with most contacts, changing nothing.",
             'import collections\ncollections.Counter(c["city"] for c in contacts).most_common(5)',
             "read_only", needs=("contacts",)),
        Step("An attempt you will abandon: set threshold = 0.6 and see how many people "
             "kit.dedupe(contacts, threshold) (slow) finds with it.",
             "threshold = 0.6\nkit.dedupe(contacts, threshold)", "read_only",
             needs=("contacts",)),
        Step("A one-off: how many distinct cities does the file name? (shell)",
             "tail -n +2 {ws}/contacts.csv | cut -d, -f2 | sort -u | wc -l", "stateless", "bash"),
        Step("The loose threshold is abandoned. Count the distinct people with the task's "
             "threshold as `people` (kit.dedupe(contacts, threshold), slow).",
             "people = kit.dedupe(contacts, threshold)\npeople", needs=("contacts", "threshold")),
        Step("How many contacts are duplicates, as `duplicates`.",
             "duplicates = len(contacts) - people\nduplicates", needs=("contacts", "people")),
        Step("Write {ws}/out/people.json with keys 'people' and 'duplicates'.",
             'kit.write_json("{ws}/out/people.json", {"people": people, '
             '"duplicates": len(contacts) - people})', needs=("contacts", "people")),
    ),
    prepare=lambda ws, scale: {"f": data.write_contacts(_out(ws) / "contacts.csv", scale, 11)},
    check=_check_people,
)


# --- 12. budget-variance: amounts rounded in place -----------------------------------------


def _check_variance(ws: Path, facts: dict[str, Any]) -> Verdict:
    rows = kit.read_ledger(str(ws / "ledger.csv"))
    with (ws / "budget.csv").open(newline="") as file:
        budget = {r["account"]: float(r["budget"]) for r in csv.DictReader(file)}

    def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
        actual = kit.totals_by(rows, "account")
        return {"actual": actual,
                "variance": {a: round(actual[a] - budget[a], 2) for a in sorted(budget)}}

    rounded = [dict(r, amount=round(r["amount"])) for r in rows]
    return judge_file(ws, "out/variance.json", report(rows), {"ledger": report(rounded)})


def _prepare_variance(ws: Path, scale: float) -> dict[str, Any]:
    data.write_budget(_out(ws) / "budget.csv", 12)
    return _prepare_ledger(ws, scale, 12)


VARIANCE = Task(
    name="budget-variance",
    title="Actual spending against the budget, per account",
    brief="Compare the ledger {ws}/ledger.csv with the budget {ws}/budget.csv into "
          "{ws}/out/variance.json.",
    builders={**_LEDGER,
              "budget": ((), 'budget = {r["account"]: float(r["budget"]) for r in '
                             'kit.read_csv("{ws}/budget.csv")}'),
              "actual": (("ledger",), 'actual = kit.totals_by(ledger, "account")'),
              "variance": (("actual", "budget"),
                           "variance = {a: round(actual[a] - budget[a], 2) for a in sorted(budget)}")},
    steps=(
        Step("Show {ws}/budget.csv.", "cat {ws}/budget.csv", "stateless", "bash"),
        Step(f"Load the ledger with kit.load_ledger('{{ws}}/ledger.csv') {_LOAD} as `ledger`; "
             "keep it.", 'print(len(ledger), "rows")', needs=("ledger",)),
        Step("Read the budget into `budget` (account -> amount as a number; kit.read_csv "
             "reads a CSV file); keep it.",
             "budget", needs=("budget",)),
        Step("An attempt you will abandon: round every amount of `ledger` to whole units in "
             "place (row['amount'] = round(row['amount'])) and see how much the total moves.",
             'before = sum(r["amount"] for r in ledger)\nfor r in ledger:\n'
             '    r["amount"] = round(r["amount"])\nround(sum(r["amount"] for r in ledger) - before, 2)',
             "read_only", needs=("ledger",)),
        Step("A one-off: how many accounts does {ws}/budget.csv have? (shell)",
             "tail -n +2 {ws}/budget.csv | wc -l", "stateless", "bash"),
        Step("Rounding is abandoned. Actual spending per account as `actual` "
             "(kit.totals_by(ledger, 'account')).",
             'actual = kit.totals_by(ledger, "account")\nactual', needs=("ledger",)),
        Step("The variance per account (actual minus budget, rounded to cents) as `variance`.",
             "variance = {a: round(actual[a] - budget[a], 2) for a in sorted(budget)}\nvariance",
             needs=("actual", "budget")),
        Step("Look at which accounts are over budget, changing nothing.",
             "[a for a, v in variance.items() if v > 0]", "read_only", needs=("variance",)),
        Step("Write {ws}/out/variance.json with keys 'actual' and 'variance'.",
             'kit.write_json("{ws}/out/variance.json", {"actual": actual, "variance": variance})',
             needs=("actual", "variance")),
    ),
    prepare=_prepare_variance,
    check=_check_variance,
)


TASKS: tuple[Task, ...] = (AUDIT, FX, TRIAGE, DRIFT, EXPORTS, PINNED, TERMS, RETENTION,
                           FORECAST, ROTATION, PEOPLE, VARIANCE)
SUITES: dict[str, tuple[Task, ...]] = {"default": TASKS, "hard": HARD}
BY_NAME = {task.name: task for suite in SUITES.values() for task in suite}
