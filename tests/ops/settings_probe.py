"""An app module for `lousho worker --app` in tests/ops/test_settings.py: it records the fleet settings a
worker's app would be built with (`LoushoSettings().fleet`, from the environment `lousho worker` gives it)."""

from __future__ import annotations

from lousho.settings import LoushoSettings

seen = LoushoSettings().fleet
