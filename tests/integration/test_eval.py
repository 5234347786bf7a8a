"""``coordex eval`` end to end, in process through the command line's ``main``.

The fixed policies run the real suite on tiny data: ``reference`` succeeds, ``fresh``
redoes work and ``kept`` trips on the planted stale values - if not, the suite does not
measure what it claims. ``--policy model`` runs against a real HTTP endpoint on
127.0.0.1 whose "model" is a script (tests/fakes/chat_server.py): one that works well,
one that makes the classic mistakes, one that never stops, and broken endpoints.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.cli import main
from tests.conftest import assert_no_new_children, child_pids

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.chat_server import TOKENS_PER_REPLY, ChatServer, Raw, tool_call

SCALE = "0.02"
WORK_KEYS = {"calls", "code_chars", "result_chars", "exec_s"}
TASK_KEYS = {"name", "steps", "success", "wall_s", "redo_s", "stale_errors",
             "calls_by_coordinate", "tokens", "choices"} | WORK_KEYS
CHOICE_KEYS = {"step", "language", "state_mode", "session", "venv_id"}


def run_eval(out: Path, *args: str) -> int:
    return main(["eval", "--out", str(out), "--scale", SCALE, *args])


def load(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def check_shape(report: dict[str, Any]) -> None:
    assert set(report) == {"policy", "model", "tools", "tasks", "total"}
    assert set(report["total"]) == {"tasks", "succeeded", "wall_s", "redo_s", "stale_errors",
                                    "tokens"} | WORK_KEYS
    for task in report["tasks"]:
        assert set(task) == TASK_KEYS
        for choice in task["choices"]:
            assert set(choice) == CHOICE_KEYS
        for key in task["calls_by_coordinate"]:
            assert re.fullmatch(r"(python|bash)/(stateless|stateful|read_only)/(own|venv\d+)", key)


# --- the fixed policies ----------------------------------------------------------------


def test_policies_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    tasks = "ledger-audit,warehouse-exports"
    before = child_pids()
    for policy in ("fresh", "kept", "reference"):
        assert run_eval(out, "--policy", policy, "--tasks", tasks) == 0
        report = load(out)
        check_shape(report)
        assert report["policy"] == policy and report["model"] is None
        assert [t["name"] for t in report["tasks"]] == tasks.split(",")
        if policy == "fresh":
            fresh = report
        elif policy == "kept":
            kept = report
    reference = report
    assert_no_new_children(before)  # every task's shells and workers ended with it

    # The reference's coordinates get every task right, with nothing redone.
    assert reference["total"]["succeeded"] == 2
    assert reference["total"]["redo_s"] == 0 and reference["total"]["stale_errors"] == 0
    # A fresh sandbox each call gets there too, by loading again and again.
    assert fresh["total"]["succeeded"] == 2
    assert fresh["total"]["redo_s"] > 0
    assert fresh["tasks"][0]["calls_by_coordinate"] == {"bash/stateless/own": 2,
                                                         "python/stateless/own": 7}
    # One interpreter kept for good picks up what the abandoned attempts left behind.
    assert kept["total"]["succeeded"] == 0
    assert [t["stale_errors"] for t in kept["tasks"]] == [1, 1]
    assert kept["total"]["redo_s"] == 0

    # Coordinates step by step, as the reference chose them (from the call log).
    audit = reference["tasks"][0]
    assert [(c["step"], c["language"], c["state_mode"], c["session"]) for c in audit["choices"]][:4] \
        == [(1, "bash", "stateless", None), (2, "python", "stateful", "ledger-audit"),
            (3, "python", "read_only", "ledger-audit"), (4, "python", "read_only", "ledger-audit")]

    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    assert "left-over 'OUTDIR'" in printed.err  # why kept failed, in words
    assert re.search(r"^total\s+18\s+2/2", printed.out, re.MULTILINE)
    text = (out / "report.md").read_text()
    assert "## Policies side by side" in text
    for policy in ("| fresh | 2/2", "| kept | 0/2", "| reference | 2/2"):
        assert policy in text
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_whole_suite_under_the_fixed_policies(tmp_path: Path) -> None:
    """Every task (the pinned one builds its two environments with uv, offline)."""
    out = tmp_path / "all"
    totals = {}
    for policy in ("fresh", "kept", "reference"):
        assert run_eval(out, "--policy", policy) == 0
        report = load(out)
        check_shape(report)
        assert len(report["tasks"]) >= 12
        assert all(t["steps"] >= 8 for t in report["tasks"])
        totals[policy] = report
    reference, fresh, kept = totals["reference"], totals["fresh"], totals["kept"]
    assert all(t["success"] for t in reference["tasks"]), reference["tasks"]
    assert reference["total"]["stale_errors"] == 0
    assert all(t["stale_errors"] >= 1 and not t["success"] for t in kept["tasks"])
    assert fresh["total"]["redo_s"] > 0 and fresh["total"]["succeeded"] == 12
    pinned = next(t for t in reference["tasks"] if t["name"] == "pinned-totals")
    assert {k.split("/")[2] for k in pinned["calls_by_coordinate"]} >= {"own", "venv1", "venv2"}


def test_list_and_bad_command_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--list"]) == 0
    names = capsys.readouterr().out.split()
    assert len(names) >= 12 and "ledger-audit" in names and "pinned-totals" in names

    assert run_eval(tmp_path, "--tasks", "ledger-audt") == 2
    err = capsys.readouterr().err
    assert "no task named 'ledger-audt'" in err and "'ledger-audit'" in err

    assert run_eval(tmp_path, "--policy", "model") == 2
    assert "--base-url URL and --model NAME" in capsys.readouterr().err
    assert run_eval(tmp_path, "--policy", "model", "--model", "m", "--base-url", "localhost:1") == 2
    assert "http:// or https://" in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()

    taken = tmp_path / "a-file"
    taken.write_text("")
    assert run_eval(taken, "--tasks", "log-rotation") == 2
    assert "cannot write the report into" in capsys.readouterr().err


# --- the model policy, against a scripted endpoint -------------------------------------


def workspace(body: dict[str, Any]) -> str:
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    found = re.search(r"(\S+)/ledger\.csv", prompt)
    assert found, prompt
    return found.group(1)


def tools_done(body: dict[str, Any]) -> int:
    return sum(m["role"] == "tool" for m in body["messages"])


def scripted(plan: list[tuple[str, Any]]) -> Any:
    """A model that makes the calls of ``plan`` one a turn ({ws} filled in), then stops."""
    def script(body: dict[str, Any]) -> dict[str, Any]:
        done = tools_done(body)
        if done >= len(plan):
            return {"content": "All steps are done."}
        name, arguments = plan[done]
        if isinstance(arguments, dict):
            arguments = {k: v.replace("{ws}", workspace(body)) if isinstance(v, str) else v
                         for k, v in arguments.items()}
        return {"tool_calls": [tool_call(done, name, arguments)]}
    return script


LOAD = "from coordex.eval import kit\nledger = kit.load_ledger('{ws}/ledger.csv')\nlen(ledger)"
ATTEMPT = "ledger = [r for r in ledger if r['date'] < '2025-04']\nlen(ledger)"
WRITE = ("kit.write_json('{ws}/out/audit.json', {'totals': kit.totals_by(ledger, 'account'), "
         "'by_month': kit.monthly(ledger)})")


def test_model_that_chooses_well(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    plan = [("execute_code", {"code": LOAD, "state_mode": "stateful", "session_name": "audit"}),
            ("execute_code", {"code": ATTEMPT, "state_mode": "read_only", "session_name": "audit"}),
            ("execute_code", {"code": "wc -l {ws}/ledger.csv", "language": "bash"}),
            ("inspect_session", {"session_name": "audit"}),
            ("execute_code", {"code": WRITE, "state_mode": "stateful", "session_name": "audit"})]
    with ChatServer(scripted(plan)) as server:
        assert run_eval(tmp_path, "--policy", "model", "--base-url", server.base_url,
                        "--model", "scripted", "--tasks", "ledger-audit") == 0
    report = load(tmp_path)
    check_shape(report)
    assert report["policy"] == "model" and report["model"] == "scripted"
    task = report["tasks"][0]
    assert task["success"] and task["stale_errors"] == 0 and task["redo_s"] == 0
    assert task["tokens"] == report["total"]["tokens"] == 6 * TOKENS_PER_REPLY
    # Every code-running call, in order, at the coordinate the model chose.
    assert [(c["step"], c["language"], c["state_mode"], c["session"]) for c in task["choices"]] == [
        (1, "python", "stateful", "audit"), (2, "python", "read_only", "audit"),
        (3, "bash", "stateless", None), (4, "python", "stateful", "audit")]
    assert task["calls_by_coordinate"] == {"bash/stateless/own": 1, "python/read_only/own": 1,
                                           "python/stateful/own": 2}

    # The endpoint saw coordex's own tools, the key, and each result as a tool message.
    first = server.requests[0]
    with Executor(root=tmp_path / "defs") as ex:
        ours = ex.tool_definitions(format="openai")
    assert [t["function"]["name"] for t in first["tools"]] == [t["function"]["name"] for t in ours]
    assert [t["function"]["parameters"]["properties"].keys() for t in first["tools"]] == \
        [t["function"]["parameters"]["properties"].keys() for t in ours]
    assert first["model"] == "scripted"
    assert server.headers[0]["Authorization"] == "Bearer sk-test-key"
    answers = [m for m in server.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in answers] == [f"call_{n}" for n in range(5)]
    assert '"isolation"' in answers[1]["content"]  # the read-only look came back as such
    transcript = json.loads((tmp_path / "transcripts" / "ledger-audit.json").read_text())
    assert transcript[-1] == {"role": "assistant", "content": "All steps are done."}
    assert "Traceback" not in capsys.readouterr().err


def test_model_that_makes_the_classic_mistakes(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A tool that does not exist, an impossible coordinate, arguments that are not JSON,
    an expensive load in a sandbox that forgets it, and the abandoned attempt run in the
    one session kept for good."""
    plan = [("run_python", {"code": "1 + 1"}),
            ("execute_code", {"code": "len(ledger)", "state_mode": "read_only"}),
            ("execute_code", '{"code": "1 + ", "state_mode": '),
            ("execute_code", {"code": LOAD}),  # loaded in a sandbox that forgets it
            ("execute_code", {"code": LOAD, "state_mode": "stateful"}),
            ("execute_code", {"code": ATTEMPT, "state_mode": "stateful"}),
            ("execute_code", {"code": WRITE, "state_mode": "stateful"})]
    with ChatServer(scripted(plan)) as server:
        assert run_eval(tmp_path, "--policy", "model", "--base-url", server.base_url,
                        "--model", "careless", "--tasks", "ledger-audit") == 0
    task = load(tmp_path)["tasks"][0]
    assert not task["success"] and task["stale_errors"] == 1
    assert task["redo_s"] > 0  # the ledger's checks ran twice
    # Step 2's arguments were not JSON: it chose no coordinate. Step 1 asked for one that
    # cannot be (read_only without a session), and that is what it chose.
    assert [(c["step"], c["state_mode"], c["session"]) for c in task["choices"]] == [
        (1, "read_only", None), (3, "stateless", None), (4, "stateful", 0),
        (5, "stateful", 0), (6, "stateful", 0)]
    answers = [json.loads(m["content"]) for m in server.requests[-1]["messages"]
               if m["role"] == "tool"]
    assert answers[0]["error_type"] == "not_found" and "execute_code" in answers[0]["suggestion"]
    assert answers[1]["error_type"] == "validation"
    assert answers[2]["error_type"] == "validation"
    assert all("error_type" not in a for a in answers[3:])
    err = capsys.readouterr().err
    assert "left-over 'ledger'" in err and "Traceback" not in err


