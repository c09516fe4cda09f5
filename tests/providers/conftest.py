"""Fixtures for the provider tests: a fake OpenAI/Anthropic server, providers on it (through the
official SDKs), tools that count their runs. Every test runs once per API."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from lousho import Tool, ToolContext, define_tool
from lousho.testing.fake_llm_servers import FakeLLMServer

pytest.importorskip("openai")
pytest.importorskip("anthropic")

from lousho.providers.anthropic import AnthropicProvider
from lousho.providers.openai import OpenAIProvider

Provider = OpenAIProvider | AnthropicProvider


class CityArgs(BaseModel):
    city: str


class NoteArgs(BaseModel):
    text: str = "-"
    urgent: bool = False


@dataclass
class ToolRuns:
    """Counts every execution by tool call id."""

    runs: Counter[str] = field(default_factory=Counter)

    def record(self, ctx: ToolContext) -> None:
        self.runs[ctx.tool_call_id] += 1


@pytest.fixture
def runs() -> ToolRuns:
    return ToolRuns()


@pytest.fixture
def weather(runs: ToolRuns) -> Tool[CityArgs]:
    async def execute(args: CityArgs, ctx: ToolContext) -> dict[str, Any]:
        runs.record(ctx)
        return {"city": args.city, "forecast": "sun"}

    return define_tool(name="weather", description="Forecast for a city", input=CityArgs, execute=execute)


@pytest.fixture
def note(runs: ToolRuns) -> Tool[NoteArgs]:
    def execute(args: NoteArgs, ctx: ToolContext) -> dict[str, Any]:
        runs.record(ctx)
        return {"noted": args.text}

    return define_tool(name="note", description="Write a note (every field optional)", input=NoteArgs, execute=execute)


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as fake:
        yield fake


@pytest.fixture(params=["openai", "anthropic"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


MakeProvider = Callable[..., Provider]


@pytest.fixture
async def make_provider(api: str, server: FakeLLMServer) -> AsyncIterator[MakeProvider]:
    """`make_provider(model="...", **options)`: a provider of this test's API on the fake server.
    Every provider made is closed at teardown (inside the test's event loop)."""
    made: list[Provider] = []

    def make(model: str = "model-a", **options: Any) -> Provider:
        provider: Provider
        options.setdefault("api_key", "test-key")
        if api == "openai":
            provider = OpenAIProvider(model, base_url=server.openai_base_url, **options)
        else:
            provider = AnthropicProvider(model, base_url=server.anthropic_base_url, **options)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        await provider.aclose()
