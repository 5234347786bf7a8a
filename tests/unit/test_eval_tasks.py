"""The eval's pure parts: the suite's shape, the code the fixed policies run, where each
policy runs a step, the checkers' judgement, and the measures taken from outputs and
log rows."""

from __future__ import annotations

from pathlib import Path

from coordex.eval import report
from coordex.eval.kit import work_done
from coordex.eval.measures import CallSeen, by_coordinate, choices, redo_seconds, seen
from coordex.eval.runner import TaskResult, coordinate
from coordex.eval.suite import BY_NAME, SUITES, TASKS
from coordex.eval.tasks import judge, reference_code, same

WS = Path("/srv/eval-space")


def test_the_suite_is_long_tasks_each_with_a_planted_attempt() -> None:
    assert len(TASKS) >= 12 and len(SUITES["hard"]) >= 6
    assert len(BY_NAME) == sum(len(suite) for suite in SUITES.values())  # no name twice
    for task in BY_NAME.values():
        assert len(task.steps) >= 8, task.name
        modes = {(s.language, s.mode) for s in task.steps}
        # A one-off check and a look that must change nothing, in every task.
        assert any(mode == "stateless" for _, mode in modes), task.name
        assert any(mode == "read_only" for _, mode in modes), task.name
        # The planted value: an attempt the task abandons, or a look that changes a name.
        assert any(("abandon" in s.says or "Only a look" in s.says) and s.mode == "read_only"
                   for s in task.steps), task.name
        # A read-only look needs its session to exist: a stateful step of that language first.
        for n, step in enumerate(task.steps):
            if step.mode == "read_only":
                assert any(s.mode == "stateful" and s.language == step.language
                           for s in task.steps[:n]), (task.name, n)
        for step in task.steps:
            for name in step.needs:
                assert name in task.builders, (task.name, name)
    assert any(task.environments and task.functions for task in TASKS)


def test_reference_code_rebuilds_what_is_missing_in_order() -> None:
    task = BY_NAME["ledger-audit"]
    step = task.steps[7]  # writes totals and by_month
    code = reference_code(task, step, WS, {})
    assert code.startswith("from coordex.eval import kit\n")
    assert code.index("if 'ledger' not in globals():") < code.index("if 'totals' not in globals():")
    assert code.count("if 'ledger' not in globals():") == 1
    assert "/srv/eval-space/ledger.csv" in code and "{ws}" not in code
    compile(code, "<step>", "exec")
    bash = task.steps[0]
    assert reference_code(task, bash, WS, {}) == "ls -l /srv/eval-space && wc -l /srv/eval-space/ledger.csv"


def test_every_reference_step_compiles() -> None:
    for task in TASKS:
        venvs = {key: n for n, key in enumerate(task.environments, start=1)}
        for step in task.steps:
            code = reference_code(task, step, WS, venvs)
            assert "{ws}" not in code and "{venv:" not in code
            if step.language == "python":
                compile(code, f"<{task.name}>", "exec")


def test_where_each_policy_runs_a_step() -> None:
    task = BY_NAME["pinned-totals"]
    look, in_env = task.steps[6], task.steps[2]
    assert coordinate("fresh", task, look, {"v1": 3}) == {
        "language": "python", "venv_id": None, "state_mode": "stateless"}
    assert coordinate("kept", task, look, {"v1": 3}) == {
        "language": "python", "venv_id": None, "state_mode": "stateful"}
    assert coordinate("reference", task, look, {"v1": 3}) == {
        "language": "python", "venv_id": None, "state_mode": "read_only",
        "session_name": "pinned-totals"}
    # The environment a step needs is kept by every policy: without it the code cannot run.
    for policy in ("fresh", "kept", "reference"):
        assert coordinate(policy, task, in_env, {"v1": 3})["venv_id"] == 3


def test_a_checker_names_the_left_over_by_its_value() -> None:
    right, stale = {"total": 10.0}, {"total": 2.5}
    assert judge({"total": 10.0000000001}, right, {"rate": stale}, "x").success
    verdict = judge({"total": 2.5}, right, {"rate": stale}, "out/x.json")
    assert not verdict.success and verdict.stale == ("rate",)
    assert "left-over 'rate'" in verdict.reason
    other = judge({"total": 7}, right, {"rate": stale}, "out/x.json")
    assert not other.success and other.stale == ()
    assert not same(True, 1) and not same([1, 2], [1]) and same({"a": [1.0]}, {"a": [1]})


