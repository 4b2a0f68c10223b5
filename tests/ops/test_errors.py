"""The ops package's error tree: one root, and every public error drawn in ops/errors.py."""

from __future__ import annotations

import re

import ops
from ops import errors
from ops.errors import OpsError
from tests.support.errortree import assert_drawn_as_defined, public_errors


def _public_errors() -> dict[str, type[BaseException]]:
    return public_errors(ops)


def test_every_public_error_derives_from_the_root_and_is_drawn() -> None:
    """No exception class of ops stands outside OpsError or outside the drawing."""
    found = _public_errors()
    assert len(found) >= 8, sorted(found)
    assert_drawn_as_defined(found, OpsError, errors.__doc__)


def test_each_drawn_error_names_the_module_that_defines_it() -> None:
    """The module written beside a name in the drawing is where that class lives."""
    found = {cls.__name__: cls.__module__ for cls in _public_errors().values()}
    del found["OpsError"]
    doc = errors.__doc__ or ""
    for name, module in found.items():
        assert re.search(rf"{name}\s+{re.escape(module)}:", doc), name
