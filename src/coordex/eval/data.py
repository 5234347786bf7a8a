"""The eval's data, generated on the spot: deterministic (one seed per task), sized by
``scale`` (1.0 is the default run; the tests use a few hundredths), and written into the
task's workspace folder. Nothing is downloaded: the two versions of ``ledgerlib`` that
the pinned-function task needs are wheels written here with ``zipfile``.
"""

from __future__ import annotations

import csv
import datetime
import random
from pathlib import Path

from .kit import row_check

ACCOUNTS = ("ops", "sales", "research", "legal", "facilities", "travel", "support", "data")
CATEGORIES = ("invoice", "refund", "payroll", "software", "hardware")
PATHS = ("/api/items", "/api/orders", "/api/users", "/health", "/login", "/search")
WAREHOUSES = ("north", "south", "east", "west")
CITIES = tuple(f"city{i:02d}" for i in range(24))
WORDS = ("ledger", "coordinate", "session", "account", "refund", "invoice", "forecast",
         "sensor", "reading", "window", "cohort", "retention", "export", "warehouse",
         "contact", "budget", "variance", "shell", "python", "environment", "pinned",
         "stateful", "stateless", "copy", "checks", "runner", "builders", "loading",
         "reports", "tested", "merged", "rounding", "cleaner", "workers", "indexes")


def rows(base: int, scale: float, least: int = 20) -> int:
    return max(least, int(base * scale))


def _day(rng: random.Random, month: int) -> str:
    return f"2025-{month:02d}-{1 + rng.randrange(28):02d}"


