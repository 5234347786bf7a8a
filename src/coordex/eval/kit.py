"""The helpers the eval's tasks use from inside sessions: ``from coordex.eval import kit``.

Standard library only, so it imports in any session of the agent's own interpreter.
Every function marked *expensive* does real work on the task's generated data (hashing
each ledger row to check it, parsing every log line, a moving median, an inverted
index, a gradient-descent fit, pairwise name comparison) and prints one line when it
ends::

    [kit] load_ledger(ledger.csv) 1.234s

That line is how the eval measures redone work: the same key run twice in one task is
work done again, whatever coordinates the agent chose (it shows in read-only copies
and stateless calls alike, since it travels in the call's own output).

The cheap ``read_*`` functions return the same values without the work or the line;
the checkers use them.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import hashlib
import json
import os
import re
import time
import unicodedata
from collections.abc import Iterator
from typing import Any

MARK = "[kit]"
MARK_LINE = re.compile(r"^\[kit\] (\S+) ([0-9.]+)s$", re.MULTILINE)

# Checksum rounds per row: about 1.5 s per 60 000 ledger rows on one core (scale 1).
CHECK_ROUNDS = 64


@contextlib.contextmanager
def _work(key: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    print(f"{MARK} {key} {time.perf_counter() - started:.3f}s", flush=True)


def _name(path: str) -> str:
    return os.path.basename(os.path.normpath(str(path)))


def write_json(path: str, value: Any) -> str:
    """Write ``value`` as JSON (sorted keys, folders made); returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(value, file, indent=1, sort_keys=True)
    return path


def read_csv(path: str) -> list[dict[str, str]]:
    """The rows of a CSV file with a header line, as dicts of text."""
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as file:
        return json.load(file)


# --- ledger ----------------------------------------------------------------------------


def row_check(row_id: str, amount: str) -> str:
    digest = f"{row_id}|{amount}".encode()
    for _ in range(CHECK_ROUNDS):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:12]


def read_ledger(path: str) -> list[dict[str, Any]]:
    """Rows ``{id, date, account, category, amount}`` (cheap: no checks)."""
    with open(path, newline="", encoding="utf-8") as file:
        return [{"id": r["id"], "date": r["date"], "account": r["account"],
                 "category": r["category"], "amount": float(r["amount"])}
                for r in csv.DictReader(file)]


def load_ledger(path: str) -> list[dict[str, Any]]:
    """*Expensive.* The ledger's rows, each checked against its checksum column."""
    with _work(f"load_ledger({_name(path)})"), open(path, newline="", encoding="utf-8") as file:
        rows = []
        for r in csv.DictReader(file):
            if row_check(r["id"], r["amount"]) != r["check"]:
                raise ValueError(f"row {r['id']} fails its checksum")
            rows.append({"id": r["id"], "date": r["date"], "account": r["account"],
                         "category": r["category"], "amount": float(r["amount"])})
        return rows


def totals_by(rows: list[dict[str, Any]], field: str) -> dict[str, float]:
    """Sum of ``amount`` per value of ``field``, rounded to cents."""
    totals: dict[str, float] = {}
    for row in rows:
        totals[row[field]] = totals.get(row[field], 0.0) + row["amount"]
    return {k: round(v, 2) for k, v in sorted(totals.items())}


