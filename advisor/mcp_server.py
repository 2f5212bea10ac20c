"""``advisor mcp``: a Model Context Protocol server on stdio, for coding agents.

A small JSON-RPC 2.0 implementation of the parts of MCP a tool server needs, rather than the
official SDK, whose dependencies (an ASGI web stack, an HTTP server, JWT) this stdio-only server
would never use. The transport is the spec's stdio one: one JSON-RPC message a line on stdin and
stdout (never a newline inside one), diagnostics on stderr, nothing else on stdout. The lifecycle
and messages follow the specification (revisions 2024-11-05 to 2025-11-25):

- ``initialize`` answers ``protocolVersion`` (the client's when supported, else the latest),
  ``capabilities`` ``{"tools": {"listChanged": false}}``, ``serverInfo`` and ``instructions``;
  ``notifications/initialized`` and other notifications get no answer; ``ping`` answers ``{}``;
- ``tools/list`` answers every tool with its ``name``, ``title``, ``description``,
  ``inputSchema`` (a JSON Schema object) and ``annotations`` (``readOnlyHint``, ...);
- ``tools/call`` answers ``{"content": [{"type": "text", "text": JSON}], "structuredContent",
  "isError"}``: a tool's own failure (a session that does not exist, a refused apply, bad
  arguments) is a result with ``isError`` true, so the model can read it and correct itself;
- protocol errors are JSON-RPC errors: -32700 (not JSON), -32600 (not a request), -32601 (no such
  method), -32602 (no such tool, or params that are not an object), -32603 (internal).

A batch (a JSON array, allowed by the 2025-03-26 revision) is answered with an array.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Callable

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")  # newest first
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603


class ToolError(Exception):
    """A tool's own failure: answered as a result with ``isError`` true (``hint`` added)."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True, kw_only=True)
class Tool:
    """One MCP tool: its description for the model and the function that runs it."""

    name: str
    title: str
    description: str
    properties: dict[str, dict[str, Any]]  # JSON Schema of each argument
    run: Callable[[dict[str, Any]], dict[str, Any]]
    required: tuple[str, ...] = ()
    read_only: bool = True
    destructive: bool = False
    annotations: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "description": self.description,
                "inputSchema": {"type": "object", "properties": self.properties, "required": list(self.required),
                                "additionalProperties": False},
                "annotations": {"title": self.title, "readOnlyHint": self.read_only,
                                "destructiveHint": self.destructive, "idempotentHint": self.read_only,
                                "openWorldHint": False, **self.annotations}}

    def check(self, arguments: dict[str, Any]) -> None:
        """The arguments against the schema: no unknown name, every required one, each of its type."""
        for name in arguments:
            if name not in self.properties:
                raise ToolError(f"unknown argument {name!r}; {self.name} takes {', '.join(self.properties) or 'none'}")
        for name in self.required:
            if name not in arguments:
                raise ToolError(f"{self.name} needs the argument {name!r}")
        for name, value in arguments.items():
            wanted = self.properties[name].get("type")
            kinds = wanted if isinstance(wanted, list) else [wanted]
            if not any(_is(value, kind) for kind in kinds):
                raise ToolError(f"argument {name!r} must be {' or '.join(map(str, kinds))}, not {json.dumps(value)}")


def _is(value: Any, kind: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    return kind is None


class McpServer:
    """Answers MCP messages with the given tools; ``serve`` runs it on a pair of streams."""

    def __init__(self, tools: list[Tool], *, name: str, version: str, title: str, instructions: str) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.info = {"name": name, "title": title, "version": version}
        self.instructions = instructions
        self.initialized = False

    def serve(self, stdin: IO[str], stdout: IO[str]) -> int:
        for line in stdin:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:
                answer: Any = _error(None, PARSE_ERROR, f"parse error: {exc}")
            else:
                answer = self.handle(message)
            if answer is not None:
                stdout.write(json.dumps(answer, separators=(",", ":"), default=str) + "\n")
                stdout.flush()
        return 0

    def handle(self, message: Any) -> Any:
        """One message (or a batch) in, its answer out (None for notifications)."""
        if isinstance(message, list):
            if not message:
                return _error(None, INVALID_REQUEST, "an empty batch")
            answers = [a for a in (self._one(m) for m in message) if a is not None]
            return answers or None
        return self._one(message)

    def _one(self, message: Any) -> dict[str, Any] | None:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
            if isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message):
                return None  # a response to a request of ours: we send none, so nothing to match
            return _error(message.get("id") if isinstance(message, dict) else None, INVALID_REQUEST,
                          "not a JSON-RPC 2.0 request")
        request_id, method = message.get("id"), message["method"]
        if "id" not in message:  # a notification: never answered
            if method == "notifications/initialized":
                self.initialized = True
            return None
        if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
            return _error(None, INVALID_REQUEST, "a request id must be a string or an integer")
        params = message.get("params", {})
        if not isinstance(params, dict):
            return _error(request_id, INVALID_PARAMS, "params must be an object")
        try:
            if method == "initialize":
                return _result(request_id, self._initialize(params))
            if method == "ping":
                return _result(request_id, {})
            if method == "tools/list":
                return _result(request_id, {"tools": [tool.describe() for tool in self.tools.values()]})
            if method == "tools/call":
                name = params.get("name")
                if not isinstance(name, str) or name not in self.tools:
                    return _error(request_id, INVALID_PARAMS, f"Unknown tool: {name}")
                arguments = params.get("arguments", {})
                if not isinstance(arguments, dict):
                    return _error(request_id, INVALID_PARAMS, "arguments must be an object")
                return _result(request_id, self._call(self.tools[name], arguments))
        except Exception as exc:  # noqa: BLE001 - a failing request must not end the server
            return _error(request_id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        return _error(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        requested = params.get("protocolVersion")
        version = requested if requested in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        return {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": self.info, "instructions": self.instructions}

    def _call(self, tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
        printed = io.StringIO()  # what the advisor's own code prints: the answer's, never on stdout
        try:
            tool.check(arguments)
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                result = tool.run(arguments)
        except ToolError as exc:
            error = {"error": str(exc), **({"hint": exc.hint} if exc.hint else {})}
            if printed.getvalue().strip():
                error["output"] = printed.getvalue().strip()
            return {"content": [{"type": "text", "text": json.dumps(error, indent=1)}], "structuredContent": error,
                    "isError": True}
        if printed.getvalue().strip():
            result = {**result, "output": printed.getvalue().strip()}
        return {"content": [{"type": "text", "text": json.dumps(result, indent=1, default=str)}],
                "structuredContent": json.loads(json.dumps(result, default=str)), "isError": False}


def _result(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def run_stdio(server: McpServer) -> int:
    """Serve on this process's stdin and stdout (line-buffered text, UTF-8)."""
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", line_buffering=True)
    with contextlib.redirect_stdout(sys.stderr):  # anything else printed goes to stderr
        return server.serve(stdin, stdout)
