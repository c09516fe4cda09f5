"""One settings object for the `lousho` command, the demo and app modules: flags and environment.

| variable | what |
| - | - |
| `LOUSHO_REDIS_URL` (or `REDIS_URL`) | the Redis of the fleet: the Celery broker, and the store unless `LOUSHO_STORE_URL` says otherwise; unset: the local store (`LOUSHO_HOME`, `lousho.local_redis`) |
| `LOUSHO_BROKER_URL` | the Celery broker when it is not the fleet's Redis: `amqp://...` for RabbitMQ (docs/topologies.md, issue #18) |
| `LOUSHO_STORE_URL` | where checkpoints live: `redis://...` (RedisStore), `sqlite:///path.db`, `postgresql://...` (SqlStore), `file:///dir` (FileStore), `dbm:///path.db` (the mapping store), or a scheme of `lousho.stores.registry` |
| `LOUSHO_PREFIX` | the RedisStore key prefix (default `lousho:`) |
| `LOUSHO_PAYLOAD_KEYS`, `LOUSHO_PAYLOAD_COMPRESS` | the stores' payload codec (`k2:<base64>,k1:<base64>`, the first key writes; `1` to compress): `PayloadCodec.from_env()`, docs/stores.md |
| `LOUSHO_APP` | the Celery app of `lousho worker` (`module:attr`) |
| `LOUSHO_<FIELD>` | each `FleetSettings` field: `LOUSHO_QUEUE`, `LOUSHO_LEASE_TTL_S`, `LOUSHO_MAX_ATTEMPTS`, ... |

The fleet's settings are `FleetSettings` (lousho/fleet/settings.py), the one place their defaults
are written: `LoushoSettings.fleet` is one, read field by field from `LOUSHO_<FIELD>` (issue #14).

A URL is only ever shown with its password masked (`lousho.redaction.redact_url`): in errors, logs
and `repr()` (issue #21).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from lousho.errors import ConfigurationError
from lousho.fleet.settings import FleetSettings
from lousho.redaction import redact_url
from lousho.store_bundle import StoreBundle

if TYPE_CHECKING:
    from lousho.scheduler.client import Client
    from lousho.stores.redis import RedisStore

__all__ = ["ChildEnv", "LoushoSettings", "default_redis_url", "fleet_env_var", "store_from_url"]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://", "redis+cluster://")  # issue #18
_URL_FIELDS = ("redis_url", "store_url", "broker_url")


class ChildEnv(dict[str, str]):
    """Environment variables for a child process: the real values (passwords included), but shown
    (`repr`, `str`, a log line) with every URL's password masked (issue #21)."""

    def __repr__(self) -> str:
        return repr({name: redact_url(value) if name.endswith("_URL") else value for name, value in self.items()})

    __str__ = __repr__


FLEET_FIELDS = tuple(field.name for field in dataclasses.fields(FleetSettings))
"""The names of `FleetSettings`' fields: each is an environment variable and a `lousho` option."""


def fleet_env_var(name: str) -> str:
    """The environment variable of a `FleetSettings` field: `LOUSHO_<FIELD>`."""
    return f"LOUSHO_{name.upper()}"