def monthly(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Sum of ``amount`` per month ``YYYY-MM``."""
    return totals_by([dict(r, month=r["date"][:7]) for r in rows], "month")


# --- web events ------------------------------------------------------------------------

_EVENT = re.compile(r"^(\S+) (\S+) (GET|POST|PUT|DELETE) (\S+) (\d{3}) (\d+) (\d+)$")


def _event(line: str, anonymise: bool) -> dict[str, Any]:
    m = _EVENT.match(line)
    if m is None:
        raise ValueError(f"not an event line: {line[:80]!r}")
    ip = m.group(2)
    if anonymise:  # the client's address is kept only as a salted digest
        digest = ip.encode()
        for _ in range(CHECK_ROUNDS // 2):
            digest = hashlib.sha256(b"salt" + digest).digest()
        ip = digest.hex()[:10]
    return {"at": m.group(1), "client": ip, "method": m.group(3), "path": m.group(4),
            "status": int(m.group(5)), "bytes": int(m.group(6)), "ms": int(m.group(7))}


def read_events(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as file:
        return [_event(line.rstrip("\n"), False) for line in file if line.strip()]


def load_events(path: str) -> list[dict[str, Any]]:
    """*Expensive.* Parsed access-log events, client addresses anonymised."""
    with _work(f"load_events({_name(path)})"), open(path, encoding="utf-8") as file:
        return [_event(line.rstrip("\n"), True) for line in file if line.strip()]


def status_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        counts[str(e["status"])] = counts.get(str(e["status"]), 0) + 1
    return dict(sorted(counts.items()))


def p95_by_path(events: list[dict[str, Any]]) -> dict[str, int]:
    """95th percentile of ``ms`` per path."""
    by: dict[str, list[int]] = {}
    for e in events:
        by.setdefault(e["path"], []).append(e["ms"])
    return {p: sorted(v)[int(0.95 * (len(v) - 1))] for p, v in sorted(by.items())}


# --- sensor readings -------------------------------------------------------------------


def read_readings(path: str) -> dict[str, list[float]]:
    """Values per sensor, in time order."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="", encoding="utf-8") as file:
        for r in csv.DictReader(file):
            series.setdefault(r["sensor"], []).append((int(r["ts"]), float(r["value"])))
    return {s: [v for _, v in sorted(points)] for s, points in sorted(series.items())}


def load_readings(path: str) -> dict[str, list[float]]:
    """*Expensive* (parsing and ordering every reading)."""
    with _work(f"load_readings({_name(path)})"):
        return read_readings(path)


def smooth(series: dict[str, list[float]], window: int, *, quiet: bool = False) -> dict[str, list[float]]:
    """*Expensive.* Moving median of each sensor's values over ``window`` readings."""
    def run() -> dict[str, list[float]]:
        out = {}
        for sensor, values in series.items():
            half = window // 2
            out[sensor] = [sorted(values[max(0, i - half): i + half + 1])[
                len(values[max(0, i - half): i + half + 1]) // 2] for i in range(len(values))]
        return out
    if quiet:
        return run()
    with _work(f"smooth(window={window})"):
        return run()


def drift(smoothed: dict[str, list[float]]) -> dict[str, float]:
    """Last smoothed value minus the first, per sensor."""
    return {s: round(v[-1] - v[0], 3) for s, v in smoothed.items()}


# --- text corpus -----------------------------------------------------------------------


def read_corpus(folder: str) -> dict[str, str]:
    """Each ``*.txt`` document of ``folder``: name -> text."""
    docs = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".txt"):
            with open(os.path.join(folder, name), encoding="utf-8") as file:
                docs[name] = file.read()
    return docs


def _stem(word: str) -> str:
    for suffix in ("ing", "ers", "er", "es", "s", "ed"):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            return word[: -len(suffix)]
    return word


def index_corpus(docs: dict[str, str], stem: bool = False, *,
                 quiet: bool = False) -> dict[str, dict[str, int]]:
    """*Expensive.* Inverted index: term -> {document: count}; ``stem`` folds suffixes."""
    def run() -> dict[str, dict[str, int]]:
        index: dict[str, dict[str, int]] = {}
        for name, text in docs.items():
            for raw in re.findall(r"[a-z]+", unicodedata.normalize("NFKD", text).lower()):
                term = _stem(raw) if stem else raw
                postings = index.setdefault(term, {})
                postings[name] = postings.get(name, 0) + 1
        return index
    if quiet:
        return run()
    with _work(f"index_corpus(stem={stem})"):
        return run()


def top_terms(index: dict[str, dict[str, int]], k: int) -> list[list[Any]]:
    """The ``k`` terms found in most documents: ``[[term, documents], ...]``."""
    ranked = sorted(index.items(), key=lambda item: (-len(item[1]), item[0]))
    return [[term, len(postings)] for term, postings in ranked[:k]]


# --- orders and cohorts ----------------------------------------------------------------


def read_orders(path: str) -> list[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as file:
        return [{"customer": r["customer"], "date": r["date"], "warehouse": r["warehouse"],
                 "sku": r["sku"], "qty": int(r["qty"]), "amount": float(r["amount"])}
                for r in csv.DictReader(file)]


def load_orders(path: str) -> list[dict[str, Any]]:
    """*Expensive* (orders parsed, each row's amount checked against qty x price)."""
    with _work(f"load_orders({_name(path)})"):
        rows = read_orders(path)
        for row in rows:  # the same checksum work as the ledger's
            row_check(row["customer"] + row["date"], f"{row['amount']:.2f}")
        return rows


def cohorts(orders: list[dict[str, Any]], by: str = "month", *,
            quiet: bool = False) -> dict[str, dict[str, int]]:
    """*Expensive.* Customers first seen in each period, and how many of them ordered in
    each later period: ``{first_period: {period: customers}}``."""
    def period(date: str) -> str:
        if by == "month":
            return date[:7]
        day = int(date[8:10])
        return f"{date[:7]}-w{min(4, 1 + (day - 1) // 7)}"

    def run() -> dict[str, dict[str, int]]:
        first: dict[str, str] = {}
        active: dict[str, set[str]] = {}
        for o in sorted(orders, key=lambda o: (o["date"], o["customer"])):
            p = period(o["date"])
            first.setdefault(o["customer"], p)
            active.setdefault(p, set()).add(o["customer"])
        table: dict[str, dict[str, int]] = {}
        for start in sorted(set(first.values())):
            members = {c for c, p in first.items() if p == start}
            table[start] = {p: len(members & seen) for p, seen in sorted(active.items())
                            if p >= start}
        return table
    if quiet:
        return run()
    with _work(f"cohorts(by={by})"):
        return run()


def retention(table: dict[str, dict[str, int]]) -> dict[str, float]:
    """Share of each cohort still ordering in its last period."""
    out = {}
    for start, counts in table.items():
        periods = sorted(counts)
        out[start] = round(counts[periods[-1]] / counts[start], 4) if counts[start] else 0.0
    return out


# --- trend fit -------------------------------------------------------------------------


def fit_trend(values: list[float], rounds: int = 20000, *, quiet: bool = False) -> list[float]:
    """*Expensive.* ``[slope, intercept]`` of a least-squares line, by gradient descent
    over ``rounds`` passes (values scaled to their mean first)."""
    def run() -> list[float]:
        n = len(values)
        scale = (sum(abs(v) for v in values) / n) or 1.0
        ys = [v / scale for v in values]
        xs = [i / max(1, n - 1) for i in range(n)]
        a = b = 0.0
        rate = 0.5
        for _ in range(rounds):
            ga = gb = 0.0
            for x, y in zip(xs, ys, strict=True):
                err = a * x + b - y
                ga += err * x
                gb += err
            a -= rate * ga / n
            b -= rate * gb / n
        return [round(a * scale / max(1, n - 1), 4), round(b * scale, 4)]
    if quiet:
        return run()
    with _work(f"fit_trend(n={len(values)})"):
        return run()


def forecast(trend: list[float], n: int, steps: int) -> list[float]:
    slope, intercept = trend
    return [round(intercept + slope * (n + k), 2) for k in range(steps)]


# --- contacts --------------------------------------------------------------------------


def _key(name: str) -> str:
    plain = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    return re.sub(r"[^a-z]", "", plain)


def read_contacts(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as file:
        return [dict(r, key=_key(r["name"])) for r in csv.DictReader(file)]


def load_contacts(path: str) -> list[dict[str, str]]:
    """*Expensive* (every name normalised and checked)."""
    with _work(f"load_contacts({_name(path)})"):
        rows = read_contacts(path)
        for row in rows:
            row_check(row["key"], row["email"])
        return rows


def dedupe(contacts: list[dict[str, str]], threshold: float, *, quiet: bool = False) -> int:
    """*Expensive.* How many distinct people: contacts in one city whose names match at
    ``threshold`` or above (difflib's ratio) are one person."""
    def run() -> int:
        people = 0
        by_city: dict[str, list[str]] = {}
        for c in contacts:
            by_city.setdefault(c["city"], []).append(c["key"])
        for keys in by_city.values():
            seen: list[str] = []
            for key in keys:
                if not any(difflib.SequenceMatcher(None, key, other).ratio() >= threshold
                           for other in seen):
                    seen.append(key)
            people += len(seen)
        return people
    if quiet:
        return run()
    with _work(f"dedupe(threshold={threshold})"):
        return run()


# --- blocks (the hard suite) --------------------------------------------------------------
#
# State a copy or a pickle cannot carry cheaply: ``blocks`` is one bytearray of 1 GiB at
# scale 1; ``open_db`` an SQLite connection and ``batches`` a generator over it, which
# cannot be pickled at all.

BLOCK = 1 << 16  # bytes per block; one reading per block


def _seed_file(path: str) -> tuple[int, int]:
    with open(path, encoding="utf-8") as file:
        seed, size = file.read().split()
    return int(seed), int(size)


def read_blocks(path: str) -> bytearray:
    """The bytes a ``blocks.seed`` file describes (cheap: no checks)."""
    seed, size = _seed_file(path)
    import random

    # One random MiB repeated, and each block's first four bytes (its reading) its own.
    rng, chunk = random.Random(seed), 1 << 20
    pattern = rng.randbytes(chunk)
    blocks = bytearray(size)
    for start in range(0, size, chunk):
        blocks[start:start + chunk] = pattern[:size - start]
    for start in range(0, size, BLOCK):
        blocks[start:start + 4] = rng.randbytes(4)
    return blocks


def load_blocks(path: str) -> bytearray:
    """*Expensive.* The blocks a ``blocks.seed`` file describes, every 64 KiB block
    verified by its SHA-256 (1 GiB at scale 1)."""
    with _work(f"load_blocks({_name(path)})"):
        blocks = read_blocks(path)
        view = memoryview(blocks)
        for start in range(0, len(blocks), BLOCK):
            hashlib.sha256(view[start:start + BLOCK]).digest()
        view.release()
        return blocks


def readings(blocks: bytearray) -> list[list[int]]:
    """``[block, value]`` per block: the block's first four bytes as an unsigned int."""
    return [[n, int.from_bytes(blocks[start:start + 4], "big")]
            for n, start in enumerate(range(0, len(blocks), BLOCK))]


def open_db(blocks: bytearray) -> Any:
    """An SQLite database in memory with a table ``readings(block, value)`` of
    ``blocks`` (a connection: it cannot be pickled)."""
    import sqlite3

    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.execute("CREATE TABLE readings (block INTEGER PRIMARY KEY, value INTEGER)")
    db.executemany("INSERT INTO readings VALUES (?, ?)", readings(blocks))
    db.commit()
    return db


def batch_size(count: int) -> int:
    """Rows per batch of :func:`batches` over a table of ``count`` rows."""
    return max(1, count // 8)


def batches(db: Any) -> Iterator[list[list[int]]]:
    """A generator of the readings in batches of an eighth of the table (as it was when
    the generator was made), in block order, read from ``db`` as it is at each ``next``."""
    size = batch_size(db.execute("SELECT count(*) FROM readings").fetchone()[0])

    def stream() -> Iterator[list[list[int]]]:
        offset = 0
        while True:
            rows = db.execute("SELECT block, value FROM readings ORDER BY block LIMIT ? OFFSET ?",
                              (size, offset)).fetchall()
            if not rows:
                return
            offset += len(rows)
            yield [list(r) for r in rows]

    return stream()


def summarise(rows: list[list[int]]) -> dict[str, Any]:
    """``{"n", "total", "top"}`` of ``[block, value]`` rows (``top`` None when empty)."""
    values = [v for _, v in rows]
    return {"n": len(values), "total": sum(values), "top": max(values) if values else None}


def above(db: Any, limit: int) -> int:
    """How many readings of ``db`` are above ``limit``."""
    return int(db.execute("SELECT count(*) FROM readings WHERE value > ?", (limit,)).fetchone()[0])


def crc(blocks: bytearray) -> int:
    """The CRC-32 of all of ``blocks``."""
    import zlib

    return zlib.crc32(blocks)


def work_done(text: str) -> list[tuple[str, float]]:
    """The ``(key, seconds)`` of every expensive part whose line is in ``text``."""
    return [(m.group(1), float(m.group(2))) for m in MARK_LINE.finditer(text or "")]
