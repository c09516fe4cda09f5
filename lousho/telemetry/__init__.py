"""Metrics and traces of a lousho fleet (issue #19): docs/observability.md.

- `lousho.telemetry.metrics`: Prometheus metrics (`metrics_app(store)` for `/metrics`; extra `metrics`);
- `lousho.telemetry.traces`: OpenTelemetry spans, one trace per run (extra `otel`);
- `lousho.telemetry.hooks`: where a worker and the reaper are measured (Celery signals), turned on by
  `LOUSHO_METRICS=1` / `LOUSHO_TRACES=otlp` or `enable(...)`;
- `lousho.telemetry.counters`: the fleet-wide event counts kept in Redis.

Importing this package imports neither prometheus_client nor OpenTelemetry.
"""