def test_model_that_never_stops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def busy(body: dict[str, Any]) -> dict[str, Any]:
        return {"tool_calls": [tool_call(tools_done(body), "list_sessions", {})]}

    with ChatServer(busy) as server:
        assert run_eval(tmp_path, "--policy", "model", "--base-url", server.base_url,
                        "--model", "busy", "--max-turns", "3", "--tasks", "fx-report") == 0
        assert len(server.requests) == 3
    task = load(tmp_path)["tasks"][0]
    assert not task["success"] and task["tokens"] == 3 * TOKENS_PER_REPLY
    assert task["choices"] == []  # list_sessions runs no code
    err = capsys.readouterr().err
    assert "--max-turns 3" in err and "Traceback" not in err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_endpoint_that_cannot_be_reached(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    assert run_eval(tmp_path, "--policy", "model", "--base-url", url, "--model", "m",
                    "--tasks", "ledger-audit,fx-report") == 1
    report = load(tmp_path)
    assert [t["success"] for t in report["tasks"]] == [False, False]
    err = capsys.readouterr().err
    assert f"cannot reach {url}/chat/completions" in err and "Check --base-url" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("answer", "words", "code"), [
    (Raw(500, '{"error": {"message": "overloaded"}}'), "answered HTTP 500", 0),
    (Raw(200, "<html>not json</html>"), "did not answer with JSON", 0),
    (Raw(200, '{"object": "chat.completion"}'), "without 'choices'", 0),
    (Raw(401, '{"error": {"message": "bad key"}}'), "Set OPENAI_API_KEY", 1),
])
def test_endpoint_that_answers_badly(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     answer: Raw, words: str, code: int) -> None:
    with ChatServer(lambda body: answer) as server:
        assert run_eval(tmp_path, "--policy", "model", "--base-url", server.base_url,
                        "--model", "m", "--tasks", "ledger-audit") == code
    assert not load(tmp_path)["tasks"][0]["success"]
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_base_url_without_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ChatServer(lambda body: {"content": "hi"}) as server:
        root = server.base_url.removesuffix("/v1")
        assert run_eval(tmp_path, "--policy", "model", "--base-url", root, "--model", "m",
                        "--tasks", "ledger-audit") == 1
    err = capsys.readouterr().err
    assert "answered HTTP 404" in err and "Traceback" not in err