def test_redo_counts_each_expensive_part_after_its_first_run() -> None:
    out = "[kit] load_ledger(ledger.csv) 1.500s\nrows\n"
    assert work_done(out) == [("load_ledger(ledger.csv)", 1.5)]
    calls = [CallSeen(1, "python", "stateless", None, None, "ok", work_done(out)),
             CallSeen(2, "python", "stateless", None, None, "ok",
                      work_done(out + "[kit] smooth(window=9) 0.250s\n")),
             CallSeen(3, "python", "stateless", None, None, "ok", work_done(out))]
    assert redo_seconds(calls) == 3.0


def test_a_call_seen_from_its_result_or_its_arguments() -> None:
    result = {"stdout": "", "stderr": "", "state_mode": "read_only",
              "session": {"language": "bash", "venv_id": None, "session_id": 2,
                          "session_name": "logs"}}
    call = seen(4, result, {})
    assert (call.language, call.state_mode, call.session, call.outcome) == \
        ("bash", "read_only", "logs", "ok")
    error = {"error": "...", "error_type": "validation", "suggestion": "..."}
    call = seen(5, error, {"state_mode": "read_only", "session_name": "audti"})
    assert (call.state_mode, call.session, call.outcome) == ("read_only", "audti", "validation")


def _row(seq: int, language: str | None, mode: str | None, sid: int | None,
         name: str | None, venv_id: int | None = None) -> dict[str, object]:
    return {"seq": seq, "language": language, "state_mode": mode, "session_id": sid,
            "session_name": name, "venv_id": venv_id}


def test_choices_and_counts_from_log_rows() -> None:
    rows = [_row(10, "python", "stateful", 1, "a"),
            _row(11, "python", "stateless", None, None, 2),  # a stored function's own call
            _row(12, "bash", "stateful", 0, None),
            _row(13, "python", None, None, None),  # refused before its mode was settled
            _row(20, "python", "stateful", 0, None)]  # no step's
    seen_calls = [CallSeen(1, "python", "stateful", "a", None, "ok"),
                  CallSeen(2, "bash", "stateful", 0, None, "ok"),
                  CallSeen(3, "python", "read_only", None, None, "validation"),
                  CallSeen(4, "python", "stateless", None, None, "validation", asked=False),
                  CallSeen(5, "bash", "stateless", None, None, "ok")]
    ranges = [(1, 9, 10), (2, 10, 12), (3, 12, 13), (4, 13, 13), (5, 13, 13)]
    chosen = choices(rows, ranges, seen_calls)
    assert [(c["step"], c["language"], c["state_mode"], c["session"], c["venv_id"])
            for c in chosen] == [
        (1, "python", "stateful", "a", None), (2, "python", "stateless", None, 2),
        (2, "bash", "stateful", 0, None), (3, "python", "read_only", None, None),
        (5, "bash", "stateless", None, None)]  # a log without the row: the call as seen
    assert by_coordinate(chosen) == {"bash/stateful/own": 1, "bash/stateless/own": 1,
                                     "python/read_only/own": 1, "python/stateful/own": 1,
                                     "python/stateless/venv2": 1}


def test_report_totals_and_table() -> None:
    from coordex.eval.measures import Work

    work = Work()
    work.add('{"code": "1"}', '{"result": "1"}', 0.25)
    work.add('{"code": "22"}', '{"result": "22"}', 0.5)
    results = [TaskResult("a", 9, True, 1.25, 0.5, 0, {"python/stateful/own": 9}, 300, [],
                          work=work),
               TaskResult("b", 8, False, 2.0, 0.0, 1, {"bash/stateless/own": 8}, None, [])]
    built = report.build("model", "m1", results, tools="kept")
    assert built["tools"] == "kept"
    assert built["total"] == {"tasks": 2, "succeeded": 1, "wall_s": 3.25, "redo_s": 0.5,
                              "stale_errors": 1, "tokens": 300, "calls": 2, "code_chars": 27,
                              "result_chars": 31, "exec_s": 0.75}
    assert built["tasks"][0]["calls"] == 2 and built["tasks"][1]["calls"] == 0
    assert built["tasks"][1]["tokens"] is None
    lines = report.table(built).splitlines()
    assert lines[0].split() == list(report.COLUMNS)
    assert lines[-1].split() == ["total", "17", "1/2", "3.25", "0.50", "1", "17", "300", "27",
                                 "31", "0.75"]
