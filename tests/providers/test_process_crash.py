"""A process that dies in the middle of a streamed model turn (os._exit, no cleanup): another
process resumes from the SQLite checkpoint. The streamed-but-unsaved turn is generated again;
the checkpointed turn and its tool call are not (the fake server's request log says so)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path
from typing import Any

from lousho import create_agent
from lousho.stores import SqliteStore
from lousho.testing.fake_llm_servers import FakeLLMServer, call, reply

from .conftest import MakeProvider, ToolRuns

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from pydantic import BaseModel
    from lousho import create_agent, define_tool
    from lousho.stores import SqliteStore

    api, base_url, db, marks = sys.argv[1:5]

    class CityArgs(BaseModel):
        city: str

    def weather(args, ctx):
        with open(marks, "a") as f:
            f.write(ctx.tool_call_id + "\\n")
        return {"city": args.city, "forecast": "sun"}

    if api == "openai":
        from lousho.providers.openai import OpenAIProvider as Provider
    else:
        from lousho.providers.anthropic import AnthropicProvider as Provider
    agent = create_agent(provider=Provider("model-a", base_url=base_url, api_key="k"), store=SqliteStore(db),
                         instructions="You plan trips.",
                         tools=[define_tool(name="weather", description="Forecast for a city", input=CityArgs,
                                            execute=weather)])

    async def main():
        results = 0
        async for event in agent.stream("Weather in Lisbon?", session_id="trip"):
            results += event.type == "tool-result"
            if event.type == "text" and event.delta and results:
                print("dying after", repr(event.text), flush=True)
                os._exit(17)  # killed mid-stream: no cleanup, no save

    asyncio.run(main())
    """
)


async def test_a_process_killed_mid_stream_resumes_elsewhere_without_asking_the_saved_turn_again(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns, tmp_path: Path
) -> None:
    server.add(
        reply("Let me look.", tool_calls=[call("call_1", "weather", {"city": "Lisbon"})]),
        reply("An answer the dead process streamed but never saved", chunk_delay_s=0.01),
        reply("Sunny in Lisbon."),
    )
    db, marks = tmp_path / "jobs.db", tmp_path / "tool-runs.txt"
    base_url = server.openai_base_url if api == "openai" else server.anthropic_base_url
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, api, base_url, str(db), str(marks),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(child.communicate(), timeout=60)
    assert child.returncode == 17, err.decode()[-2000:]
    assert "dying after 'An '" in out.decode()
    assert marks.read_text().split() == ["call_1"]

    store = SqliteStore(db)
    try:
        saved = store.checkpoints.load("trip")
        assert saved is not None and (saved.status, saved.step_index) == ("in-progress", 1)
        agent = create_agent(provider=make_provider("model-a"), store=store, instructions="You plan trips.",
                             tools=[weather])  # fmt: skip
        resumed = await agent.resume("trip")
    finally:
        store.close()
    assert resumed is not None and resumed.text == "Sunny in Lisbon."
    assert not runs.runs  # the recorded tool result was not re-run here
    requests = server.requests
    assert len(requests) == 3
    assert requests[2].messages == requests[1].messages  # only the unsaved turn was asked again
    assert marks.read_text().split() == ["call_1"]
