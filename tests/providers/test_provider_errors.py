"""How SDK errors become `ProviderError`s, invalid tool-call JSON, and how the providers are configured."""

from __future__ import annotations

import socket
import sys
from typing import Any

import pytest

from lousho import create_agent, memory_store
from lousho.errors import ConfigurationError, ProviderError
from lousho.messages import Message
from lousho.providers.anthropic import AnthropicProvider
from lousho.providers.base import ModelRequest, StreamingProvider
from lousho.providers.openai import OpenAIProvider
from lousho.testing.fake_llm_servers import FakeLLMServer, call, cut_stream, failure, rate_limited, reply

from .conftest import MakeProvider, ToolRuns

REQUEST = ModelRequest(model="model-a", messages=[Message.system("Be brief."), Message.user("Hi")])


async def ask(provider: Any, streamed: bool) -> Any:
    if not streamed:
        return await provider.generate(REQUEST)
    last = None
    async for chunk in provider.stream(REQUEST):
        last = chunk
    return last


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (403, False), (404, False), (422, False),
     (408, True), (429, True), (500, True), (502, True), (503, True), (529, True)],
)  # fmt: skip
@pytest.mark.parametrize("streamed", [False, True], ids=["generate", "stream"])
async def test_http_errors_map_to_provider_errors(
    server: FakeLLMServer, make_provider: MakeProvider, status: int, retryable: bool, streamed: bool
) -> None:
    server.add(failure(status, "the server says no"))
    with pytest.raises(ProviderError) as info:
        await ask(make_provider(), streamed)
    assert (info.value.status, info.value.retryable) == (status, retryable)
    assert "the server says no" in str(info.value) and f"HTTP {status}" in str(info.value)
    assert len(server.requests) == 1  # the SDK did not retry by itself


@pytest.mark.parametrize("streamed", [False, True], ids=["generate", "stream"])
async def test_a_429_carries_the_servers_retry_after(
    server: FakeLLMServer, make_provider: MakeProvider, streamed: bool
) -> None:
    server.add(rate_limited(retry_after=7))
    with pytest.raises(ProviderError) as info:
        await ask(make_provider(), streamed)
    assert (info.value.status, info.value.retryable, info.value.retry_after_s) == (429, True, 7.0)


async def test_an_auth_error_says_where_the_key_goes(api: str, server: FakeLLMServer, make_provider: MakeProvider) -> None:
    server.add(failure(401, "invalid x-api-key"))
    with pytest.raises(ProviderError, match="OPENAI_API_KEY" if api == "openai" else "ANTHROPIC_API_KEY"):
        await make_provider().generate(REQUEST)


@pytest.mark.parametrize("streamed", [False, True], ids=["generate", "stream"])
async def test_a_timeout_is_retryable(server: FakeLLMServer, make_provider: MakeProvider, streamed: bool) -> None:
    server.add(reply("too late", delay_s=2.0))
    with pytest.raises(ProviderError, match="timed out") as info:
        await ask(make_provider(timeout=0.2), streamed)
    assert info.value.retryable and info.value.status is None


@pytest.mark.parametrize("streamed", [False, True], ids=["generate", "stream"])
async def test_a_refused_connection_is_retryable(api: str, streamed: bool) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    provider: Any = (
        OpenAIProvider("model-a", base_url=f"{url}/v1", api_key="k")
        if api == "openai"
        else AnthropicProvider("model-a", base_url=url, api_key="k")
    )
    async with provider:
        with pytest.raises(ProviderError, match="connection failed") as info:
            await ask(provider, streamed)
    assert info.value.retryable


async def test_a_dropped_connection_is_retryable(server: FakeLLMServer, make_provider: MakeProvider) -> None:
    server.add(cut_stream(after=0), cut_stream(after=1))
    provider = make_provider()
    for streamed in (False, True):
        with pytest.raises(ProviderError) as info:
            await ask(provider, streamed)
        assert info.value.retryable