def _task_of(prompt: str) -> tuple[Any, dict[str, Any]]:
    """The suite's task whose brief opens ``prompt``, with its workspace and venv ids."""
    from coordex.eval.suite import TASKS

    for task in TASKS:
        pattern, seen_ws = "", False
        for piece in re.split(r"(\{ws\}|\{venv:\w+\})", task.brief):
            if piece == "{ws}":
                pattern += "(?P=ws)" if seen_ws else r"(?P<ws>/\S+?)"
                seen_ws = True
            elif piece.startswith("{venv:"):
                pattern += rf"(?P<venv_{piece[6:-1]}>\d+)"
            else:
                pattern += re.escape(piece)
        found = re.match(pattern, prompt)
        if found:
            return task, found.groupdict()
    raise AssertionError(f"no task's brief opens {prompt[:80]!r}")


@pytest.mark.slow
def test_a_model_that_chooses_like_the_reference_gets_every_task_right(tmp_path: Path) -> None:
    """Through the endpoint and call_tool, each step's reference code at the reference's
    coordinate: the whole model path agrees with the reference policy on every task."""
    from coordex.eval.runner import coordinate
    from coordex.eval.tasks import reference_code

    def reference_model(body: dict[str, Any]) -> dict[str, Any]:
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        task, found = _task_of(prompt)
        done = tools_done(body)
        if done == len(task.steps):
            return {"content": "done"}
        venvs = {k[5:]: int(v) for k, v in found.items() if k.startswith("venv_")}
        step = task.steps[done]
        arguments = {"code": reference_code(task, step, Path(found["ws"]), venvs),
                     **coordinate("reference", task, step, venvs)}
        return {"tool_calls": [tool_call(done, "execute_code",
                                         {k: v for k, v in arguments.items() if v is not None})]}

    with ChatServer(reference_model) as server:
        assert run_eval(tmp_path, "--policy", "model", "--base-url", server.base_url,
                        "--model", "reference-script") == 0
    report = load(tmp_path)
    check_shape(report)
    assert report["total"]["succeeded"] == report["total"]["tasks"] >= 12
    assert report["total"]["redo_s"] == 0 and report["total"]["stale_errors"] == 0
    from coordex.eval.suite import BY_NAME

    for task in report["tasks"]:
        steps = BY_NAME[task["name"]].steps
        assert task["tokens"] == (len(steps) + 1) * TOKENS_PER_REPLY
        # Each step's call at the step's coordinate (a stored function's own calls besides).
        for number, step in enumerate(steps, start=1):
            assert any(c["step"] == number and (c["language"], c["state_mode"])
                       == (step.language, step.mode) for c in task["choices"]), (task, number)


