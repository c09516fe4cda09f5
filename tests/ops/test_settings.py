"""One source per setting (issue #14): `FleetSettings` writes each default once; every field is an
environment variable and a `lousho` option, and both reach the settings a worker's app is built with."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, get_type_hints

import pytest
from typer.testing import CliRunner

from lousho.cli import app as cli
from lousho.fleet.settings import FleetSettings
from lousho.settings import LoushoSettings, fleet_env_var

FIELDS = [field.name for field in dataclasses.fields(FleetSettings)]
TYPES = get_type_hints(FleetSettings)
PROBE = "tests.ops.settings_probe"


def another_value(name: str) -> Any:
    """A value of the field's type that is not its default."""
    default = getattr(FleetSettings(), name)
    kind = TYPES[name]
    if kind is bool:
        return not default
    if kind is str or kind == str | None:  # the queue: None names each app's own (issue #15)
        return f"{default or 'lousho'}-other"
    if kind is int:
        return default + 2
    return (default or 1.0) + 1.25  # float, or float | None


def flags(name: str, value: Any) -> list[str]:
    flag = f"--{name.replace('_', '-')}"
    if isinstance(value, bool):
        return [flag if value else f"--no-{flag[2:]}"]
    return [flag, str(value)]


@pytest.fixture(autouse=True)
def no_fleet_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FIELDS:
        monkeypatch.delenv(fleet_env_var(name), raising=False)


def worker_settings(args: list[str], env: dict[str, str] | None = None) -> FleetSettings:
    """The fleet settings `lousho <args> worker --app <probe>` hands the worker's app module."""
    sys.modules.pop(PROBE, None)
    result = CliRunner().invoke(cli, [*args, "worker", "--app", f"{PROBE}:no_app"], env=env)
    assert result.exit_code == 1 and "has no 'no_app'" in result.output, result.output  # stops before celery
    seen = sys.modules[PROBE].seen
    assert isinstance(seen, FleetSettings)
    return seen


@pytest.mark.parametrize("name", FIELDS)
def test_each_fleet_setting_reaches_the_worker_from_its_environment_variable(name: str) -> None:
    value = another_value(name)
    seen = worker_settings([], env={fleet_env_var(name): str(value)})
    assert getattr(seen, name) == value
    assert dataclasses.replace(seen, **{name: getattr(FleetSettings(), name)}) == FleetSettings()


@pytest.mark.parametrize("name", FIELDS)
def test_each_fleet_setting_reaches_the_worker_from_its_lousho_option(name: str) -> None:
    value = another_value(name)
    seen = worker_settings(flags(name, value))
    assert getattr(seen, name) == value
    assert dataclasses.replace(seen, **{name: getattr(FleetSettings(), name)}) == FleetSettings()


def test_the_fleet_defaults_are_fleet_settings_own_everywhere() -> None:
    assert LoushoSettings().fleet == FleetSettings()
    assert worker_settings([]) == FleetSettings()
    assert LoushoSettings(queue="tour").fleet == FleetSettings(queue="tour")
    assert not set(FIELDS) & set(LoushoSettings.model_fields), "no FleetSettings field is repeated in LoushoSettings"
