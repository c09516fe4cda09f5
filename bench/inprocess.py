"""1. The per-step overhead of durability, in process, against LangGraph and DBOS.

The same shape of work everywhere: a 50-turn tool loop (the model, a zero-latency script,
asks for one trivial tool call per turn; the tool returns a tiny dict; then a final text
answer). A step here is one turn: a model call plus the tool call it asked for, i.e. two
durable records in each framework (lousho: a checkpoint after the model turn and one after
the tool result; LangGraph: one checkpoint per super-step, `model` then `tools`; DBOS: one
step record for the model call, one for the tool call). Time per step = run time / turns.
Overhead = time with a store - time without, paired repeat by repeat.

Each framework runs in a process of its own (`common.isolated`); within it, its variants
are interleaved repeat by repeat, after one untimed warm-up run each.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.common import delete_prefix, isolated, quiet_gc, stats, why_not


def _measure(variants: dict[str, Callable[[], object]], turns: int, repeats: int) -> dict[str, list[float]]:
    """ms per turn of each variant, `repeats` times, interleaved, after a warm-up run each."""
    for run in variants.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:  # rotate the order
            with quiet_gc():
                started = time.perf_counter()
                variants[name]()
                times[name].append((time.perf_counter() - started) * 1000 / turns)
    return times


# -- lousho ---------------------------------------------------------------------------------


def run_lousho(turns: int, repeats: int, redis_url: str) -> dict[str, list[float]]:
    """In a child process: lousho with no store, the memory store, SqliteStore and RedisStore."""
    import redis
    from pydantic import BaseModel

    from lousho import Agent, AgentExecutor, define_tool, memory_store
    from lousho.providers import ScriptedProvider, tool_calls
    from lousho.stores import RedisStore, SqliteStore

    class Args(BaseModel):
        n: int

    async def noop(args: Args, ctx: Any) -> dict[str, int]:
        return {"n": args.n}

    agent = Agent(
        name="bench",
        model="scripted",
        instructions="You run a benchmark.",
        max_steps=turns + 10,
        tools=[define_tool(name="noop", description="Does nothing", input=Args, execute=noop)],
    )
    answers: list[Any] = [tool_calls((f"call_{i}", "noop", {"n": i})) for i in range(turns)] + ["done"]
    prefix = f"lousho-bench-{uuid.uuid4().hex[:8]}:"
    client = redis.Redis.from_url(redis_url)
    folder = tempfile.TemporaryDirectory(prefix="lousho-bench-")
    stores: dict[str, Any] = {
        "none": None,
        "memory": memory_store().checkpoints,
        "sqlite": SqliteStore(os.path.join(folder.name, "bench.db")).checkpoints,
        "redis": RedisStore(client, prefix=prefix).checkpoints,
    }
    loop = asyncio.new_event_loop()

    def runner(store: Any) -> Callable[[], object]:
        def run() -> None:
            provider = ScriptedProvider(answers, by_turn=True)
            session = f"s-{uuid.uuid4().hex[:12]}" if store is not None else None
            result = loop.run_until_complete(
                AgentExecutor.execute(
                    agent=agent, input="go", provider=provider, session_id=session, checkpoint_store=store
                )
            )
            assert result.finish_reason == "stop" and len(result.messages) == 2 * turns + 3, result.finish_reason

        return run

    try:
        return _measure({name: runner(store) for name, store in stores.items()}, turns, repeats)
    finally:
        loop.close()
        delete_prefix(client, prefix)
        client.close()
        folder.cleanup()


# -- LangGraph ------------------------------------------------------------------------------


def run_langgraph(turns: int, repeats: int) -> dict[str, list[float]]:
    """In a child process: a tool-calling StateGraph (model node, prebuilt ToolNode, tools_condition)."""
    import sqlite3

    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def noop(n: int) -> dict[str, int]:
        """Does nothing."""
        return {"n": n}

    def model(state: MessagesState) -> dict[str, Any]:
        turn = sum(isinstance(m, AIMessage) for m in state["messages"])
        if turn < turns:
            return {
                "messages": [
                    AIMessage(content="", tool_calls=[{"id": f"call_{turn}", "name": "noop", "args": {"n": turn}}])
                ]
            }
        return {"messages": [AIMessage(content="done")]}

    def build(checkpointer: Any) -> Any:
        graph = StateGraph(MessagesState)
        graph.add_node("model", model)
        graph.add_node("tools", ToolNode([noop]))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition)
        graph.add_edge("tools", "model")
        return graph.compile(checkpointer=checkpointer)

    folder = tempfile.TemporaryDirectory(prefix="lousho-bench-")
    connections = [sqlite3.connect(os.path.join(folder.name, f"lg{i}.db"), check_same_thread=False) for i in range(2)]
    start = [SystemMessage("You run a benchmark."), HumanMessage("go")]

    def runner(checkpointer: Any, **options: Any) -> Callable[[], object]:
        graph = build(checkpointer() if callable(checkpointer) else checkpointer)

        def run() -> None:
            config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 4 * turns + 10}
            out = graph.invoke({"messages": start}, config, **options)
            assert len(out["messages"]) == 2 * turns + 3, len(out["messages"])

        return run

    variants = {
        "none": runner(None),
        "InMemorySaver": runner(InMemorySaver()),
        "SqliteSaver": runner(SqliteSaver(connections[0])),
        "SqliteSaver, durability=sync": runner(SqliteSaver(connections[1]), durability="sync"),
    }
    try:
        return _measure(variants, turns, repeats)
    finally:
        for connection in connections:
            connection.close()
        folder.cleanup()


# -- DBOS -----------------------------------------------------------------------------------


def run_dbos(turns: int, repeats: int) -> dict[str, list[float]]:
    """In a child process: a DBOS workflow whose steps are the model call and the tool call, on a
    SQLite system database; and the same functions called plainly (no DBOS) as its baseline."""
    from dbos import DBOS

    folder = tempfile.TemporaryDirectory(prefix="lousho-bench-")
    DBOS(
        config={
            "name": "lousho-bench",
            "system_database_url": f"sqlite:///{folder.name}/dbos.sqlite",
            "run_admin_server": False,
            "log_level": "WARNING",
        }
    )

    def model_call(turn: int) -> dict[str, Any]:
        if turn < turns:
            return {"role": "assistant", "tool_calls": [{"id": f"call_{turn}", "name": "noop", "args": {"n": turn}}]}
        return {"role": "assistant", "content": "done"}

    def tool_call(call: dict[str, Any]) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call["id"], "content": {"n": call["args"]["n"]}}

    def loop(model: Callable[[int], dict[str, Any]], tool: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You run a benchmark."},
            {"role": "user", "content": "go"},
        ]
        turn = 0
        while True:
            answer = model(turn)
            messages.append(answer)
            turn += 1
            if not answer.get("tool_calls"):
                return len(messages)
            messages.extend(tool(call) for call in answer["tool_calls"])

    model_step = DBOS.step(name="model_call")(model_call)
    tool_step = DBOS.step(name="tool_call")(tool_call)

    @DBOS.workflow(name="agent")
    def agent() -> int:
        return loop(model_step, tool_step)

    DBOS.launch()

    def plain() -> None:
        assert loop(model_call, tool_call) == 2 * turns + 3

    def durable() -> None:
        assert agent() == 2 * turns + 3

    try:
        return _measure({"none": plain, "DBOS workflow (SQLite)": durable}, turns, repeats)
    finally:
        DBOS.destroy()
        folder.cleanup()


# -- the section ----------------------------------------------------------------------------

ROWS = [
    ("lousho", "none", "no store"),
    ("lousho", "memory", "memory store"),
    ("lousho", "sqlite", "SqliteStore"),
    ("lousho", "redis", "RedisStore"),
    ("LangGraph", "none", "no checkpointer"),
    ("LangGraph", "InMemorySaver", "InMemorySaver"),
    ("LangGraph", "SqliteSaver", "SqliteSaver (default durability: async)"),
    ("LangGraph", "SqliteSaver, durability=sync", 'SqliteSaver, durability="sync"'),
    ("DBOS", "none", "plain functions (no DBOS)"),
    ("DBOS", "DBOS workflow (SQLite)", "workflow of steps, SQLite system database"),
]


def run(turns: int, repeats: int, redis_url: str) -> dict[str, Any]:
    """Every row of the section: `{framework: {"times": {variant: [...]}} | {"error": why}}`."""
    parts: dict[str, tuple[str, dict[str, Any]]] = {
        "lousho": ("bench.inprocess:run_lousho", {"redis_url": redis_url}),
        "LangGraph": ("bench.inprocess:run_langgraph", {}),
        "DBOS": ("bench.inprocess:run_dbos", {}),
    }
    result: dict[str, Any] = {}
    for framework, (target, kwargs) in parts.items():
        try:
            times = isolated(target, turns=turns, repeats=repeats, **kwargs)
        except RuntimeError as exc:
            result[framework] = {"error": why_not(exc)}
            continue
        none = times["none"]
        result[framework] = {
            "absolute": {name: stats(values) for name, values in times.items()},
            "overhead": {
                name: stats([t - n for t, n in zip(values, none, strict=True)])
                for name, values in times.items()
                if name != "none"
            },
        }
    return {"turns": turns, "repeats": repeats, "frameworks": result}
