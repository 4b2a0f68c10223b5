"""A server that answered is the child just started, not another one that took its
port first (ops/testing/listener.py): the suite runs two processes at a time, and
``free_port`` may hand both the same port. CI once ran a test against a stranger's
tool server that way (a 409 for a slot the stranger had never leased)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.support.toolserver as toolserver_module
from ops.testing.listener import group_listens_on
from ops.testing.stack import Child, StackError, free_port, start_toolserver, wait_http
from runner.core.settings import Settings
from tests.support.toolserver import ToolServer, child_env

SERVE = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)


@pytest.fixture
def stranger(tmp_path: Path) -> Iterator[tuple[Child, int]]:
    """Another process's HTTP server, answering every GET with 200."""
    port = free_port()
    child = Child("stranger", [sys.executable, "-c", SERVE, str(port)], {}, tmp_path / "s.out")
    try:
        wait_http(child, f"http://127.0.0.1:{port}/healthz", 30)
        yield child, port
    finally:
        child.stop()


def test_the_listener_is_found_in_its_own_group_only(
    stranger: tuple[Child, int], tmp_path: Path
) -> None:
    child, port = stranger
    other = Child("idle", [sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "i")
    try:
        assert group_listens_on(child.pid, port)
        assert not group_listens_on(other.pid, port)
        assert not group_listens_on(child.pid, free_port())
    finally:
        other.stop()


def test_a_server_whose_port_is_taken_is_not_taken_for_up(
    stranger: tuple[Child, int], settings: Settings, tmp_path: Path
) -> None:
    """The stranger answers the health URL at once; the tool server fails to bind and
    says so, instead of the stranger standing in for it."""
    _, port = stranger
    env = child_env(settings, SLOTRUNNER_TOOLSERVER_URL=f"http://127.0.0.1:{port}")
    with pytest.raises(StackError, match=r"(?i)address already in use"):
        start_toolserver(env, port, tmp_path / "logs").stop()  # stopped if it wrongly came up


def test_the_test_tool_server_takes_another_port_when_its_own_was_taken(
    stranger: tuple[Child, int],
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, port = stranger
    handed = iter([port])
    monkeypatch.setattr(toolserver_module, "free_port", lambda: next(handed, None) or free_port())
    server = ToolServer(settings, tmp_path / "logs")
    try:
        assert server.port != port
        assert group_listens_on(server.child.pid if server.child else 0, server.port)
    finally:
        server.stop()
