"""A run crashes inside a tool in one process and is finished by another, through one SQLite file.

Process 1 runs an agent whose model asks for three tool calls; the 2nd call kills its
process with `os._exit(1)` (no cleanup, no flush of anything but what was committed).
Process 2 opens the same file and calls `execute(input=[])`. Each process logs every
tool execution and every model request to a side file, so the test can prove what ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import lousho
from lousho.stores.sql import SqliteStore

REPO = Path(lousho.__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from pydantic import BaseModel
    from lousho import Agent, AgentExecutor, define_tool
    from lousho.providers.scripted import ScriptedProvider, tool_calls
    from lousho.stores.sql import SqliteStore

    phase, db_path, side_path = sys.argv[1:4]
    ANSWERS = [
        tool_calls(("call_a", "step", {"n": 1}), ("call_b", "step", {"n": 2}), ("call_c", "step", {"n": 3})),
        "all three steps done",
    ]

    def log(**record):
        with open(side_path, "a") as side:
            side.write(json.dumps({"phase": phase, **record}) + "\\n")
            side.flush()
            os.fsync(side.fileno())

    class StepArgs(BaseModel):
        n: int

    def step(args, ctx):
        log(tool_call_id=ctx.tool_call_id)
        if phase == "crash" and ctx.tool_call_id == "call_b":
            os._exit(1)
        return {"done": args.n}

    class LoggingProvider(ScriptedProvider):
        async def generate(self, request):
            log(model_call=len(self.calls) + 1)
            return await super().generate(request)

    store = SqliteStore(db_path)
    stored = store.checkpoints.load("job-1")
    turns = sum(1 for m in stored.messages if m.role == "assistant") if stored else 0
    provider = LoggingProvider(ANSWERS[turns:])  # only the answers the transcript has not consumed
    agent = Agent(name="stepper", model="test-model", instructions="Do the steps.",
                  tools=[define_tool(name="step", description="One step", input=StepArgs, execute=step)])
    result = asyncio.run(AgentExecutor.execute(
        agent=agent, input="do the steps" if phase == "crash" else [], provider=provider,
        session_id="job-1", checkpoint_store=store.checkpoints, approval_store=store.approvals))
    log(finish_reason=result.finish_reason, answers_given=len(provider.answers))
    store.close()
    """
)


def _run(phase: str, script: Path, db: Path, side: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(script), phase, str(db), str(side)], env=env, capture_output=True, text=True, timeout=100
    )


def test_crash_mid_batch_in_one_process_is_finished_by_another(tmp_path: Path) -> None:
    script, db, side = tmp_path / "run_agent.py", tmp_path / "jobs.db", tmp_path / "side.jsonl"
    script.write_text(SCRIPT)

    crashed = _run("crash", script, db, side)
    assert crashed.returncode == 1, crashed.stderr
    resumed = _run("resume", script, db, side)
    assert resumed.returncode == 0, resumed.stderr

    records = [json.loads(line) for line in side.read_text().splitlines()]
    executions = [(r["phase"], r["tool_call_id"]) for r in records if "tool_call_id" in r]
    assert executions == [("crash", "call_a"), ("crash", "call_b"), ("resume", "call_b"), ("resume", "call_c")]
    assert Counter(call for _, call in executions) == {"call_a": 1, "call_b": 2, "call_c": 1}
    assert [(r["phase"], r["model_call"]) for r in records if "model_call" in r] == [("crash", 1), ("resume", 1)]
    assert records[-1] == {"phase": "resume", "finish_reason": "stop", "answers_given": 1}

    store = SqliteStore(db)
    try:
        checkpoint = store.checkpoints.load("job-1")
        history = store.checkpoints.history("job-1")
    finally:
        store.close()
    assert checkpoint is not None and checkpoint.status == "finished"
    roles = [m.role for m in checkpoint.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "tool", "assistant"]
    assert [m.tool_call_id for m in checkpoint.messages if m.role == "tool"] == ["call_a", "call_b", "call_c"]
    assert [m.result() for m in checkpoint.messages if m.role == "tool"] == [{"done": 1}, {"done": 2}, {"done": 3}]
    assert checkpoint.messages[-1].content == "all three steps done"
    assert history[0].checkpoint == checkpoint and history[-1].status == "in-progress"