def write_ledger(path: Path, scale: float, seed: int) -> Path:
    """id, date, account, category, amount, check (``kit.row_check`` of id and amount)."""
    rng = random.Random(seed)
    n = rows(60_000, scale)
    with path.open("w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["id", "date", "account", "category", "amount", "check"])
        for i in range(n):
            month = 1 + i * 12 // n
            category = rng.choice(CATEGORIES)
            amount = rng.lognormvariate(4, 1) * (1 + month / 12)
            if category == "refund":
                amount = -amount * (3 if month <= 3 else 1)
            row_id, text = f"T{i:06d}", f"{amount:.2f}"
            out.writerow([row_id, _day(rng, month), rng.choice(ACCOUNTS), category, text,
                          row_check(row_id, text)])
    return path


def write_budget(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    with path.open("w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["account", "budget"])
        for account in ACCOUNTS:
            out.writerow([account, f"{rng.randrange(100, 900) * 1000}"])
    return path


def write_events(path: Path, scale: float, seed: int) -> Path:
    rng = random.Random(seed)
    start = datetime.datetime(2025, 3, 1)
    with path.open("w") as file:
        for i in range(rows(80_000, scale)):
            at = (start + datetime.timedelta(seconds=i * 3)).isoformat()
            route = rng.choice(PATHS)
            status = rng.choices((200, 201, 304, 404, 500, 503), (70, 5, 10, 8, 4, 3))[0]
            if route == "/health":
                status = rng.choices((200, 503), (80, 20))[0]
            ms = int(rng.lognormvariate(3, 0.8)) + (400 if route == "/search" else 0)
            ip = f"10.{rng.randrange(4)}.{rng.randrange(256)}.{rng.randrange(256)}"
            method = "POST" if route in ("/login", "/api/orders") else "GET"
            file.write(f"{at} {ip} {method} {route} {status} {rng.randrange(100, 90000)} {ms}\n")
    return path


def write_readings(path: Path, scale: float, seed: int) -> Path:
    rng = random.Random(seed)
    points = rows(30_000, scale, least=60)
    with path.open("w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["sensor", "ts", "value"])
        for s in range(8):
            level, slope = rng.uniform(10, 30), rng.uniform(-0.5, 0.5)
            for t in range(points):
                value = level + slope * t / points * 10 + rng.gauss(0, 1)
                if rng.random() < 0.02:
                    value += rng.choice((-1, 1)) * rng.uniform(20, 40)  # a spike
                out.writerow([f"s{s:02d}", t, f"{value:.3f}"])
    return path


def write_corpus(folder: Path, scale: float, seed: int) -> Path:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    noise = ["".join(rng.choice("abcdefghij") for _ in range(rng.randrange(3, 8)))
             for _ in range(3000)]
    for d in range(rows(4_000, scale, least=12)):
        words = rng.choices(WORDS, k=350) + rng.choices(noise, k=150)
        rng.shuffle(words)
        (folder / f"doc{d:04d}.txt").write_text(" ".join(words) + "\n")
    return folder


def write_orders(path: Path, scale: float, seed: int) -> Path:
    rng = random.Random(seed)
    customers = rows(3_000, scale, least=30)
    with path.open("w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["customer", "date", "warehouse", "sku", "qty", "amount"])
        for _ in range(rows(40_000, scale)):
            month = 1 + min(11, int(rng.expovariate(0.25)))
            qty = rng.randrange(1, 9)
            out.writerow([f"C{rng.randrange(customers):05d}", _day(rng, month),
                          rng.choice(WAREHOUSES), f"SKU{rng.randrange(200):03d}", qty,
                          f"{qty * rng.uniform(3, 80):.2f}"])
    return path


def write_prices(path: Path, scale: float, seed: int) -> Path:
    rng = random.Random(seed)
    with path.open("w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["day", "price"])
        for day in range(rows(2_000, scale, least=40)):
            price = 50 + 0.08 * day + rng.gauss(0, 2)
            if rng.random() < 0.05:
                price *= rng.uniform(4, 6)  # an outlier: a misread price
            out.writerow([day, f"{price:.2f}"])
    return path


def write_contacts(path: Path, scale: float, seed: int) -> Path:
    rng = random.Random(seed)
    first = ("anna", "bernd", "chloé", "dmitri", "eva", "fatima", "gunnar", "hana", "ivo",
             "jules", "karin", "luis", "mei", "nils", "olga", "pavel", "quinn", "rosa")
    last = ("meyer", "schmidt", "novak", "rossi", "garcia", "kowalski", "jensen", "dubois",
            "silva", "tanaka", "weber", "horvat")
    with path.open("w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["name", "city", "email"])
        for i in range(rows(3_000, scale, least=40)):
            name = f"{rng.choice(first)} {rng.choice(last)}"
            if rng.random() < 0.3:  # a second spelling of someone
                cut = rng.randrange(1, len(name) - 1)
                name = name[:cut] + rng.choice("aeiouy") + name[cut + 1:]
            out.writerow([name.title(), rng.choice(CITIES), f"p{i}@example.org"])
    return path


def write_logs(folder: Path, scale: float, seed: int) -> Path:
    """Thirty daily logs ``app-2025MMDD.log``: INFO lines and some ERROR lines."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    day = datetime.date(2025, 5, 1)
    for _ in range(30):
        lines = []
        for i in range(rows(4_000, scale)):
            level = "ERROR" if rng.random() < 0.03 else "INFO"
            lines.append(f"{day.isoformat()}T{i % 24:02d}:00:00 {level} worker-{rng.randrange(9)} "
                         f"request {rng.randrange(10**6)} done\n")
        (folder / f"app-{day:%Y%m%d}.log").write_text("".join(lines))
        day += datetime.timedelta(days=1)
    return folder


# --- the two incompatible pins ---------------------------------------------------------

LEDGERLIB = {
    "1.0": ('"""ledgerlib 1.0: plain totals."""\nVERSION = "1.0"\n\n\n'
            "def total(xs):\n    return round(sum(xs), 2)\n"),
    "2.0": ('"""ledgerlib 2.0: totals carry a currency (keyword-only; 1.0 callers break)."""\n'
            'VERSION = "2.0"\n\n\n'
            "def total(xs, *, currency):\n    return f\"{sum(xs):.2f} {currency}\"\n"),
}


def ledgerlib_wheel(folder: Path, version: str) -> Path:
    """A pure-Python wheel of ``ledgerlib`` ``version``; a fixed timestamp keeps its bytes
    (and so the environment's spec hash) the same from run to run."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"ledgerlib-{version}"
    files = {
        "ledgerlib/__init__.py": LEDGERLIB[version],
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: ledgerlib\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: coordex-eval\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    from ..demo import pack_wheel

    return pack_wheel(folder, dist, files)
