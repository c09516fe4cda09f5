"""The README as a new user follows it (issue #15, the first item of "What it must show"): in the README's order, in a
copy of the checkout, from a venv made by the README's own first line and the installs it shows before each part.

1. `python3 -m venv .venv && source .venv/bin/activate`, then `pip install -e . && lousho demo`, as printed;
2. the look-around commands (`lousho sessions`, `show`, `history`, `demo --in-process`) find the demo's runs;
3. the fleet section: `myapp/lousho_app.py` written from the README's block, its worker and the reaper;
4. the web app: `pip install -e '.[web]'`, its worker and uvicorn, and each `curl`;
5. the CLI block: enqueue, approvals and approve, fork, compare;
6. Flower, after the install its section names, answering `/api/tasks` for a job on the fleet section's worker;
7. every process started here ended by pid, the local store stopped, nothing left running;
8. `git status` in the copy is clean: whatever the README has a reader create in the checkout (`myapp/`, the venv,
   the egg-info of `pip install -e .`) is named in .gitignore (issue #33).

The copy is made of the files git tracks or would add, as they are now (tests/docs/walkthrough.py), so what a reader
left in this checkout after following the README (`myapp/`, ignored) is not in it and breaks no step (issue #33).

Nothing is configured (no `REDIS_URL`, no `LOUSHO_*`): every command uses the local store of the walk's own
`LOUSHO_HOME`, as on a machine without Redis. What the test changes in a printed line: a free port for 8000 and 5555
(the machine is shared with other test runs), and the ids a reader copies from an earlier output (`appr_...`,
`job-...`). Commands the README leaves running (`&`, or a terminal of their own) run in the background.

Last, `test_every_command_the_docs_show_is_run_by_a_test`: every command of every ```bash block of README.md and
docs/*.md (and each `$ ` line shown with its output) is run here or mapped to the test that runs it (RUN_ELSEWHERE);
NOT_RUN names the few no test runs, and why. A command added to the docs without a test fails it."""

from __future__ import annotations

import ast
import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lousho.local_redis import LocalRedis
from tests.docs.walkthrough import (
    DOCS,
    Walk,
    bash_block_after,
    bash_blocks,
    free_port,
    python_blocks,
    shown_commands,
    wait_until,
)
from tests.ops.conftest import ROOT, descendants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.workers]