# --- the hard suite (SPEC 13: --suite hard) ---------------------------------------------


def test_hard_suite_tells_the_policies_apart_for_the_reasons_it_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from coordex.eval.hard import HARD

    assert len(HARD) >= 6 and all(len(task.steps) >= 20 for task in HARD)
    assert main(["eval", "--suite", "hard", "--list"]) == 0
    assert capsys.readouterr().out.split() == [task.name for task in HARD]
    out = tmp_path / "hard"
    reports = {}
    for policy in ("reference", "kept", "fresh"):
        assert main(["eval", "--suite", "hard", "--policy", policy, "--scale", "0.002",
                     "--out", str(out)]) == 0
        reports[policy] = load(out)
    err = capsys.readouterr().err
    reference, kept, fresh = reports["reference"], reports["kept"], reports["fresh"]
    assert reference["total"]["succeeded"] == len(HARD)
    assert reference["total"]["redo_s"] == 0 and reference["total"]["stale_errors"] == 0
    # One session kept for good: every task picks up its left-over, each a different kind.
    assert kept["total"]["succeeded"] == 0
    assert [t["stale_errors"] for t in kept["tasks"]] == [1] * len(HARD)
    for left_over in ("'limit'", "'blocks'", "'db'", "'stream'", "'STAGE'", "'score'"):
        assert f"holds the value the left-over {left_over} gives" in err
    # A fresh sandbox per call: what cannot be pickled is started over, and the GiB loads
    # again and again.
    assert fresh["total"]["succeeded"] == 0 and fresh["total"]["stale_errors"] == 0
    assert err.count("the stream and the database cannot be pickled") == len(HARD)
    assert err.count("the shell's folder and STAGE were not kept") == len(HARD)
    assert fresh["total"]["redo_s"] > 0


