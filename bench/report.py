"""The markdown of `python -m bench`: docs/bench/README.md (every table) and summary.md (a snippet)."""

from __future__ import annotations

from typing import Any

from bench.common import fmt
from bench.inprocess import ROWS

NOT_RUN = "_Not run in this invocation (`--only`)._"


def ran(section: Any) -> bool:
    """The part ran and has figures (it was not skipped, and did not fail)."""
    return section is not None and not (isinstance(section, dict) and "error" in section)


def _skipped(lines: list[str], section: Any) -> list[str] | None:
    """The lines of a part with no figures: not run, or failed and why."""
    if section is None:
        return [*lines, NOT_RUN, ""]
    if not ran(section):
        return [*lines, f"**Failed**: {section['error']}", ""]
    return None


def _ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**no**")


def _median(stat: dict[str, Any] | None) -> float | None:
    return None if not stat else float(stat["median"])


def _langgraph_sqlite_overhead(section: dict[str, Any], variant: str = "SqliteSaver") -> float | None:
    found = section["frameworks"].get("LangGraph", {})
    return _median(found.get("overhead", {}).get(variant))


def _latency_goals(latency: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The fleet hop's goals of issue #20: outbox on <= 1.0x, off <= 1.3x, Redis commands <= the floor's."""
    per_hop = latency["per_hop_ms"]
    ratio, off = latency["ratio"]["median"], latency["ratio_outbox_off"]["median"]
    rows: list[tuple[str, str, bool | None]] = [
        (
            "fleet hop latency <= 1.0x the bare Celery hop (outbox on)",
            f"{per_hop['lousho']['median']:.2f} ms vs {per_hop['floor']['median']:.2f} ms = {ratio:.2f}x",
            ratio <= 1.0,
        ),
        ("same, outbox off <= 1.3x", f"{off:.2f}x", off <= 1.3),
    ]
    commands = latency.get("redis_commands_per_hop") or {}
    if "lousho" in commands and "floor" in commands:
        ours, floor = commands["lousho"]["total"], commands["floor"]["total"]
        rows.append(
            (
                "Redis commands per hop (inside scripts too) <= 2x the floor's",
                f"{ours:.1f} vs {floor:.1f} = {ours / floor:.2f}x",
                ours <= 2 * floor,
            )
        )
        if "round_trips" in commands["lousho"] and "round_trips" in commands["floor"]:
            ours, floor = commands["lousho"]["round_trips"], commands["floor"]["round_trips"]
            rows.append(
                (
                    "Redis round trips per hop <= the floor's",
                    f"{ours:.1f} vs {floor:.1f} = {ours / floor:.2f}x",
                    ours <= floor,
                )
            )
    return rows


def _concurrency_goals(section: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue #29's goals, at 1,000 sessions and more (smaller runs are shown, not judged)."""
    rows: list[tuple[str, str, bool | None]] = []
    for row in section["rows"]:
        n, ours, floor = row["sessions"], row["lousho"], row["floor"]
        if n < 1000:
            continue
        wall = ours["wall_s"] / floor["wall_s"]
        rows.append((f"waiting workload, {n} sessions: wall time <= 1.0x the floor's",
                     f"{ours['wall_s']:.2f} s vs {floor['wall_s']:.2f} s = {wall:.2f}x", wall <= 1.0))  # fmt: skip
        if ours["kb_per_session"] and floor["kb_per_session"]:
            memory = ours["kb_per_session"] / floor["kb_per_session"]
            rows.append((f"waiting workload, {n} sessions: memory per in-flight session <= 0.5x the floor's",
                         f"{ours['kb_per_session']:.1f} KB vs {floor['kb_per_session']:.1f} KB = {memory:.2f}x",
                         memory <= 0.5))  # fmt: skip
        if n >= 5000:
            rows.append((f"waiting workload, {n} sessions: >= 1,000 calls in flight in one process",
                         f"{ours['most_in_flight']}", ours["most_in_flight"] >= 1000))  # fmt: skip
            rows.append((f"waiting workload, {n} sessions: every session finishes",
                         f"{ours['finished']} of {n}", ours["finished"] == n))  # fmt: skip
    return rows


def goals(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(goal, what was measured, met?) for each goal whose section ran."""
    rows: list[tuple[str, str, bool | None]] = []
    overhead = results.get("overhead")
    if ran(overhead):
        reference = _langgraph_sqlite_overhead(overhead)
        ours = overhead["frameworks"].get("lousho", {}).get("overhead", {})
        for variant, label, goal in (("sqlite", "SqliteStore", 0.15), ("redis", "RedisStore", 0.1)):  # issue #20
            value = _median(ours.get(variant))
            if value is None:
                continue
            if reference:
                measured = f"{value:.2f} ms vs {reference:.2f} ms = {value / reference:.2f}x"
                synced = _langgraph_sqlite_overhead(overhead, "SqliteSaver, durability=sync")
                if synced:
                    measured += f' (vs its durability="sync": {value / synced:.2f}x)'
                rows.append(
                    (
                        f"{label} overhead per step <= {goal}x LangGraph SqliteSaver's",
                        measured,
                        value / reference <= goal,
                    )
                )
            else:
                rows.append(
                    (
                        f"{label} overhead per step <= {goal}x LangGraph SqliteSaver's",
                        f"{value:.2f} ms (LangGraph did not run)",
                        None,
                    )
                )
    latency = results.get("latency")
    if ran(latency):
        rows += _latency_goals(latency)
    throughput = results.get("throughput")
    if ran(throughput):
        for count, row in throughput["by_workers"].items():
            ours, floor = row["lousho"]["steps_per_s"]["median"], row["floor"]["steps_per_s"]["median"]
            rows.append(
                (
                    f"throughput, {count} worker process(es) >= 1.0x the floor's steps/s",
                    f"{ours:.0f} vs {floor:.0f} steps/s = {ours / floor:.2f}x",
                    ours / floor >= 1.0,
                )
            )
    growth = results.get("growth")
    if ran(growth):
        for name, store in growth["stores"].items():
            if name.startswith("naive") or "error" in store:
                continue
            rows.append(
                (f"{name}: save time flat, step 500 / step 10 <= 1.5x", f"{store['ratio']:.2f}x", store["ratio"] <= 1.5)
            )
    if ran(results.get("concurrency")):
        rows += _concurrency_goals(results["concurrency"])
    if ran(results.get("events")):
        section = results["events"]
        on, off = (section["per_hop_ms"][side]["median"] for side in ("events on", "events off"))
        ratio = section["ratio"]["median"]
        rows.append(
            (
                f"live events on: a hop <= {section['goal']:.2f}x events off (500 tokens in 50 deltas a turn)",
                f"{on:.2f} vs {off:.2f} ms = {ratio:.3f}x",
                ratio <= section["goal"],
            )
        )
    for row in results["recovery"] if ran(results.get("recovery")) else []:
        # The killed call runs again once the reaper sees its process gone (issue #20): at most 1 s,
        # whatever the lease; the lease + reaper bound is what a stopped (not dead) worker waits.
        measured = row["call_again_s"]
        rows.append(
            (
                f"recovery, {row['name']}: a killed call runs again <= 1 s (lease + reaper = {row['bound_s']:g} s)",
                f"{fmt(measured, 2, ' s')} until the killed call runs again",
                measured["max"] <= 1.0,
            )
        )
    return rows


EXPLAINED_BY = (  # (words of a goal, where its time is broken down): the profiles of issue #20
    ("waiting workload", "[fleet.md](../fleet.md#sizing-a-fleet)"),
    ("overhead", "[inprocess_profile.md](inprocess_profile.md#what-the-profile-showed-and-what-changed)"),
    ("recovery", "section 5 below"),
    ("", "[profile.md](profile.md#what-it-shows)"),  # a fleet hop: latency, throughput, Redis commands
)


def gaps(results: dict[str, Any]) -> list[str]:
    """Where each figure's time is broken down, and each goal this run did not meet, with that breakdown."""
    lines = [
        "Where the time goes: a fleet hop by area (Celery's machinery, redis-py and sockets, JSON, pydantic, lousho) "
        "against a bare Celery hop's, and the Redis commands of each, in [profile.md](profile.md) "
        "(`python -m bench.profile_hop`); an in-process step's saves in [inprocess_profile.md](inprocess_profile.md) "
        "(`python -m bench.profile_inprocess`).",
        "",
    ]
    unmet = [(goal, measured) for goal, measured, ok in goals(results) if ok is False]
    if unmet:
        lines += ["Not met in this run, and where the gap is explained:", ""]
        for goal, measured in unmet:
            where = next(doc for words, doc in EXPLAINED_BY if words in goal)
            lines.append(f"- {goal}: {measured}; see {where}.")
        lines.append("")
    return lines


def overhead_section(section: dict[str, Any] | None) -> list[str]:
    lines = ["## 1. Per-step overhead of durability, in process", ""]
    if (skipped := _skipped(lines, section)) is not None:
        return skipped
    reference = _langgraph_sqlite_overhead(section)
    lines += [
        f"A {section['turns']}-turn tool loop: each turn the model (a zero-latency script) asks for one trivial tool "
        "call, the tool returns a tiny dict; then a final answer. **One step = one turn = a model call + its tool "
        "call** (two durable records in each framework). ms per step = run time / turns; overhead = time with "
        f"durability - time without, in the same framework, paired repeat by repeat. Median (min-max) of "
        f"{section['repeats']} repeats.",
        "",
        "| framework | durability | ms per step | overhead, ms per step | overhead / LangGraph SqliteSaver's |",
        "| - | - | - | - | - |",
    ]
    frameworks = section["frameworks"]
    for framework, variant, label in ROWS:
        found = frameworks.get(framework, {})
        if "error" in found:
            lines.append(f"| {framework} | {label} | {found['error']} | | |")
            continue
        absolute = found.get("absolute", {}).get(variant)
        extra = found.get("overhead", {}).get(variant)
        ratio = _ratio(_median(extra) / reference) if extra and reference else "-"
        lines.append(f"| {framework} | {label} | {fmt(absolute, 3)} | {fmt(extra, 3) if extra else '-'} | {ratio} |")
    lines += ["", "![per-step overhead](overhead.png)", ""]
    return lines


def latency_section(section: dict[str, Any] | None) -> list[str]:
    lines = ["## 2. The fleet's per-step latency", ""]
    if (skipped := _skipped(lines, section)) is not None:
        return skipped
    floor = section["per_hop_ms"]["floor"]["median"]
    lines += [
        f"One session of {section['turns']} tool turns on one worker process (solo pool): {section['hops']} task hops "
        "(each model turn and each tool call is a task), from `Client.enqueue` to the finished save; against the "
        f"floor, a chain of {section['hops']} bare Celery tasks each enqueuing the next (same broker, same settings: "
        f"JSON, acks_late, prefetch 1, solo). Alternating, {section['repeats']} repeats each.",
        "",
        "| | ms per task hop | ms per turn (model turn + tool call) | x floor |",
        "| - | - | - | - |",
        f"| floor: bare Celery hop | {fmt(section['per_hop_ms']['floor'])} | {2 * floor:.2f} | 1.00x |",
        f"| lousho | {fmt(section['per_hop_ms']['lousho'])} | {2 * section['per_hop_ms']['lousho']['median']:.2f} | "
        f"{fmt(section['ratio'], 2, 'x')} |",
        *_outbox_off_row(section),
        "",
        "lousho hands each step on with its outbox: the script that saves a step and releases its lease also "
        "pushes the next task, the message Celery's `send_task` would publish ([docs/fleet.md](../fleet.md#how-a-step-"
        "hands-on-two-round-trips-and-the-outbox)). The floor publishes through `send_task`, which also sends Celery's "
        "task-sent event. For reference, the last row is lousho with `FleetSettings(outbox=False)`: every step "
        "through `send_task`, as the floor's hops are.",
        "",
        *_commands(section.get("redis_commands_per_hop")),
        "![fleet latency](fleet_latency.png)",
        "",
    ]
    return lines


def _outbox_off_row(section: dict[str, Any]) -> list[str]:
    off = section["per_hop_ms"].get("lousho, outbox off")
    if off is None:
        return []
    return [
        f"| lousho, outbox off (each step through `send_task`) | {fmt(off)} | {2 * off['median']:.2f} | "
        f"{fmt(section['ratio_outbox_off'], 2, 'x')} |"
    ]


def _commands(found: dict[str, Any] | None) -> list[str]:
    if not found:
        return []

    def top(kind: str) -> str:
        return ", ".join(f"{name} {count:g}" for name, count in found[kind]["top"].items())

    lines = [
        f"Redis commands per task hop (INFO commandstats over one more session; commands run inside Lua scripts, "
        f"the benchmark's BLPOP and idle workers' polling included): lousho {found['lousho']['total']:.1f} ({top('lousho')}); floor "
        f"{found['floor']['total']:.1f} ({top('floor')}).",
        "",
    ]
    if "round_trips" in found["lousho"] and "round_trips" in found["floor"]:
        lines += [
            f"Redis round trips per task hop (the server's read events, INFO stats `total_reads_processed`, over the "
            f"same session; the benchmark's and idle workers' included): lousho {found['lousho']['round_trips']:.1f}, "
            f"floor {found['floor']['round_trips']:.1f}.",
            "",
        ]
    return lines


def throughput_section(section: dict[str, Any] | None) -> list[str]:
    lines = ["## 3. Throughput", ""]
    if (skipped := _skipped(lines, section)) is not None:
        return skipped
    lines += [
        f"{section['sessions']} sessions of {section['turns']} tool turns ({2 * section['turns'] + 1} task hops each, "
        f"{section['hops']} in all) enqueued at once, until the last finished save; the floor runs as many bare hop "
        f"chains on as many floor workers. {section['repeats']} repeats. This machine has the cores listed below, "
        "shared by the workers, Redis and the benchmark.",
        "",
        "| worker processes | lousho sessions/s | lousho steps/s | floor steps/s | lousho / floor | lousho sessions "
        "stalled (requeued by the reaper) |",
        "| - | - | - | - | - | - |",
    ]
    for count, row in sorted(section["by_workers"].items(), key=lambda item: int(item[0])):
        ours, floor = row["lousho"]["steps_per_s"], row["floor"]["steps_per_s"]
        lines.append(
            f"| {count} | {fmt(row['lousho']['sessions_per_s'], 1)} | {fmt(ours, 0)} | {fmt(floor, 0)} | "
            f"{ours['median'] / floor['median']:.2f}x | {row.get('reaper_requeues', 0)} of "
            f"{section['sessions'] * section['repeats']} |"
        )
    if any(row.get("reaper_requeues") for row in section["by_workers"].values()):
        lines += ["", STALL_NOTE]
    lines += ["", "![fleet throughput](fleet_throughput.png)", ""]
    return lines


def growth_section(section: dict[str, Any] | None) -> list[str]:
    lines = ["## 4. Cost growth", ""]
    if (skipped := _skipped(lines, section)) is not None:
        return skipped
    steps = section["steps"]
    lines += [
        f"One session saved step by step, one ~{section['message_bytes']} B message per step, each store with its "
        f"default history ring (50). Save time: the median of every save at steps N-5..N+5 of {section['repeats']} "
        "sessions (in brackets: the min-max of each session's own median); the ratio is taken from those medians. "
        "Bytes: what the store holds for that session after the save of step N (see the notes). Naive: the whole "
        "checkpoint JSON as the latest record and pushed to the ring.",
        "",
        "| store | "
        + " | ".join(f"save ms, step {s}" for s in steps)
        + f" | step {steps[-1]} / step {steps[0]} | "
        + " | ".join(f"bytes, step {s}" for s in steps)
        + " |",
        "| - " * (2 * len(steps) + 2) + "|",
    ]
    for name, store in section["stores"].items():
        if "error" in store:
            lines.append(f"| {name} | {store['error']} |" + " |" * (2 * len(steps)))
            continue
        if store.get("brought_forward"):
            name += " (brought forward from step 102 to 497, see the notes)"
        times = " | ".join(_pooled(store, s) for s in steps)
        sizes = " | ".join(f"{store['bytes'][str(s)]:,}" for s in steps)
        lines.append(f"| {name} | {times} | {store['ratio']:.2f}x | {sizes} |")
    langgraph = section.get("langgraph", {})
    if "error" in langgraph:
        lines.append(f"| LangGraph SqliteSaver | {langgraph['error']} |" + " |" * (2 * len(steps)))
    else:
        times = " | ".join(f"{langgraph['step_ms'][str(s)]:.3f} (whole super-step)" for s in steps)
        ratio = langgraph["step_ms"][str(steps[-1])] / langgraph["step_ms"][str(steps[0])]
        sizes = " | ".join(f"{langgraph['bytes'][str(s)]:,}" for s in steps)
        lines.append(f"| LangGraph SqliteSaver (same transcript) | {times} | {ratio:.2f}x | {sizes} |")
    lines += ["", "![cost growth](growth.png)", ""]
    return lines


def _pooled(store: dict[str, Any], step: int) -> str:
    """The pooled median save time at `step`, with the sessions' medians' min-max."""
    per_session = store["save_ms"][str(step)]
    pooled = store.get("pooled_ms", {}).get(str(step), per_session["median"])
    return f"{pooled:.3f} ({per_session['min']:.3f}-{per_session['max']:.3f})"


def recovery_section(section: Any) -> list[str]:
    lines = ["## 5. Recovery after a worker is SIGKILLed", ""]
    if (skipped := _skipped(lines, section)) is not None:
        return skipped
    lines += [
        "A session's tool call runs long; its worker gets SIGKILL at a random point of the heartbeat period (no "
        "cleanup, no ack); a second worker runs, and the reaper (`run_reaper` in a thread, as `lousho reaper` runs: "
        "a pass every reaper interval, a sweep for dead worker processes every `death_check_interval_s`, 0.25 s). Measured from the kill to the session's next task starting on the other worker "
        "(the reaper's `advance`) and to the killed call starting again there. A replacement worker is started "
        "after each repeat, outside the timing.",
        "",
        "| settings | lease TTL | reaper interval | bound (lease + reaper) | next task starts | killed call runs "
        "again | repeats |",
        "| - | - | - | - | - | - | - |",
    ]
    for row in section:
        lines.append(
            f"| {row['name']} | {row['lease_ttl_s']:g} s | {row['reaper_interval_s']:g} s | "
            f"{row['bound_s']:g} s | {fmt(row['next_task_s'], 2, ' s')} | {fmt(row['call_again_s'], 2, ' s')} "
            f"| {row['repeats']} |"
        )
    lines += ["", "![recovery](recovery.png)", ""]
    return lines


STALL_NOTE = (
    "A stalled session is one whose next model-turn task found the session's lease still held and stood down "
    "(`busy`): the task that enqueued it (a tool call's fold) sends the next turn before it releases the lease, "
    "so with several workers the next turn can start before the release. Nothing but the reaper moves such a "
    "session on, after its in-flight deadline (a lease TTL) passes: each stall costs about lease TTL + reaper "
    "interval, which is what pulls the figures of several workers down."
)

NOTES = """## Notes on method

- Every figure is the median of repeated runs with the min-max in brackets; a ratio is taken from medians
  (the overhead and the latency ratio are paired, repeat by repeat). Absolute times drift from run to run and
  from machine to machine; compare rows of one run.
- In process, each framework runs in a fresh process of its own, its variants interleaved repeat by repeat
  after one untimed warm-up run each. lousho: `AgentExecutor.execute` with `ScriptedProvider(by_turn=True)`
  and an async tool. LangGraph: `StateGraph(MessagesState)`, a model node, the prebuilt `ToolNode` and
  `tools_condition`; `SqliteSaver` on a file (its defaults: WAL). Its default durability ("async") writes
  checkpoints in a background thread while the next step runs; "sync" writes each before the next step, as
  lousho and DBOS do. DBOS: a `@DBOS.workflow` calling a `@DBOS.step` for the model and one for the tool, on a
  SQLite system database; its baseline is the same functions called without DBOS.
- The fleet: real `celery worker --pool=solo` processes (`lousho.testing.workers`), the app in
  `bench/fleet_app.py` (`ScriptedProvider(by_turn=True)`, zero latency, a trivial tool), `FleetSettings()`.
  The floor is `bench/floor_app.py` on the same `celery_config`. Times are taken by the workers
  (`time.time()` at the finished save) against the benchmark's clock at enqueue: one machine, one clock.
- Cost growth bytes: memory store, the Python heap it retains for the session (tracemalloc, an untimed run);
  SQLite (ours, naive, LangGraph), pages in use after a WAL checkpoint, one file per session; FileStore, every
  file in its folder (one folder per session); Redis, MEMORY USAGE of the session's keys.
  A store slower than 20 ms per save around step 100 (FileStore while it rewrites its whole history file
  on every save) is brought from step 102 to step 497 in one write of exactly what its saves would have
  left, then saved step by step again. LangGraph's time is a whole super-step with durability="sync"
  (node + checkpoint), around step N.
- Recovery: the bound is lease TTL + reaper interval: the in-flight deadline passes at most a lease TTL after
  the last heartbeat, and the reaper looks every interval. That bound is what a live but stopped worker's call
  waits; a call whose process is gone is requeued by the reaper's sweep for dead processes (its Redis
  connections closed) well before it (docs/fleet.md, "Fast death detection"); tests/fleet/test_death_detection.py
  shows a stopped worker under its lease is not taken over."""


def concurrency_section(section: dict[str, Any] | None) -> list[str]:
    from bench.concurrency import section as table

    lines = ["## 6. The waiting workload: many sessions in flight per process (issue #29)", ""]
    if (skipped := _skipped(lines, section)) is not None:
        return skipped
    assert section is not None
    return lines + table(section)


def events_section(section: dict[str, Any] | None) -> list[str]:
    from bench.events import section as table

    lines = ["## 7. The live event stream's cost (issue #34)", ""]
    if (skipped := _skipped(lines, section)) is not None:
        return skipped
    assert section is not None
    return lines + table(section)


def _load(meta: dict[str, Any]) -> str:
    """The 1-minute load average at the start and the end: other work on the machine skews the figures."""
    if "load" not in meta:
        return ""
    return f", load average {meta['load'][0]:.2f} at the start, {meta['load'][1]:.2f} at the end"


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    machine = meta["machine"]
    lines = [
        "# Benchmarks: lousho against the field",
        "",
        f"`python -m bench{' --quick' if meta['mode'] == 'quick' else ''}` ({meta['mode']} mode), "
        f"{meta['started']} UTC, {meta['elapsed_s']:.0f} s. Machine: {machine['nproc']} CPUs ({machine['cpu']}), "
        f"{machine['memory']} memory, {machine['os']}{_load(meta)}. Redis: {meta['redis']}. lousho at {meta.get('revision', '?')}. "
        "Package versions at the end.",
        "",
        "| goal | measured | met |",
        "| - | - | - |",
        *(f"| {goal} | {measured} | {_met(ok)} |" for goal, measured, ok in goals(results)),
        "",
        *gaps(results),
        *overhead_section(results.get("overhead")),
        *latency_section(results.get("latency")),
        *throughput_section(results.get("throughput")),
        *growth_section(results.get("growth")),
        *recovery_section(results.get("recovery")),
        *concurrency_section(results.get("concurrency")),
        *events_section(results.get("events")),
        NOTES,
        "",
        "See also [redis_store.md](redis_store.md) (`python -m bench.redis_store`): RedisStore against a naive Redis "
        "ring, and the Redis memory of 1,000 sessions.",
        "",
        "## Versions",
        "",
        "| package | version |",
        "| - | - |",
        *(f"| {name} | {value} |" for name, value in meta["versions"].items()),
        "",
    ]
    return "\n".join(lines)


def _m(stat: dict[str, Any] | None, digits: int = 2) -> str:
    return "-" if not stat else f"{stat['median']:.{digits}f}"


def summary(results: dict[str, Any], folder: str) -> str:
    """A few lines for the project README, linking one plot."""
    lines = ["## Benchmarks", ""]
    overhead = results.get("overhead")
    if ran(overhead):
        found = overhead["frameworks"]
        ours = found.get("lousho", {}).get("overhead", {})
        langgraph = found.get("LangGraph", {}).get("overhead", {}).get("SqliteSaver")
        dbos = found.get("DBOS", {}).get("overhead", {}).get("DBOS workflow (SQLite)")
        parts = [f"RedisStore {_m(ours.get('redis'))} ms", f"SqliteStore {_m(ours.get('sqlite'))} ms"]
        parts += [f"LangGraph SqliteSaver {_m(langgraph)} ms"] if langgraph else []
        parts += [f"DBOS on SQLite {_m(dbos)} ms"] if dbos else []
        lines.append(f"- Durability costs per agent step (a model call + a tool call), in process: {', '.join(parts)}.")
    latency = results.get("latency")
    if ran(latency):
        lines.append(
            f"- On the Celery + Redis fleet a step (a model turn or a tool call, each a task) takes "
            f"{_m(latency['per_hop_ms']['lousho'])} ms, {latency['ratio']['median']:.2f}x a bare Celery "
            f"hop ({_m(latency['per_hop_ms']['floor'])} ms)."
        )
    growth = results.get("growth")
    if ran(growth) and "ratio" in growth["stores"].get("RedisStore", {}):
        redis_store = growth["stores"]["RedisStore"]
        lines.append(
            f"- A RedisStore save at step 500 (a ~500 KB transcript) takes {redis_store['ratio']:.2f}x one at step 10, and a "
            f"500-step session holds {redis_store['bytes']['500'] / 1e6:.1f} MB"
            + (
                f" (LangGraph SqliteSaver: {growth['langgraph']['bytes']['500'] / 1e6:.0f} MB)"
                if "bytes" in growth.get("langgraph", {})
                else ""
            )
            + "."
        )
    recovery = results.get("recovery")
    if ran(recovery):
        default = recovery[0]
        lines.append(
            f"- A session whose worker is SIGKILLed runs again after {_m(default['call_again_s'], 1)} s "
            f"with the default settings (its process seen gone by the reaper's sweep; lease {default['lease_ttl_s']:g} s,"
            f" reaper {default['reaper_interval_s']:g} s)"
            + (
                f", {_m(recovery[1]['call_again_s'], 1)} s tuned (lease 1 s + reaper 0.5 s)"
                if len(recovery) > 1
                else ""
            )
            + "."
        )
    machine = results["meta"]["machine"]
    lines += [
        "",
        f"Measured on {machine['nproc']} CPUs ({machine['cpu']}); every table, plot and package version in "
        f"[{folder}/README.md]({folder}/README.md).",
        "",
    ]
    if ran(overhead):
        lines += [f"![per-step overhead]({folder}/overhead.png)", ""]
    return "\n".join(lines)