README = ROOT / "README.md"
FLEET = ROOT / "docs" / "fleet.md"
FLEET_DOCS_CLI = "tests/ops/test_readme_commands.py::test_the_fleet_docs_cli_block_works_as_printed"
EVAL = "tests/ops/test_cli_eval.py::test_eval_drift_prints_each_pairs_drift_in_the_references_shape"
DBM = "tests/stores/test_stores_doc.py::test_the_mapping_store_block_runs_and_the_cli_reads_its_dbm_file"
METRICS_PREFORK = "tests/telemetry/test_metrics_fleet.py::test_a_prefork_worker_serves_the_sum_of_its_children_on_its_metrics_port"
WORKER_COMMAND = "tests/ops/test_worker_command.py::"
UPGRADING = "tests/ops/test_readme_commands.py::test_the_upgrading_docs_look_at_what_runs_block_works_as_printed"
CLEANING_UP = "tests/ops/test_operations.py::test_the_readmes_cleaning_up_block_works_as_printed"
RUN_ELSEWHERE = {  # a command the docs show -> the test (path::function) or CI script (path) that runs it
    # docs/fleet.md, many steps in flight per process (issue #29): run as printed, on the demo's app
    "lousho worker --app myapp.lousho_app:app": WORKER_COMMAND
    + "test_lousho_worker_runs_a_process_per_core_with_many_slots_and_starts_again_one_that_dies",
    "lousho worker --app myapp.lousho_app:app --processes 1 -c 500": WORKER_COMMAND
    + "test_lousho_worker_runs_one_process_with_the_slots_and_the_pool_asked_for",
    "lousho worker --app myapp.lousho_app:app -P threads -c 50": WORKER_COMMAND
    + "test_lousho_worker_runs_one_process_with_the_slots_and_the_pool_asked_for",
    "bash scripts/check": ".ci/run",  # the suite itself, this test included
    # docs/stores.md, re-sealing old data (issue #31): run as printed on a store written before its keys
    "lousho reseal --all": "tests/stores/test_reseal.py::"
    + "test_the_docs_reseal_command_migrates_a_store_written_before_its_keys",
    # its argument handling, on stand-in tools (running the suite from inside the suite would run it twice)
    "bash scripts/check --fast": "tests/test_check_script.py::test_scripts_check_runs_lint_types_and_contracts_then_the_tests_its_arguments_name",
    "lousho demo": "tests/ops/test_demo.py::test_lousho_demo_kills_a_worker_recovers_and_finishes_every_session",
    # docs/upgrading.md (issue #35): against a live worker of the fleet
    "lousho --version": UPGRADING,
    "lousho workers": UPGRADING,
    "lousho workers --json": UPGRADING,
    "python examples/trip_planner_fork.py": "tests/test_examples.py::test_trip_planner_fork_shows_the_divergence",
    "lousho sessions --status awaiting-approval": FLEET_DOCS_CLI,
    "lousho approvals": FLEET_DOCS_CLI,
    'lousho approve appr_... --note "ok"': FLEET_DOCS_CLI,
    "lousho show chat-42": FLEET_DOCS_CLI,
    "lousho history chat-42": FLEET_DOCS_CLI,
    "lousho abort chat-42; lousho resume chat-42": FLEET_DOCS_CLI,
    "lousho eval --drift trip trip.fork-1": EVAL,
    "lousho eval --drift trip trip.fork-1 --fail-on-drift": EVAL,
    # README "Cleaning up" (issue #32): run as printed on a store with a run left in-progress two hours ago
    "lousho prune --status in-progress --older-than 1h --dry-run": CLEANING_UP,
    "lousho prune --status in-progress --older-than 1h": CLEANING_UP,
    "lousho delete chat-42.porto": CLEANING_UP,
    "lousho eval --drift trip 'trip.fork-*'": EVAL,
    "lousho eval --drift 'trip.fork-*' 'trip-v2.fork-*' --json": EVAL,
    "lousho --store-url dbm://./.lousho/runs.db sessions": DBM,
    "lousho --store-url dbm://./.lousho/runs.db history chat-7": DBM,
    "lousho dashboard --port 8300": "tests/dashboard/test_dashboard_cli.py::test_lousho_dashboard_serves_the_fleets_sessions",
    "lousho --store-url sqlite:///runs.db dashboard --read-only --port 8301": (
        "tests/dashboard/test_dashboard_cli.py::test_lousho_dashboard_read_only_over_sqlite_refuses_posts"
    ),
    ".venv/bin/python -m chaos": "scripts/check",  # the test command runs the chaos suite this way
    ".venv/bin/python -m pytest tests/chaos -k kills": "tests/chaos/test_worker_kills.py::test_random_worker_kills_keep_every_guarantee",
    # docs/observability.md (issue #19): the tests run them with the test's folder, port and collector
    "PROMETHEUS_MULTIPROC_DIR=/var/lib/lousho-metrics LOUSHO_METRICS=1 celery -A myapp.lousho_app worker": METRICS_PREFORK,
    "lousho metrics --port 9808": "tests/telemetry/test_metrics_fleet.py::test_a_scrape_after_a_fleet_run_counts_its_turns_calls_and_the_requeue_of_a_killed_call",
    "LOUSHO_TRACES=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 celery -A myapp.lousho_app worker": "tests/telemetry/test_traces_fleet.py::test_a_run_is_one_trace_across_workers_the_outbox_and_a_requeue_after_a_sigkill",
}
NOT_RUN = {  # shown, and run by no test: each is a gap (issue #15), named here so that none goes unnoticed
    "docker compose -f deploy/docker-compose.yml up --build --scale worker=4": "needs a container engine, which "
    "this machine has not; tests/ops/test_compose_without_docker.py runs every service's own command and "
    "environment from the compose file as processes (4 workers, beat, Flower, Redis with its flags), and "
    "scripts/check-wheel builds and installs the wheel as the Dockerfile does",
}