def test_hard_suite_left_overs_come_ten_steps_before_what_they_spoil() -> None:
    """Each planted attempt is step 8; the steps that read what it spoils come at 18 or
    later (the checker's simulation agrees with what the steps compute)."""
    from coordex.eval.hard import HARD, PLANTS

    for task in HARD:
        planted = next(n for n, s in enumerate(task.steps, 1) if s.says in
                       {p.says for p in PLANTS.values()})
        assert planted == 8 and task.steps[planted - 1].mode == "read_only"
        spoiled_from = [n for n, s in enumerate(task.steps, 1)
                        if s.mode == "stateful" and n > planted
                        and ("summary =" in s.code or "above =" in s.code
                             or "scored =" in s.code or "crc =" in s.code or "$STAGE" in s.code)]
        assert min(spoiled_from) - planted >= 10


# --- arms, stepwise and the model's own work (SPEC 13) ----------------------------------


def test_arms_give_one_fixed_tool_and_run_it_at_the_fixed_coordinate(tmp_path: Path) -> None:
    """--tools kept|fresh: one execute_code without state_mode or session arguments; a
    model that sends them anyway runs at the arm's coordinate; the report names the arm,
    and the arms of one model sit side by side."""
    plan = [("execute_code", {"code": LOAD, "state_mode": "read_only", "session_name": "x"}),
            ("execute_code", {"code": "len(ledger)"}),
            ("list_sessions", {})]
    runs = {}
    for arm in ("kept", "fresh"):
        with ChatServer(scripted(plan)) as server:
            assert run_eval(tmp_path, "--policy", "model", "--base-url", server.base_url,
                            "--model", "m", "--tools", arm, "--tasks", "ledger-audit") == 0
        tools = server.requests[0]["tools"]
        assert [t["function"]["name"] for t in tools] == ["execute_code"]
        properties = tools[0]["function"]["parameters"]["properties"]
        assert "code" in properties and "language" in properties
        assert not {"state_mode", "session_id", "session_name"} & set(properties)
        assert ("kept for the whole task" if arm == "kept" else "fresh interpreter") \
            in tools[0]["function"]["description"]
        answers = [json.loads(m["content"]) for m in server.requests[-1]["messages"]
                   if m["role"] == "tool"]
        runs[arm] = (load(tmp_path), answers)
    kept, kept_answers = runs["kept"]
    fresh, fresh_answers = runs["fresh"]
    assert kept["tools"] == "kept" and fresh["tools"] == "fresh"
    # kept: the load stays for the next call; fresh: it is gone.
    assert kept_answers[0]["state_mode"] == "stateful" and "error_type" not in kept_answers[1]
    assert fresh_answers[0]["state_mode"] == "stateless"
    assert fresh_answers[1]["exception"] == "NameError"
    assert kept_answers[2]["error_type"] == "not_found"  # no other tool under a fixed arm
    task = kept["tasks"][0]
    assert task["calls"] == 3 and task["code_chars"] > len(LOAD) and task["result_chars"] > 0
    assert task["exec_s"] > 0
    text = (tmp_path / "report.md").read_text()
    assert "| model m (kept only) |" in text and "| model m (fresh only) |" in text