# -- invalid tool-call arguments -------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["send", "stream"])
async def test_invalid_json_arguments_become_an_error_result_the_model_reads(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns, streamed: bool
) -> None:
    if api == "anthropic" and not streamed:
        pytest.skip("a non-streamed Anthropic answer carries `input` as a JSON object: it cannot be invalid JSON")
    raw = '{"city": "Lis'
    server.add(reply(tool_calls=[call("call_1", "weather", raw)]), reply("Sorry, let me fix that."))
    agent = create_agent(provider=make_provider(), store=memory_store(), tools=[weather])
    if streamed:
        stream = agent.stream("Weather?", session_id="s")
        async for _ in stream:
            pass
        result = stream.result
    else:
        result = await agent.send("Weather?", session_id="s")
    assert result is not None and result.text == "Sorry, let me fix that."
    assert not runs.runs  # the tool never ran
    tool_message = result.messages[-2]
    assert tool_message.role == "tool" and "invalid arguments for weather" in tool_message.result()["error"]
    replay = server.requests[1].messages
    if api == "openai":
        assert replay[-2]["tool_calls"][0]["function"]["arguments"] == raw  # the model's own text, as it sent it
        assert replay[-1]["role"] == "tool" and replay[-1]["tool_call_id"] == "call_1"
    else:
        assert replay[-2]["content"][0]["input"] == {"__invalid_json__": raw}
        result_block = replay[-1]["content"][0]
        assert result_block["tool_use_id"] == "call_1" and result_block["is_error"] is True


async def test_invalid_json_for_a_tool_whose_fields_are_all_optional_is_still_an_error(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, note: Any, runs: ToolRuns
) -> None:
    server.add(reply(tool_calls=[call("call_1", "note", "{oops")]), reply("Sorry."))
    agent = create_agent(provider=make_provider(), store=memory_store(), tools=[note])
    stream = agent.stream("Note it", session_id="s")
    async for _ in stream:
        pass
    assert not runs.runs


# -- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "cls"), [("openai", OpenAIProvider), ("anthropic", AnthropicProvider)])
def test_a_missing_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch, module: str, cls: Any) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigurationError, match=rf"pip install 'lousho\[{module}\]'"):
        cls("some-model", api_key="k")


def test_openai_without_a_key_or_base_url_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        OpenAIProvider("gpt-4o-mini")


@pytest.mark.parametrize("cls", [OpenAIProvider, AnthropicProvider])
def test_bad_arguments_are_configuration_errors(cls: Any) -> None:
    with pytest.raises(ConfigurationError, match="model id"):
        cls("", api_key="k")
    with pytest.raises(ConfigurationError, match="either client= or"):
        cls("m", client=object(), base_url="http://127.0.0.1:1")


async def test_a_local_server_needs_no_key(
    api: str, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    server.add("Hello from a local model.")
    provider: Any = (
        OpenAIProvider("llama3", base_url=server.openai_base_url)
        if api == "openai"
        else AnthropicProvider("claude-local", base_url=server.anthropic_base_url)
    )
    async with provider:
        response = await provider.generate(REQUEST)
    assert response.message.content == "Hello from a local model."


async def test_a_passed_client_is_used_without_its_own_retries(api: str, server: FakeLLMServer) -> None:
    server.add(rate_limited(0), "unused")
    provider: Any
    if api == "openai":
        import openai

        client: Any = openai.AsyncOpenAI(api_key="k", base_url=server.openai_base_url, max_retries=5)
        provider = OpenAIProvider("model-a", client=client)
    else:
        import anthropic

        client = anthropic.AsyncAnthropic(api_key="k", base_url=server.anthropic_base_url, max_retries=5)
        provider = AnthropicProvider("model-a", client=client)
    try:
        assert provider.client.max_retries == 0
        assert isinstance(provider, StreamingProvider)
        with pytest.raises(ProviderError):
            await provider.generate(REQUEST)
        assert len(server.requests) == 1
        await provider.aclose()  # a passed client stays open: its owner closes it
        assert not client.is_closed()
    finally:
        await client.close()


async def test_usage_and_request_options_go_through(
    api: str, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.add(reply("Hi", usage=(123, 45)))
    option = {"temperature": 0.2} if api == "openai" else {"stop_sequences": ["END"]}
    provider = make_provider(request_options=option)
    response = await provider.generate(REQUEST)
    assert (response.usage.input_tokens, response.usage.output_tokens) == (123, 45)
    body = server.requests[0].body
    assert option.items() <= body.items()
    if api == "openai":
        assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    else:
        assert body["system"] == "Be brief." and body["messages"] == [{"role": "user", "content": "Hi"}]
