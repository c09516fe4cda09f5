"""What every `lousho` command does the way celery, git and docker do (issue #15): `--version`, `-h`, the
global options (`--redis-url`, `--store-url`, `--prefix` and each fleet setting) before or after the
command, readable help placeholders (`URL`, `SECONDS`, `SESSION`, not `<str>` or `<list[str]>`), and a
usage error on one line with the way to help.

`apply_conventions(group)` is called by the root group once typer has built it and its commands, so a
command registered anywhere (any module of `lousho.cli`, one added later) follows them with nothing to
write."""

from __future__ import annotations

import copy
from typing import Any, NoReturn

import typer
from typer.core import TyperArgument, TyperOption

from lousho._version import __version__

__all__ = [
    "GLOBAL_PANEL",
    "USAGE_ERROR",
    "apply_conventions",
    "fail_usage",
    "given_after_the_command",
    "installed_version",
    "show_version",
]

GLOBAL_PANEL = "Global options (before or after the command)"
_VISIBLE_EVERYWHERE = ("redis_url", "store_url", "prefix")
"""Shown in every command's help; the fleet settings are accepted there too, and listed by `lousho -h`."""
_AFTER = "lousho.global-options-after-the-command"

USAGE_ERROR: type[Exception] = typer.BadParameter.__bases__[0]
"""The usage error of the click that typer runs on (typer re-exports only its subclass BadParameter)."""


def installed_version() -> str:
    """lousho's version: the one in `lousho/_version.py`, which the wheel's metadata is built from (issue #35)."""
    return __version__


def show_version(value: bool) -> None:
    """`lousho --version` (an eager option of the root: it answers before any command or setting is read)."""
    if value:
        typer.echo(f"lousho {installed_version()}")
        raise typer.Exit()


def apply_conventions(group: Any, global_names: frozenset[str]) -> None:
    """Give each of `group`'s commands the root's options named in `global_names`, and every parameter a
    readable placeholder."""
    shared = [param for param in group.params if param.name in global_names]
    for command in group.commands.values():
        _accept_global_options(command, shared)
    for command in (group, *group.commands.values()):
        for param in command.params:
            _readable_placeholder(param)
        _help_without_placeholder(command)
        _options_by_panel(command)


def _options_by_panel(command: Any) -> None:
    """Plain help (click's formatter: 80 columns, words wrapped, every flag whole; issue #32) with the options in
    their panels ('Options', the global options): rich's tables cut long flags and their help at 80 columns."""

    def format_options(ctx: Any, formatter: Any) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                default = "Arguments" if isinstance(param, TyperArgument) else "Options"
                panels.setdefault(getattr(param, "rich_help_panel", None) or default, []).append(record)
        for panel, records in panels.items():
            with formatter.section(panel):
                formatter.write_dl(records)
        if hasattr(command, "format_commands"):
            command.format_commands(ctx, formatter)

    command.format_options = format_options


def _help_without_placeholder(command: Any) -> None:
    """`-h, --help` without typer's `<bool>`: the help option is made per context, on first use, so its
    placeholder is set there (issue #15)."""
    make = command.get_help_option

    def get_help_option(ctx: Any) -> Any:
        option = make(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option


def _accept_global_options(command: Any, shared: list[Any]) -> None:
    """A copy of each global option on `command`, which records its value for `given_after_the_command`
    instead of passing it to the command's function. An option the command has itself stays its own."""
    taken = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    names = {param.name for param in command.params}
    for param in shared:
        if param.name in names or taken & {*param.opts, *param.secondary_opts}:
            continue
        after = copy.copy(param)
        after.callback = _remember_after
        after.expose_value = False
        after.hidden = param.name not in _VISIBLE_EVERYWHERE
        after.rich_help_panel = GLOBAL_PANEL
        command.params.append(after)


def _remember_after(ctx: Any, param: Any, value: Any) -> Any:
    if value is not None:
        ctx.find_root().meta.setdefault(_AFTER, {})[param.name] = value
    return value


def given_after_the_command(ctx: Any) -> dict[str, Any]:
    """The global options given after the command (they win over the same ones before it, as the last of a
    repeated option does)."""
    given: dict[str, Any] = ctx.find_root().meta.get(_AFTER, {})
    return dict(given)


def _readable_placeholder(param: Any) -> None:
    if isinstance(param, TyperArgument):
        param.metavar = param.metavar or param.name.upper()
        # typer shows an argument's Python type (`<str>`) beside its name whatever its metavar: show the name alone
        for method in ("display_type", "display_type_rich"):
            if hasattr(param, method):
                setattr(param, method, lambda ctx: "")
    elif isinstance(param, TyperOption) and param.metavar is None:
        param.metavar = "" if param.is_flag else _placeholder_of(param)


def _placeholder_of(option: Any) -> str:
    """A word for an option's value, from its choices, its name or its type."""
    descriptor = getattr(option, "type_descriptor", None)
    choices = getattr(descriptor, "choices", None)
    if choices:
        return f"[{'|'.join(str(choice) for choice in choices)}]"
    annotation = getattr(descriptor, "annotation", str)
    if str(option.name).endswith("_s") and annotation in (int, float):
        return "SECONDS"
    return {int: "N", float: "NUMBER"}.get(annotation, "TEXT")


def fail_usage(exc: Exception) -> NoReturn:
    """A usage error (an unknown option, a value that is not one of the choices) as one line on stderr, with the
    command whose help to read, and exit status 2 (click's, for usage errors)."""
    ctx = getattr(exc, "ctx", None)
    path = " ".join(["lousho", *(ctx.command_path.split()[1:] if ctx is not None else [])])
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    message = " ".join(message.replace("Value error, ", "").split())
    typer.echo(f"error: [LOUSHO_USAGE] {message} (see `{path} -h`)", err=True)
    raise typer.Exit(2)
