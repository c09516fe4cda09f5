"""The PNG plots of `python -m bench` (matplotlib, Agg backend). Each returns the file name it wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {
    "lousho": "#1f77b4",
    "lousho, outbox off": "#aec7e8",
    "LangGraph": "#ff7f0e",
    "DBOS": "#2ca02c",
    "floor": "#7f7f7f",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _errors(stat_list: list[dict[str, Any]]) -> list[list[float]]:
    return [[s["median"] - s["min"] for s in stat_list], [s["max"] - s["median"] for s in stat_list]]


def overhead(section: dict[str, Any], out: Path, rows: list[tuple[str, str, str]]) -> str | None:
    """Absolute time per step, and overhead per step, for every row that ran."""
    plt = _pyplot()
    frameworks = section["frameworks"]
    labels, absolute, extra, colors = [], [], [], []
    for framework, variant, label in rows:
        found = frameworks.get(framework, {})
        if "absolute" not in found:
            continue
        labels.append(f"{framework}: {label}")
        absolute.append(found["absolute"][variant])
        extra.append(found["overhead"].get(variant))
        colors.append(COLORS[framework])
    if not labels:
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(labels) + 1.6), sharey=True)
    positions = list(range(len(labels)))[::-1]
    left.barh(positions, [s["median"] for s in absolute], xerr=_errors(absolute), color=colors, capsize=3)
    left.set_yticks(positions, labels)
    left.set_xlabel("ms per step (model call + tool call), median, min-max")
    left.set_title("Time per step")
    shown = [(p, s, c) for p, s, c in zip(positions, extra, colors, strict=True) if s is not None]
    right.barh(
        [p for p, _, _ in shown],
        [s["median"] for _, s, _ in shown],
        xerr=_errors([s for _, s, _ in shown]),
        color=[c for _, _, c in shown],
        capsize=3,
    )
    right.set_xlabel("ms per step over the same framework without durability")
    right.set_title("Overhead of durability")
    figure.suptitle(f"In process: a {section['turns']}-turn tool loop, zero-latency model")
    figure.tight_layout()
    name = "overhead.png"
    figure.savefig(out / name, dpi=110)
    plt.close(figure)
    return name


def latency(section: dict[str, Any], out: Path) -> str:
    plt = _pyplot()
    kinds = ["floor", "lousho"]
    labels = ["floor: bare Celery hop", "lousho: model turn / tool call task"]
    if "lousho, outbox off" in section["per_hop_ms"]:
        kinds.append("lousho, outbox off")
        labels.append("lousho, outbox off")
    values = [section["per_hop_ms"][k] for k in kinds]
    rows = list(range(len(kinds) - 1, -1, -1))
    colors = [COLORS.get(k, COLORS["lousho"]) for k in kinds]
    figure, axis = plt.subplots(figsize=(7, 1.2 + 0.7 * len(kinds)))
    axis.barh(rows, [v["median"] for v in values], xerr=_errors(values), color=colors, capsize=4)
    axis.set_yticks(rows, labels)
    axis.axvline(1.5 * values[0]["median"], color="red", linestyle="--", label="goal: 1.5 x floor")
    axis.set_xlabel("ms per task hop, median, min-max")
    axis.set_title(f"Fleet: one session, {section['hops']} task hops, solo worker")
    axis.legend(loc="lower right")
    figure.tight_layout()
    name = "fleet_latency.png"
    figure.savefig(out / name, dpi=110)
    plt.close(figure)
    return name


def throughput(section: dict[str, Any], out: Path) -> str:
    plt = _pyplot()
    counts = sorted(section["by_workers"], key=int)
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for axis, measure, title in (
        (axes[0], "steps_per_s", "steps (task hops) / s"),
        (axes[1], "sessions_per_s", "sessions / s"),
    ):
        for kind, label in (("lousho", "lousho sessions"), ("floor", "floor: bare hop chains")):
            points = [section["by_workers"][c][kind][measure] for c in counts]
            axis.errorbar(
                [int(c) for c in counts],
                [p["median"] for p in points],
                yerr=_errors(points),
                marker="o",
                capsize=4,
                color=COLORS[kind],
                label=label,
            )
        axis.set_xticks([int(c) for c in counts])
        axis.set_xlabel("worker processes (solo pool)")
        axis.set_ylabel(title)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(
        f"Fleet throughput: {section['sessions']} sessions x {2 * section['turns'] + 1} task hops, median, min-max"
    )
    figure.tight_layout()
    name = "fleet_throughput.png"
    figure.savefig(out / name, dpi=110)
    plt.close(figure)
    return name


def growth(section: dict[str, Any], out: Path) -> str:
    plt = _pyplot()
    steps = section["steps"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, store in section["stores"].items():
        if "error" in store:
            continue
        style = "--" if name.startswith("naive") else "-"
        points = [store["save_ms"][str(s)] for s in steps]
        left.errorbar(
            steps,
            [p["median"] for p in points],
            yerr=_errors(points),
            marker="o",
            capsize=3,
            linestyle=style,
            label=name,
        )
        right.plot(steps, [store["bytes"][str(s)] / 1e6 for s in steps], marker="o", linestyle=style, label=name)
    langgraph = section.get("langgraph", {})
    if "bytes" in langgraph:
        left.plot(
            steps,
            [langgraph["step_ms"][str(s)] for s in steps],
            marker="s",
            color="black",
            linestyle=":",
            label="LangGraph SqliteSaver (whole super-step)",
        )
        right.plot(
            steps,
            [langgraph["bytes"][str(s)] / 1e6 for s in steps],
            marker="s",
            color="black",
            linestyle=":",
            label="LangGraph SqliteSaver",
        )
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xticks(steps, [str(s) for s in steps])
        axis.set_xlabel("step (messages of ~1 KB in the transcript)")
        axis.grid(alpha=0.3, which="both")
    left.set_ylabel("ms per save, median, min-max")
    left.set_title("Checkpoint save time")
    right.set_ylabel("MB stored for the session")
    right.set_title("Bytes per session (history ring of 50)")
    right.legend(fontsize=8)
    figure.tight_layout()
    name = "growth.png"
    figure.savefig(out / name, dpi=110)
    plt.close(figure)
    return name


def recovery(section: list[dict[str, Any]], out: Path) -> str:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 3.2))
    positions = list(range(len(section)))
    width = 0.35
    for offset, measure, label, color in (
        (-width / 2, "next_task_s", "session's next task starts", "#1f77b4"),
        (width / 2, "call_again_s", "killed call starts again", "#9467bd"),
    ):
        points = [r[measure] for r in section]
        axis.bar(
            [p + offset for p in positions],
            [p["median"] for p in points],
            width,
            yerr=_errors(points),
            capsize=4,
            color=color,
            label=label,
        )
    for position, row in zip(positions, section, strict=True):
        axis.hlines(row["bound_s"], position - 0.45, position + 0.45, colors="red", linestyles="--")
    axis.plot([], [], color="red", linestyle="--", label="lease TTL + reaper interval")
    axis.set_xticks(
        positions, [f"{r['name']}\nlease {r['lease_ttl_s']:g} s, reaper {r['reaper_interval_s']:g} s" for r in section]
    )
    axis.set_ylabel("s from SIGKILL, median, min-max")
    axis.set_title("Recovery of a session whose worker was SIGKILLed mid tool call")
    axis.legend(fontsize=8)
    figure.tight_layout()
    name = "recovery.png"
    figure.savefig(out / name, dpi=110)
    plt.close(figure)
    return name
