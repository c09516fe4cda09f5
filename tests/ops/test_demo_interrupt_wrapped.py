"""A Ctrl-C that Python hands on wrapped still ends `lousho demo` with its one line (issue #15, #33). Python 3.11
wraps what a class attribute's `__set_name__` raises in RuntimeError: a Ctrl-C that landed while the demo's first
`send_task` imported Celery's canvas came out as `RuntimeError: Error calling __set_name__ on 'cached_property'
instance 'app' in '_chord'` with two tracebacks (a loaded CI run). In process, the demo replaced by a function
that Ctrl-C interrupts the same way."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from lousho.cli import app


class _InterruptedAsItIsSet:
    def __set_name__(self, owner: type, name: str) -> None:
        raise KeyboardInterrupt  # Ctrl-C while Python defines a class of a module being imported


def _demo_interrupted_in_an_import(*_: Any, **__: Any) -> None:
    type("_chord", (), {"app": _InterruptedAsItIsSet()})


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """The command sets SIGINT and SIGTERM's handlers, as a command may: the test's process gets its own back."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("signal_handlers")
def test_a_ctrl_c_that_lands_in_an_import_ends_the_demo_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lousho.demo.fleet.run_fleet_demo", _demo_interrupted_in_an_import)
    result = CliRunner().invoke(app, ["demo"])

    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        "error: [LOUSHO_INTERRUPTED] the demo was stopped; every process it started has ended"
    ]
    assert "Traceback" not in result.output


@pytest.mark.usefixtures("signal_handlers")
def test_an_error_of_the_demo_that_no_ctrl_c_caused_is_not_told_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("a real failure")

    monkeypatch.setattr("lousho.demo.fleet.run_fleet_demo", broken)
    result = CliRunner().invoke(app, ["demo"])

    assert "LOUSHO_INTERRUPTED" not in result.output
    assert isinstance(result.exception, RuntimeError) and str(result.exception) == "a real failure"
