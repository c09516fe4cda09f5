"""What every command reads from its context: its settings, and the target its operations act on (issue #32).

Here, not in the root module, so command modules import it and the root imports them: no circle."""

from __future__ import annotations

import typer

from lousho.cli.conventions import given_after_the_command
from lousho.operations.target import Target, open_target
from lousho.settings import LoushoSettings

__all__ = ["fleet_target_of", "settings_of", "target_of"]


def settings_of(ctx: typer.Context) -> LoushoSettings:
    """The command's settings: the environment, then the global options before the command, then those after it."""
    settings = ctx.find_root().obj
    assert isinstance(settings, LoushoSettings)
    return settings.with_overrides(**given_after_the_command(ctx))


def target_of(ctx: typer.Context, *, read_only: bool = False) -> Target:
    """The target of the command's operations; `read_only` (a command that only reads): a local store that
    does not exist is refused (`StoreNotFoundError`, exit 3), not created (issue #32). The target is closed
    when the command ends."""
    target = open_target(settings_of(ctx), must_exist=read_only)
    ctx.call_on_close(target.close)
    return target


def fleet_target_of(ctx: typer.Context) -> Target:
    """The fleet's target, for a command that steers runs on it (enqueue, resume, abort): a store URL that is not a
    Redis one is refused with what to do (`LoushoSettings.client`)."""
    client = settings_of(ctx).client()
    target = Target(client.store, client)
    ctx.call_on_close(target.close)
    return target