def test_stepwise_gives_the_steps_one_at_a_time(tmp_path: Path) -> None:
    from coordex.eval.suite import BY_NAME

    steps = BY_NAME["ledger-audit"].steps
    seen_users: list[int] = []

    def person(body: dict[str, Any]) -> dict[str, Any]:
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        seen_users.append(len(users))
        last = body["messages"][-1]
        if last["role"] == "user":  # a new step: one call for it
            return {"tool_calls": [tool_call(len(seen_users), "execute_code",
                                             {"code": "1 + 1"})]}
        return {"content": f"done with step {len(users)}"}

    with ChatServer(person) as server:
        assert run_eval(tmp_path, "--policy", "model", "--base-url", server.base_url,
                        "--model", "m", "--stepwise", "--tasks", "ledger-audit") == 0
        first = [m["content"] for m in server.requests[0]["messages"] if m["role"] == "user"]
        last = [m["content"] for m in server.requests[-1]["messages"] if m["role"] == "user"]
    assert len(first) == 1 and first[0].count("Step ") == 1 and "Step 1 of 9:" in first[0]
    assert len(last) == len(steps) and last[-1].startswith(f"Step {len(steps)} of {len(steps)}:")
    assert max(seen_users) == len(steps)
    task = load(tmp_path)["tasks"][0]
    assert task["calls"] == len(steps)
    assert task["tokens"] == 2 * len(steps) * TOKENS_PER_REPLY


def test_chart_draws_zero_on_an_axis_from_zero(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from coordex.eval import report as reports

    totals = {"tasks": 1, "succeeded": 0, "wall_s": 0.0, "redo_s": 0.0, "stale_errors": 0,
              "tokens": None, "calls": 0, "code_chars": 0, "result_chars": 0, "exec_s": 0.0}
    drawn: list[tuple[float, float]] = []
    real_savefig = plt.Figure.savefig

    def keep_limits(figure: Any, *args: Any, **kwargs: Any) -> None:
        drawn.extend(ax.get_ylim() for ax in figure.axes)
        real_savefig(figure, *args, **kwargs)

    plt.Figure.savefig = keep_limits  # type: ignore[method-assign]
    try:
        reports.chart([{"policy": "kept", "model": None, "total": totals}], tmp_path / "c.png")
    finally:
        plt.Figure.savefig = real_savefig  # type: ignore[method-assign]
    assert drawn and all(low == 0 and high > 0 for low, high in drawn)
