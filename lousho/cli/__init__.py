"""The `lousho` command (issue #32: a package, one module per command group).

`root` builds the app and registers each group's commands; the groups (`sessions`, `jobs`, `approvals`,
`evaluation`, `fleet`, `metrics`, `reseal`) import only the shared modules below them (`context`, `render`,
`watch`, `conventions`, `exits`) and the operations layer (`lousho.operations`), never the root nor each other, and
never the dashboard (import contracts in pyproject.toml)."""

from __future__ import annotations

from lousho.cli.context import settings_of
from lousho.cli.root import app, main

__all__ = ["app", "main", "settings_of"]