def walked() -> list[str]:
    """The commands this walkthrough runs, as the docs print them (the last step checks each was run)."""
    first = bash_blocks(README)[0]
    status = [c for c in bash_block_after(FLEET, "### A web app") if c.startswith("curl localhost:8000/jobs/")]
    return [
        *[c for c in first if c != "bash scripts/check"],
        *bash_block_after(README, "## A five-minute tour"),
        *bash_block_after(README, "## The fleet"),
        *bash_block_after(README, "### A web app"),
        *status,  # docs/fleet.md's copy of the web-app block adds how to follow a job
        *bash_block_after(README, "### The `lousho` command"),
        *bash_block_after(README, "### Flower"),
    ]


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    walk = Walk(tmp_path_factory.mktemp("walk"))
    walk.baseline = set(descendants(os.getpid()))
    try:
        yield walk
    finally:
        walk.end_everything()  # whatever happened (the last step checks it on the way through)


def installed(walk: Walk, distribution: str) -> bool:
    """Whether the walk's venv holds `distribution` (so far it holds only what the README has installed)."""
    return any((walk.checkout / ".venv" / "lib").glob(f"python3*/site-packages/{distribution}-*.dist-info"))


def one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def test_1_the_first_lines_make_the_venv_install_lousho_and_run_the_demo(walk: Walk) -> None:
    with walk.step("the venv, the install and the demo"):
        walk.copy_checkout()
        make_venv, install_and_demo = bash_blocks(README)[0][:2]
        assert make_venv == "python3 -m venv .venv && source .venv/bin/activate", make_venv
        walk.sh(make_venv, timeout_s=120)
        assert (walk.checkout / ".venv" / "bin" / "python").is_file()
        out = one_line(walk.sh(install_and_demo, timeout_s=240))
        assert (walk.checkout / ".venv" / "bin" / "lousho").is_file()  # installed by the line, in the new venv
        assert "All 3 sessions finished" in out and "was killed with SIGKILL" in out, out[-3000:]
        # which way the killed worker's session came back (issue #32: the death sweep, or the deadline's reaper)
        assert re.search(r"Recovered: trip-\w+: (the death sweep|the reaper|another reaper) requeued it", out), out[-3000:]
        for city in ("Lisbon", "Oslo", "Rome"):
            assert f"Your day in {city}: sunny, lunch at Casa {city} (booked for 2)." in out
        # The demo ends with the README's look-around commands (naming the session it killed, which varies).
        closing = re.findall(r"lousho (sessions|show trip-\w+|history trip-\w+)", out.split("How to look at it", 1)[1])
        readme = [line.split()[1] for line in bash_block_after(README, "## A five-minute tour")[:3]]
        assert [c.split()[0] for c in closing] == readme == ["sessions", "show", "history"], closing


def test_2_the_look_around_commands_find_the_demos_runs(walk: Walk) -> None:
    with walk.step("the look-around commands"):
        out = {line: walk.sh(line) for line in bash_block_after(README, "## A five-minute tour")}
        for city in ("lisbon", "oslo", "rome"):
            assert re.search(rf"trip-{city}\s+│\s+finished\s+│\s+trip_planner", out["lousho sessions"]), out
        show = one_line(out["lousho show trip-lisbon"])
        assert "trip-lisbon (finished, step 3)" in show and "Your day in Lisbon" in show, show
        history = out["lousho history trip-lisbon"]
        assert "history of trip-lisbon" in history
        assert all(status in history for status in ("finished", "awaiting-approval", "in-progress")), history
        in_process = one_line(out["lousho demo --in-process"])
        assert "killed with SIGKILL" in in_process and "Finished (stop)" in in_process, in_process[-2000:]