class _FleetEnv(PydanticBaseSettingsSource):
    """`FleetSettings`' fields from `LOUSHO_<FIELD>`, as `{"fleet": {...}}` (validated with the model)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # the whole `fleet` value is made in __call__

    def __call__(self) -> dict[str, Any]:
        found = {name: os.environ[fleet_env_var(name)] for name in FLEET_FIELDS if fleet_env_var(name) in os.environ}
        return {"fleet": found} if found else {}


class LoushoSettings(BaseSettings):
    """Configuration from the environment; the CLI's flags override it field by field.

    `fleet` takes its defaults from `FleetSettings`; its fields may also be given flat
    (`LoushoSettings(queue="tour", lease_ttl_s=2)`), as the environment gives them."""

    model_config = SettingsConfigDict(env_prefix="LOUSHO_", extra="ignore", populate_by_name=True)

    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("LOUSHO_REDIS_URL", "REDIS_URL", "redis_url")
    )
    store_url: str | None = None
    broker_url: str | None = None
    """The Celery broker, when it is not the fleet's Redis (RabbitMQ: `amqp://...`, issue #18)."""
    prefix: str = "lousho:"
    app: str | None = None
    fleet: FleetSettings = Field(default_factory=FleetSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _FleetEnv(settings_cls), dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _flat_fleet_fields(cls, data: Any) -> Any:
        """`lease_ttl_s=...` given flat goes into `fleet`, over what the environment said."""
        if not isinstance(data, dict) or not any(name in data for name in FLEET_FIELDS):
            return data
        data = dict(data)
        fleet = data.get("fleet") or {}
        fleet = dataclasses.asdict(fleet) if isinstance(fleet, FleetSettings) else dict(fleet)
        data["fleet"] = {**fleet, **{name: data.pop(name) for name in FLEET_FIELDS if name in data}}
        return data

    def with_overrides(self, **values: Any) -> LoushoSettings:
        """A copy with the given (non-None) values replaced: how flags win over the environment."""
        given = {k: v for k, v in values.items() if v is not None}
        fleet = {k: given.pop(k) for k in FLEET_FIELDS if k in given}
        if fleet:
            given["fleet"] = dataclasses.replace(self.fleet, **fleet)
        return self.model_copy(update=given)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """`repr()` and `str()` show that a URL is set and which one, never its password (issue #21)."""
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name in _URL_FIELDS and isinstance(value, str) else value

    def env(self) -> ChildEnv:
        """Environment variables that carry these settings to a child process (a worker's app module).

        The values are real, passwords included: a child must be able to connect. Only hand them to a
        process; printing or logging the mapping itself shows the URLs redacted (`ChildEnv`)."""
        env = {
            "LOUSHO_PREFIX": self.prefix,
            **{
                fleet_env_var(name): str(value)
                for name, value in dataclasses.asdict(self.fleet).items()
                if value is not None
            },
            "LOUSHO_STORE_URL": self.store_url or "",
        }
        if self.redis_url:
            env["LOUSHO_REDIS_URL"] = self.redis_url
        if self.broker_url:
            env["LOUSHO_BROKER_URL"] = self.broker_url
        if self.app:
            env["LOUSHO_APP"] = self.app
        return ChildEnv(env)

    def require_redis_url(self) -> str:
        """The fleet's Redis: `redis_url`, else a Redis `store_url`, else the local store (`default_redis_url`)."""
        if not self.redis_url and self.store_url and self.store_url.startswith(_REDIS_SCHEMES):
            return self.store_url
        return self.redis_url or default_redis_url()

    def broker(self) -> str:
        """`broker_url` when set (RabbitMQ, issue #18), else the fleet's Redis as kombu spells it."""
        from lousho.fleet.settings import broker_url

        return self.broker_url or broker_url(self.require_redis_url())

    def store(self) -> StoreBundle:
        """The store named by `LOUSHO_STORE_URL` (any registered scheme), else the RedisStore on the fleet's Redis."""
        if self.store_url:
            return store_from_url(self.store_url, prefix=self.prefix)
        return self.redis_store()

    def redis_store(self) -> RedisStore:
        """The fleet's store: a RedisStore (the fleet keeps its leases and in-flight index beside it)."""
        from lousho.stores.redis import RedisStore

        if self.store_url and not self.store_url.startswith(_REDIS_SCHEMES):
            raise ConfigurationError(
                f"the fleet needs a Redis store, but LOUSHO_STORE_URL is {redact_url(self.store_url)!r}; "
                "unset it (the fleet's Redis is used) or point it at a redis:// URL"
            )
        from lousho.stores.codec import PayloadCodec

        return RedisStore(self.store_url or self.require_redis_url(), prefix=self.prefix, codec=PayloadCodec.from_env())

    def client(self) -> Client:
        """The web-app `Client` on this configuration (broker and store)."""
        from lousho.scheduler.client import Client

        store = self.redis_store()
        return Client(broker=self.broker(), store=store, settings=self.fleet)


def default_redis_url() -> str:
    """The Redis when none is configured: the local store that the demo and every `lousho` command share, started
    on demand under `LOUSHO_HOME` and stopped when idle (`lousho.local_redis`), so what one command wrote the next
    finds (issue #15). `LOUSHO_LOCAL_REDIS=off` makes a missing Redis setting a `ConfigurationError` again."""
    from lousho.local_redis import local_redis_url

    return local_redis_url()


def store_from_url(url: str, *, prefix: str = "lousho:") -> StoreBundle:
    """The store bundle a URL names, by its scheme (`lousho.stores.registry`, issue #16): redis://, rediss://
    or unix:// -> RedisStore, sqlite:///path -> SqliteStore, postgresql://... -> SqlStore, file:///dir ->
    FileStore, dbm:///path -> the mapping store on a dbm file, and any scheme registered with `register_store`."""
    from lousho.stores.registry import open_store

    return open_store(url, prefix=prefix)
