"""``advisor mcp`` (issue 35, item 4), driven over stdio as a client would: the specification's
own example messages (lifecycle, tools/list, tools/call, errors), tools that give what
``advisor report`` gives, and apply/revert only with ``--allow-apply``, reaching a live session's
controller over its control path."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from advisor.records.plan import read_plan
from advisor.report import build_report
from recorded import load_state, write_session

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 24_000_000  # below tests/data/gpt's peak: a memory diagnosis with a live recommendation
READ_ONLY = ["list_sessions", "read_report_section", "get_advice", "get_evidence", "write_plan"]


class Client:
    """``advisor mcp`` in a subprocess: one JSON-RPC message a line each way."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "advisor", "mcp", *args], cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()
        self.next_id = 100

    def send(self, message: object) -> None:
        self.proc.stdin.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 120) -> object:
        return json.loads(self.lines.get(timeout=timeout))

    def request(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, **({"params": params} if params else {})})
        answer = self.receive()
        assert answer["id"] == self.next_id and answer["jsonrpc"] == "2.0", answer
        return answer

    def call(self, name: str, **arguments: object) -> dict:
        result = self.request("tools/call", {"name": name, "arguments": arguments})["result"]
        assert json.loads(result["content"][0]["text"]) == result["structuredContent"]  # the text is the JSON
        return result

    def close(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0  # ends at the end of its input
        self.proc.stderr.close()


@pytest.fixture
def home() -> Path:
    return Path(os.environ["ADVISOR_HOME"])


@pytest.fixture
def client(home: Path):
    write_session("gpt", home)
    started = Client()
    yield started
    started.close()


def test_the_specifications_lifecycle_and_tool_list(client: Client) -> None:
    # The lifecycle page's initialize request, as written there.
    client.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2024-11-05", "capabilities": {"roots": {"listChanged": True}, "sampling": {}},
        "clientInfo": {"name": "ExampleClient", "version": "1.0.0"}}})
    answer = client.receive()
    assert answer["id"] == 1 and answer["jsonrpc"] == "2.0"
    result = answer["result"]
    assert result["protocolVersion"] == "2024-11-05"  # the client's, since it is supported
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"]["name"] == "advisor" and result["serverInfo"]["version"]
    assert "get_advice" in result["instructions"]
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})  # a notification: no answer
    assert client.request("ping")["result"] == {}  # the next line answers the ping
    later = client.request("initialize", {"protocolVersion": "1999-01-01", "capabilities": {},
                                          "clientInfo": {"name": "x", "version": "0"}})
    assert later["result"]["protocolVersion"] == "2025-11-25"  # unsupported: the server's latest
    tools = client.request("tools/list", {"cursor": "optional-cursor-value"})["result"]["tools"]
    assert [t["name"] for t in tools] == READ_ONLY  # read-only by default: no apply, no revert
    for tool in tools:
        assert tool["inputSchema"]["type"] == "object" and tool["description"] and tool["title"]
        assert tool["annotations"]["readOnlyHint"] is (tool["name"] != "write_plan")


def test_the_tools_give_what_advisor_report_gives(client: Client, home: Path, tmp_path: Path) -> None:
    expected = build_report(load_state("gpt"), budget_bytes=BUDGET)
    [session] = client.call("list_sessions")["structuredContent"]["sessions"]
    assert session["finished"] is True and session["live"] is False and session["status"].startswith("exit 0")
    advice = client.call("get_advice", session=session["id"], memory_budget=BUDGET)
    assert advice["isError"] is False
    advice = advice["structuredContent"]
    assert advice["diagnosis"] == expected["diagnosis"]
    assert [r["id"] for r in advice["recommendations"]] == [r["id"] for r in expected["recommendations"]]
    top = expected["recommendations"][0]
    assert advice["recommendations"][0]["predicted"] == top["predicted"] and top["live"]
    evidence = client.call("get_evidence", finding=top["id"], memory_budget="24MB")["structuredContent"]  # a size
    assert evidence["evidence"] == top["evidence"] and evidence["params"] == top["params"]
    why = client.call("get_evidence", finding="diagnosis", memory_budget=BUDGET)["structuredContent"]
    assert why["evidence"] == expected["diagnosis"]["evidence"]
    steps = client.call("read_report_section", section="steps", limit=2)["structuredContent"]
    assert steps["value"] == expected["steps"][-2:] and f"of {len(expected['steps'])}" in steps["note"]
    plan = tmp_path / "plan.json"
    written = client.call("write_plan", output=str(plan), memory_budget=BUDGET)["structuredContent"]
    assert written["written"] is True and "wrote plan" in written["output"]  # planning's own words, not on stdout
    assert read_plan(str(plan)).remedies[0].remedy == top["remedy"]


def test_mistakes_get_the_specifications_errors(client: Client) -> None:
    client.send("{not json")
    assert client.receive()["error"]["code"] == -32700
    assert client.request("resources/list")["error"]["code"] == -32601
    unknown = client.request("tools/call", {"name": "apply_recommendation", "arguments": {"recommendation_id": "x"}})
    assert unknown["error"] == {"code": -32602, "message": "Unknown tool: apply_recommendation"}
    missing = client.call("get_evidence")
    assert missing["isError"] is True and "needs the argument 'finding'" in missing["structuredContent"]["error"]
    wrong = client.call("read_report_section", section="nope")
    assert wrong["isError"] is True and "memory" in wrong["structuredContent"]["hint"]
    assert client.call("get_advice", session="no-such-session")["isError"] is True
    assert client.call("get_advice", memory_budget=True)["isError"] is True  # not a size
    client.send([{"jsonrpc": "2.0", "id": "a", "method": "ping"}, {"jsonrpc": "2.0", "method": "notifications/x"},
                 {"jsonrpc": "2.0", "id": "b", "method": "ping"}])
    assert [a["id"] for a in client.receive()] == ["a", "b"]  # a batch, answered as one


@pytest.mark.slow
def test_apply_and_revert_reach_a_live_session_only_when_allowed(home: Path, tmp_path: Path) -> None:
    done = tmp_path / "done"
    job = subprocess.Popen([sys.executable, "-m", "advisor", "attach", "--headless", "tests/scripts/tiny_train.py",
                            "--steps", "400", "--sleep", "0.1", "--done-file", str(done)], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = Client("--allow-apply")
    try:
        deadline = time.monotonic() + 120
        while not list((home / "sessions").glob("*/control.json")):
            assert time.monotonic() < deadline and job.poll() is None, job.stderr.read() if job.poll() else "no control"
            time.sleep(0.2)
        tools = client.request("tools/list")["result"]["tools"]
        assert [t["name"] for t in tools] == [*READ_ONLY, "apply_recommendation", "revert_remedy"]
        [session] = client.call("list_sessions")["structuredContent"]["sessions"]
        assert session["live"] is True and session["finished"] is False
        refused = client.call("apply_recommendation", recommendation_id="no-such-remedy")
        assert refused["isError"] is True  # the live controller's own refusal, as the TUI shows it
        assert refused["structuredContent"]["error"] == "No recommendation 'no-such-remedy'."
        nothing = client.call("revert_remedy")
        assert nothing["structuredContent"]["error"] == "Nothing to revert: no remedy is in force."
    finally:
        job.terminate()
        job.wait(120)
        job.stderr.close()
    after = client.call("apply_recommendation", session=session["id"], recommendation_id="no-such-remedy")
    assert after["isError"] is True and "no running controller" in after["structuredContent"]["error"]
    client.close()
