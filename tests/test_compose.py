"""compose.yaml, read as compose reads it (Docker cannot run here): one Redis that keeps
its data and never evicts, hosts that share nothing else, each with a token, and
Flower on the pool; every command it runs is a real verb with real options."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import yaml
from click.testing import CliRunner

from runner.cli.main import main
from tests.support.repos import REPO

COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
HOST_PARTS = {"toolserver", "worker", "detector"}


def hosts() -> dict[str, dict[str, dict[str, Any]]]:
    """host id -> its services by part (the verb each runs)."""
    found: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for service in SERVICES.values():
        host = (service.get("environment") or {}).get("SLOTRUNNER_HOST_ID")
        if host is not None:
            command = service["command"]
            part = "detector" if command[1:3] == ["ops", "detect"] else command[1]
            found[host][part] = service
    return found


def home_volume(service: dict[str, Any]) -> str:
    home = service["environment"]["SLOTRUNNER_HOME"]
    (volume,) = [v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == home]
    return str(volume)


def test_redis_keeps_its_data_and_never_evicts() -> None:
    command = SERVICES["redis"]["command"]
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert command[0] == "redis-server"
    assert flags["--appendonly"] == "yes" and flags["--maxmemory-policy"] == "noeviction"
    assert any(v.endswith(":/data") for v in SERVICES["redis"]["volumes"])


def test_each_host_is_a_unit_with_its_own_id_home_tool_server_and_token() -> None:
    """Two hosts or more; each runs a tool server, a worker and a detector on one home of
    its own, calls its own tool server, and needs a token of its own (off loopback)."""
    by_host = hosts()
    assert len(by_host) >= 2
    homes, tokens = set(), set()
    for host, parts in by_host.items():
        assert set(parts) == HOST_PARTS, host
        envs = [service["environment"] for service in parts.values()]
        assert all(env == envs[0] for env in envs), f"{host}: its services disagree"
        env = envs[0]
        (home,) = {home_volume(service) for service in parts.values()}
        homes.add(home)
        url = re.fullmatch(r"http://([\w-]+):(\d+)", env["SLOTRUNNER_TOOLSERVER_URL"])
        assert url is not None and SERVICES[url.group(1)] is parts["toolserver"], host
        server = parts["toolserver"]["command"]
        assert server[server.index("--host") + 1] == "0.0.0.0"
        assert server[server.index("--port") + 1] == url.group(2)
        token = re.fullmatch(r"\$\{(\w+):\?.+\}", env["SLOTRUNNER_TOKEN"])
        assert token is not None, f"{host}: compose must refuse to start without a token"
        tokens.add(token.group(1))
        assert env["REDIS_URL"] == "redis://redis:6379/0"
    assert len(homes) == len(tokens) == len(by_host)  # nothing shared but Redis


def test_flower_watches_the_pool_through_the_celery_module() -> None:
    command = SERVICES["flower"]["command"]
    assert command[:4] == ["celery", "-A", "runner.celery_app", "flower"]
    assert (REPO / "runner" / "celery_app.py").is_file() and (REPO / "Dockerfile").is_file()
    assert SERVICES["flower"]["environment"]["REDIS_URL"] == "redis://redis:6379/0"


def test_every_command_is_a_real_verb_with_real_options() -> None:
    commands = {tuple(s["command"]) for s in SERVICES.values() if s["command"][0] == "slotrunner"}
    for command in commands:
        verb = [word for word in command[1:] if not word.startswith("-")][:2]
        verb = verb if verb[0] == "ops" else verb[:1]
        shown = CliRunner().invoke(main, [*verb, "--help"], prog_name="slotrunner")
        assert shown.exit_code == 0, (command, shown.output)
        for option in (word.split("=")[0] for word in command if word.startswith("--")):
            assert option in shown.output, (command, option)
