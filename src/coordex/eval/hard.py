"""The hard suite (``--suite hard``): six tasks of 24 steps each, where what a fixed
policy works around costs what it costs in real work.

Every task keeps three kinds of state over its steps:

- ``blocks``, one bytearray of 1 GiB at ``--scale 1``, slow to load (every block is
  verified): a deep copy or a pickle of it costs seconds and a second GiB;
- ``db``, an SQLite connection in memory, and ``stream``, a generator of batches over
  it: neither can be pickled or copied by value, so a fresh sandbox per call starts them
  over, and the rows taken from the stream are lost;
- a shell whose working folder and ``STAGE`` variable later shell steps rely on.

Each task plants one left-over at step 8, in an attempt the task abandons (it is a
read-only try in the reference), at least ten steps before the step it would spoil:
a rebound limit, a block zeroed in place, rows deleted from the database, a batch taken
from the stream, the shell moved elsewhere, the scoring function redefined. The checker
simulates the work and knows the value each left-over gives, and the value a restarted
stream gives, so each policy fails for a reason it names:

- ``kept`` (one session for good) picks up the left-over (a stale-name error);
- ``fresh`` (a sandbox per call) loses the state that cannot be pickled (the stream
  restarts, the shell forgets where it was) and loads the GiB again in every call;
- ``reference`` gets every task right.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import kit
from .tasks import Step, Task, Verdict, all_of, judge, same

GIB = 1 << 30
LIMIT, LOOSE = 2**31, 2**30


@dataclass(frozen=True)
class Plant:
    """One task's abandoned attempt: what it says, its code (run read-only by the
    reference), its language, and the name it leaves behind."""

    says: str
    code: str
    name: str
    language: str = "python"


PLANTS: dict[str, Plant] = {
    "limit": Plant("An attempt you will abandon: try a looser limit, `limit = 2**30`, and count "
                   "the readings above it (kit.above(db, limit)).",
                   "limit = 2**30\nkit.above(db, limit)", "limit"),
    "zeroed": Plant("An attempt you will abandon: zero the first block in place "
                    "(blocks[:kit.BLOCK] = bytes(kit.BLOCK)) to see whether the checksum "
                    "changes (kit.crc(blocks)).",
                    "blocks[:kit.BLOCK] = bytes(kit.BLOCK)\nkit.crc(blocks)", "blocks"),
    "pruned": Plant("An attempt you will abandon: delete the readings whose value is a "
                    "multiple of 5 from `db` and count what is left.",
                    'db.execute("DELETE FROM readings WHERE value % 5 = 0")\n'
                    'db.execute("SELECT count(*) FROM readings").fetchone()[0]', "db"),
    "peeked": Plant("An attempt you will abandon: peek at the stream's next batch "
                    "(next(stream)) to see what its rows look like.",
                    "len(next(stream))", "stream"),
    "shell": Plant("An attempt you will abandon: in the shell, go to {ws}/scratch and set "
                   "STAGE=draft to try a draft layout there.",
                   "mkdir -p {ws}/scratch && cd {ws}/scratch && export STAGE=draft && pwd",
                   "STAGE", "bash"),
    "score": Plant("An attempt you will abandon: redefine score(v) as v % 1009 and score the "
                   "rows taken so far with it.",
                   "def score(v):\n    return v % 1009\nsum(score(v) for _, v in taken)", "score"),
}


def _seed(ws: Path, scale: float, seed: int) -> dict[str, Any]:
    size = max(16 * kit.BLOCK, int(GIB * scale) // kit.BLOCK * kit.BLOCK)
    (ws / "out").mkdir(parents=True, exist_ok=True)
    (ws / "blocks.seed").write_text(f"{seed} {size}\n", encoding="utf-8")
    return {"size": size}


# --- what the work gives: the checker's simulation ----------------------------------------


def simulate(ws: Path, left_over: str | None = None, *,
             restarted: bool = False) -> tuple[dict[str, Any], str]:
    """``(out/hard.json, out/stage.txt)`` as the task's steps give them, with
    ``left_over`` picked up, or with the stream started over in every call."""
    blocks = kit.read_blocks(str(ws / "blocks.seed"))
    rows = kit.readings(blocks)  # the database is made before any attempt
    size = kit.batch_size(len(rows))
    if left_over == "zeroed":
        blocks[:kit.BLOCK] = bytes(kit.BLOCK)
    if left_over == "pruned":
        rows = [r for r in rows if r[1] % 5]
    batches = [rows[i:i + size] for i in range(0, len(rows), size)]
    if left_over == "peeked":
        batches = batches[1:]
    taken = [] if restarted else [r for batch in batches[:3] for r in batch]
    limit = LOOSE if left_over == "limit" else LIMIT
    modulus = 1009 if left_over == "score" else 997
    report = {"summary": kit.summarise(taken),
              "above": sum(1 for _, v in rows if v > limit),
              "scored": sum(v % modulus for _, v in taken),
              "crc": kit.crc(blocks)}
    stage = "draft scratch" if left_over == "shell" else "final work"
    return json.loads(json.dumps(report)), stage


def _read(path: Path) -> tuple[Any, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"{path.parent.name}/{path.name} was not written"
    if path.suffix == ".json":
        try:
            return json.loads(text), None
        except ValueError as exc:
            return None, f"{path.name} cannot be read: {exc}"
    return text.strip(), None


def _judge(found: Any, expected: Any, stale: Mapping[str, Any], what: str, lost: str) -> Verdict:
    """:func:`judge`, with ``lost`` (why a fresh start gives something else) as the
    reason where no left-over explains the value."""
    verdict = judge(found, expected, stale, what)
    if verdict.success or verdict.stale:
        return verdict
    return Verdict(False, (), f"{what} {lost}")


_LOST_ROWS = ("holds what a fresh start gives: the stream and the database cannot be "
              "pickled, so each call started them over and the rows taken were lost")
_LOST_SHELL = "is not what the kept shell gives: the shell's folder and STAGE were not kept"


def _checker(left_over: str) -> Any:
    plant = PLANTS[left_over]

    def check(ws: Path, facts: dict[str, Any]) -> Verdict:
        expected, stage = simulate(ws)
        spoiled, spoiled_stage = simulate(ws, left_over)
        fresh, _ = simulate(ws, restarted=True)
        verdicts = []
        for name, right, wrong, lost in (("hard.json", expected, spoiled, _LOST_ROWS),
                                         ("stage.txt", stage, spoiled_stage, _LOST_SHELL)):
            found, problem = _read(ws / "out" / name)
            if problem:
                verdicts.append(Verdict(False, (), problem))
                continue
            stale = {} if same(wrong, right) else {plant.name: wrong}
            if name == "hard.json" and not same(found, fresh):
                lost = "is not the expected value"
            verdicts.append(_judge(found, right, stale, f"out/{name}", lost))
        return all_of(*verdicts)

    return check


# --- the steps -----------------------------------------------------------------------------

_BUILDERS: dict[str, tuple[tuple[str, ...], str]] = {
    "blocks": ((), 'blocks = kit.load_blocks("{ws}/blocks.seed")'),
    "db": (("blocks",), "db = kit.open_db(blocks)"),
    "stream": (("db",), "stream = kit.batches(db)"),
    "taken": ((), "taken = []"),
    "limit": ((), "limit = 2**31"),
    "score": ((), "def score(v):\n    return v % 997"),
    "summary": (("taken",), "summary = kit.summarise(taken)"),
    "above": (("db", "limit"), "above = kit.above(db, limit)"),
    "scored": (("taken", "score"), "scored = sum(score(v) for _, v in taken)"),
    "crc": (("blocks",), "crc = kit.crc(blocks)"),
}

_TAKE = Step("Take the stream's next batch into `taken` (taken += next(stream)); print how "
             "many rows are taken.", 'taken += next(stream)\nprint(len(taken), "rows taken")',
             needs=("stream", "taken"))


def _steps(plant: Plant) -> tuple[Step, ...]:
    return (
        Step("Look at the workspace {ws}: list it and show blocks.seed.",
             "ls -l {ws} && cat {ws}/blocks.seed", "stateless", "bash"),
        Step("Load the blocks with kit.load_blocks('{ws}/blocks.seed') as `blocks` (slow: "
             "1 GiB at full scale, every block verified) and keep it for the steps that follow.",
             'print(len(blocks), "bytes")', needs=("blocks",)),
        Step("Index the blocks into an SQLite database in memory, `db = kit.open_db(blocks)`, "
             "and keep it; show how many readings it holds.",
             'db.execute("SELECT count(*) FROM readings").fetchone()[0]', needs=("db",)),
        Step("Look at the first 16 bytes of `blocks` in hex, changing nothing.",
             "blocks[:16].hex()", "read_only", needs=("blocks",)),
        Step("In the shell, make {ws}/work, go there and set STAGE=final for the shell steps "
             "that follow (keep that shell).",
             "mkdir -p {ws}/work && cd {ws}/work && export STAGE=final && pwd", "stateful", "bash"),
        Step("Set the task's limit, `limit = 2**31`, and its scoring, `score(v)` returning "
             "v % 997; keep both.", "limit = 2**31\ndef score(v):\n    return v % 997"),
        Step("Open a stream over the readings, `stream = kit.batches(db)` (a generator), and "
             "`taken = []` for the rows taken from it; keep both.",
             "stream = kit.batches(db)\ntaken = []", needs=("db",)),
        Step(plant.says, plant.code, "read_only", plant.language,  # type: ignore[arg-type]
             needs=() if plant.language == "bash" else ("blocks", "db", "stream", "taken",
                                                        "limit", "score")),
        Step("A one-off: how many bytes does {ws}/blocks.seed hold on disk?",
             'import os\nos.path.getsize("{ws}/blocks.seed")', "stateless"),
        _TAKE,
        Step("Look at the largest value taken so far, changing nothing.",
             "max((v for _, v in taken), default=None)", "read_only", needs=("taken",)),
        Step("A one-off with the shell: the SHA-256 of {ws}/blocks.seed.",
             "sha256sum {ws}/blocks.seed", "stateless", "bash"),
        _TAKE,
        Step("Look at how many readings are above the limit (kit.above(db, limit)), "
             "changing nothing.", "kit.above(db, limit)", "read_only", needs=("db", "limit")),
        Step("A one-off: what does kit.summarise give for no rows?", "kit.summarise([])",
             "stateless"),
        _TAKE,
        Step("A one-off with the shell: the free space where {ws} is.", "df -h {ws} | tail -1",
             "stateless", "bash"),
        Step("Summarise the rows taken as `summary` (kit.summarise(taken)).",
             "summary = kit.summarise(taken)\nsummary", needs=("taken",)),
        Step("Count the readings above the limit as `above` (kit.above(db, limit)).",
             "above = kit.above(db, limit)\nabove", needs=("db", "limit")),
        Step("Score the rows taken as `scored` (the sum of score(v) over their values).",
             "scored = sum(score(v) for _, v in taken)\nscored", needs=("taken", "score")),
        Step("The checksum of all the blocks as `crc` (kit.crc(blocks)).",
             "crc = kit.crc(blocks)\ncrc", needs=("blocks",)),
        Step("In the kept shell, write \"$STAGE\" and the name of the folder it is in, on one "
             "line, to {ws}/out/stage.txt.",
             'echo "$STAGE $(basename "$PWD")" > {ws}/out/stage.txt && cat {ws}/out/stage.txt',
             "stateful", "bash"),
        Step("Write {ws}/out/hard.json with keys 'summary', 'above', 'scored' and 'crc' "
             "(kit.write_json).",
             'kit.write_json("{ws}/out/hard.json", {"summary": summary, "above": above, '
             '"scored": scored, "crc": crc})', needs=("summary", "above", "scored", "crc")),
        Step("Check with the shell that the report exists and is not empty.",
             "test -s {ws}/out/hard.json && wc -c {ws}/out/hard.json", "stateless", "bash"),
    )


def _task(number: int, left_over: str, title: str) -> Task:
    plant = PLANTS[left_over]
    return Task(
        name=f"hard-{left_over}",
        title=title,
        brief="Work through the blocks described by {ws}/blocks.seed and write "
              "{ws}/out/hard.json and {ws}/out/stage.txt.",
        builders=_BUILDERS,
        steps=_steps(plant),
        prepare=lambda ws, scale: _seed(ws, scale, 100 + number),
        check=_checker(left_over),
    )


HARD: tuple[Task, ...] = (
    _task(1, "limit", "A limit rebound in a try, ten steps before the count that uses it"),
    _task(2, "zeroed", "A GiB changed in place in a try, long before its checksum"),
    _task(3, "pruned", "Rows deleted from an open database in a try"),
    _task(4, "peeked", "A batch taken from a generator in a try"),
    _task(5, "shell", "A shell moved elsewhere in a try"),
    _task(6, "score", "A function redefined in a try"),
)