def test_3_the_fleet_sections_worker_and_reaper_run_on_the_local_store(walk: Walk) -> None:
    with walk.step("the fleet section"):
        module = next(block for block in python_blocks(README) if block.startswith("# myapp/lousho_app.py"))
        (walk.checkout / "myapp").mkdir()
        (walk.checkout / "myapp" / "lousho_app.py").write_text(module)  # the reader's file, as the README has it
        worker_line, reaper_line = bash_block_after(README, "## The fleet")
        worker, reaper = walk.start(worker_line), walk.start(reaper_line)
        wait_until("the greeter worker is ready", lambda: " ready." in worker.text(), log=worker)
        assert "serving greeter on lousho:queue:greeter" in worker.text()
        # Issue #15: the local store, never a Redis someone may have on 6379.
        store = str(LocalRedis(walk.home).socket_path)
        assert f"redis+socket://{store}" in worker.text(), worker.text()[-3000:]
        wait_until("the reaper runs", lambda: "a pass every" in reaper.text(), log=reaper)
        assert store in reaper.text() and reaper.process.poll() is None


def test_4_the_web_app_takes_a_job_shows_its_approval_and_finishes_it(walk: Walk) -> None:
    with walk.step("the web app"):
        install, worker_line, server_line, post_job, approvals, decide, events = bash_block_after(
            README, "### A web app"
        )
        [status] = [c for c in bash_block_after(FLEET, "### A web app") if c.startswith("curl localhost:8000/jobs/")]
        port = str(free_port())

        def curl(line: str, **filled: str) -> Any:
            command = line.replace("localhost:8000", f"localhost:{port}")
            for placeholder, value in filled.items():
                command = command.replace(placeholder, value)
            return json.loads(walk.sh(command, shown=line))

        assert install == "pip install -e '.[web]'", install
        assert not installed(walk, "uvicorn"), "the venv has only what the README installed so far"
        walk.sh(install, timeout_s=240)
        assert installed(walk, "uvicorn") and installed(walk, "fastapi")
        worker = walk.start(worker_line)
        server = walk.start(server_line.replace("--port 8000", f"--port {port}"), shown=server_line)
        wait_until("the booker worker is ready", lambda: "serving booker, writer on lousho:queue:booker+writer" in worker.text())
        wait_until("uvicorn answers", lambda: "Uvicorn running" in server.text(), log=server)
        job = curl(post_job)["session_id"]
        wait_until("the job waits", lambda: curl(status, **{"job-...": job})["status"] == "awaiting-approval")
        pending = wait_until("the approval is listed", lambda: curl(approvals))
        assert [(p["session_id"], p["tool"], p["arguments"]) for p in pending] == [
            (job, "book_table", {"restaurant": "Casa Lisboa", "people": 2})
        ]
        assert curl(decide, **{"appr_...": pending[0]["id"]})["status"] == "approved"
        done = wait_until("the job ends", lambda: (s := curl(status, **{"job-...": job}))["status"] == "finished" and s)
        assert done["text"] == "Booked: Casa Lisboa at 20:00 for 2.", done
        # the job's live events (issue #34), read after it finished: the whole stream, then the end
        streamed = walk.sh(events.replace("localhost:8000", f"localhost:{port}").replace("job-...", job), shown=events)
        kinds = re.findall(r"^event: (\S+)$", streamed, re.M)
        assert kinds[-1] == "end", kinds
        assert {"approval-requested", "approval-decided", "tool-call-started", "tool-call-finished", "finished"} <= set(kinds)


def status_of(walk: Walk, session: str) -> dict[str, Any]:
    return json.loads(walk.sh(f"lousho show {session} --json"))  # type: ignore[no-any-return]


