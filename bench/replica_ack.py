"""What replica acknowledgement costs a save (issue #18): `RedisStore` through Sentinel, `WAIT` off and on.

    python -m bench.replica_ack [--quick] [--out docs/bench/replica_ack.md]

A private Sentinel group (`lousho.testing.sentinel`: a primary, two replicas, a sentinel) on this machine.
The same sessions are saved step after step by two stores on it, one with `min_replicas_acked=0` and one
with `min_replicas_acked=1` (and one with 2: every replica), in interleaved rounds so that both see the same
machine load; the figure is each store's median save latency and its ratio to the store without `WAIT`
(replicas on the same host: the price is the replicas' apply time, not a network round trip, which a real
deployment adds once per save).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from lousho.checkpoint import Checkpoint
from lousho.messages import Message
from lousho.stores.redis import RedisStore
from lousho.testing.sentinel import SentinelGroup

__all__ = ["Figures", "measure", "render"]


@dataclass(frozen=True)
class Figures:
    saves: int
    median_ms: dict[int, float]
    """min_replicas_acked -> median save latency (ms)."""

    def ratio(self, acked: int) -> float:
        return self.median_ms[acked] / self.median_ms[0]


def _save_steps(store: RedisStore, session: str, steps: int, samples: list[float]) -> None:
    messages = [Message.user(f"task {session}")]
    for version in range(1, steps + 1):
        messages.append(Message.assistant(f"step {version} of {session}: " + "x" * 400))
        checkpoint = Checkpoint(session_id=session, agent_name="bench", version=version, messages=list(messages))
        started = time.perf_counter()
        store.checkpoints.save(session, checkpoint)
        samples.append((time.perf_counter() - started) * 1000)


def measure(*, rounds: int = 20, steps: int = 25, acks: tuple[int, ...] = (0, 1, 2)) -> Figures:
    """`rounds` x `steps` saves per setting, the settings taking turns each round."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    with SentinelGroup(replicas=max(acks)) as group:
        stores = {acked: RedisStore(group.url, prefix=prefix, min_replicas_acked=acked) for acked in acks}
        samples: dict[int, list[float]] = {acked: [] for acked in acks}
        try:
            for round_ in range(rounds):
                for acked, store in stores.items():
                    _save_steps(store, f"r{round_}-a{acked}", steps, samples[acked])
        finally:
            for store in stores.values():
                store.close()
    return Figures(rounds * steps, {acked: statistics.median(values) for acked, values in samples.items()})


def render(figures: Figures) -> str:
    lines = [
        "| min_replicas_acked | median save | against no WAIT |",
        "| - | - | - |",
        *(
            f"| {acked} | {ms:.3f} ms | {figures.ratio(acked):.2f}x |"
            for acked, ms in sorted(figures.median_ms.items())
        ),
    ]
    return "\n".join(lines) + f"\n\n{figures.saves} saves per setting, interleaved rounds, one machine.\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    figures = measure(rounds=4 if args.quick else 20)
    table = render(figures)
    print(table)
    if args.out:
        args.out.write_text("# Replica acknowledgement: a save's cost (`python -m bench.replica_ack`)\n\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
