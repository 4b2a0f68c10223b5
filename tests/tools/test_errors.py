"""The tools error tree: one root whose reason is a Reason, every public error drawn."""

from __future__ import annotations

from operator import attrgetter

import httpx
import pytest

import tools
from tests.support.errortree import assert_drawn_as_defined, public_errors
from tools import errors
from tools.client import OutcomeUnknown, ToolCallError, ToolRefused, TransportFailed, _decode
from tools.errors import ToolError
from tools.reasons import Reason


def _public_errors() -> dict[str, type[BaseException]]:
    return public_errors(tools)


def test_every_public_error_derives_from_the_root_and_is_drawn() -> None:
    """No exception class of tools stands outside ToolError or outside the drawing."""
    found = _public_errors()
    assert len(found) >= 12, sorted(found)
    assert_drawn_as_defined(found, ToolError, errors.__doc__)


@pytest.mark.parametrize("cls", sorted(_public_errors().values(), key=attrgetter("__name__")))
def test_every_error_carries_a_reason_value(cls: type[ToolError]) -> None:
    """The one reason type: the client's errors too carry a Reason, never a bare string."""
    assert isinstance(cls.reason, Reason)


def test_a_refusal_keeps_the_servers_reason_and_its_own_text() -> None:
    """A known reason in a 4xx body becomes the Reason; unknown text is kept as sent."""
    with pytest.raises(ToolRefused) as known:
        _decode(httpx.Response(409, json={"error": "stale_generation", "message": "old"}))
    assert known.value.reason is Reason.STALE_GENERATION and known.value.status == 409
    with pytest.raises(ToolRefused) as odd:
        _decode(httpx.Response(418, json={"error": ["teapot"], "message": "short and stout"}))
    assert odd.value.reason is Reason.REFUSED and odd.value.error == "['teapot']"
    with pytest.raises(ToolRefused) as raw:
        _decode(httpx.Response(400, text="not json"))
    assert raw.value.reason is Reason.REFUSED and raw.value.error == "refused"


def test_the_client_errors_are_tool_errors() -> None:
    """One except ToolError catches a refusal, an unknown outcome and a transport failure."""
    for exc in (OutcomeUnknown("x"), TransportFailed("y"), ToolRefused("z", "unauthorized")):
        assert isinstance(exc, ToolCallError) and isinstance(exc, ToolError)
    assert TransportFailed("y").reason is Reason.TRANSPORT_FAILED