def test_5_the_cli_block_enqueues_approves_forks_and_compares(walk: Walk) -> None:
    with walk.step("the CLI block"):
        enqueue, approve, fork, compare = bash_block_after(README, "### The `lousho` command")
        printed = walk.sh(enqueue).splitlines()
        assert printed[0] == "chat-42" and printed[1].startswith("awaiting-approval approval=appr_"), printed
        approval = printed[1].split("approval=")[1].split()[0]  # the id a reader copies
        out = one_line(walk.sh(approve.replace("appr_...", approval), shown=approve))
        assert approval in out.split("approved", 1)[0]  # `lousho approvals` listed it
        assert f"approved {approval} (book_table of chat-42)" in out, out
        wait_until("chat-42 finishes", lambda: status_of(walk, "chat-42")["status"] == "finished")
        forked = walk.sh(fork).splitlines()
        assert forked[0] == "chat-42.porto" and "forked chat-42 at step 2" in forked[1], forked
        wait_until("the fork finishes", lambda: status_of(walk, "chat-42.porto")["status"] == "finished")
        results = [
            m["content"] for m in status_of(walk, "chat-42.porto")["messages"] if m.get("tool_call_id") == "book-1"
        ]
        assert [json.loads(r)["booked"] for r in results] == ["Casa Porto"]
        compared = walk.sh(compare)
        assert "diverged at step 2" in compared and "Casa Porto" in compared, compared


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_6_flower_with_its_extra_shows_a_job_of_the_fleet_section(walk: Walk) -> None:
    with walk.step("Flower"):
        section = README.read_text(encoding="utf-8").split("### Flower", 1)[1]
        install = re.search(r"`(pip install [^`]*\[flower\][^`]*)`", section.split("```", 1)[0])
        assert install is not None, "the Flower section names its install"
        assert not installed(walk, "flower"), "the venv has only what the README installed so far"
        walk.sh(install.group(1), timeout_s=240)
        assert installed(walk, "flower")
        [line] = bash_block_after(README, "### Flower")
        port = free_port()
        flower = walk.start(line.replace("--port=5555", f"--port={port}"), shown=line)
        base = f"http://127.0.0.1:{port}"
        wait_until("Flower answers", lambda: urllib.request.urlopen(f"{base}/healthcheck", timeout=2).read() == b"OK",
                   log=flower)  # fmt: skip
        # A job on the fleet section's greeter while Flower watches (this line is the test's, not the README's).
        printed = walk.sh('lousho enqueue greeter "Hello from the walkthrough" --wait').splitlines()
        session = printed[0]
        assert printed[1] == "finished Hello!", printed
        turn = f"{session}/turn/1"
        tasks = wait_until("Flower lists the turn", lambda: (t := get_json(f"{base}/api/tasks")).get(turn) and t)
        assert (tasks[turn]["name"], tasks[turn]["args"]) == ("lousho.model_turn", f"session={session} turn=1")
        assert "Hello from the walkthrough" not in json.dumps(tasks)  # ids only: the prompt never reaches Flower


def test_7_every_process_started_is_ended_and_every_walked_command_ran(walk: Walk) -> None:
    left = walk.end_everything()
    assert left == [], f"still running: {left}"
    assert set(descendants(os.getpid())) <= walk.baseline
    if walk.failed:  # that step failed the run already; the commands after it were never reached
        pytest.skip(f"the walkthrough stopped at: {walk.failed}")
    assert [line for line in walked() if line not in walk.ran] == []


def test_8_following_the_readme_leaves_git_status_clean(walk: Walk) -> None:
    if walk.failed:  # the copy may not even exist; test_7 and the failed step say what went wrong
        pytest.skip(f"the walkthrough stopped at: {walk.failed}")
    assert (walk.checkout / "myapp" / "lousho_app.py").is_file() and (walk.checkout / ".venv").is_dir()  # it ran
    assert walk.git_status() == [], "following the README left files git status shows: name them in .gitignore"


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_command_the_docs_show_is_run_by_a_test() -> None:
    shown = {command: document.relative_to(ROOT) for document in DOCS for command in shown_commands(document)}
    walks = set(walked())
    missing = sorted(
        f"{where}: {c}" for c, where in shown.items() if c not in walks | set(RUN_ELSEWHERE) | set(NOT_RUN)
    )
    assert missing == [], f"shown, run by no test (walk them here, or map them to their test): {missing}"
    assert sorted((set(RUN_ELSEWHERE) | set(NOT_RUN)) - set(shown)) == [], "stale entries: the docs no longer show them"
    assert not walks & set(RUN_ELSEWHERE), "a walked command needs no other test here"
    for command, where in RUN_ELSEWHERE.items():
        path, _, function = where.partition("::")
        assert (ROOT / path).is_file(), (command, where)
        if function:
            assert function in defined_tests(ROOT / path), f"{where} (for {command!r}) does not exist"
        else:
            assert command in (ROOT / path).read_text(encoding="utf-8"), f"{path} does not run {command!r}"
