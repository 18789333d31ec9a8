"""The report's sections on the runtime without a Gym: the ledger's memory per attempt, and
dispatch throughput through the gate and the ledger."""

from __future__ import annotations

from ._format import Add, fmt
from ._records import DispatchResult, MemoryResult, MemoryRow

__all__ = ["dispatch_section", "memory_section"]


def memory_section(add: Add, memory: MemoryResult) -> None:
    add("## Ledger memory")
    add("")
    add("| attempts | Python heap (tracemalloc) | resident set growth (RSS) |")
    add("| ---: | ---: | ---: |")
    per: dict[int, dict[str, MemoryRow]] = {}
    for r in memory.results:
        per.setdefault(r.target_attempts, {})[r.mode] = r
    for n, modes in per.items():
        t, rss = modes.get("tracemalloc"), modes.get("rss")
        add(
            f"| {n:,} | {fmt(t.bytes_per_attempt if t else None, ' B/attempt', 0)} "
            f"({fmt(t.bytes / 2**20 if t else None, ' MiB', 0)}) | "
            f"{fmt(rss.bytes_per_attempt if rss else None, ' B/attempt', 0)} "
            f"({fmt(rss.bytes / 2**20 if rss else None, ' MiB', 0)}) |"
        )
    add("")
    add("Method: " + memory.method + ".")
    add("")


def dispatch_section(add: Add, dispatch: DispatchResult) -> None:
    add("## Dispatch throughput (gate + ledger, no Gym)")
    add("")
    add(
        "| in flight | batch | rows/s end to end | admit + dispatch only | completions only "
        "| µs per row |"
    )
    add("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in dispatch.results:
        add(
            f"| {d.in_flight:,} | {d.batch} | {d.rows_per_s:,} | "
            f"{d.admit_dispatch_rows_per_s:,} | {d.completion_rows_per_s:,} | "
            f"{d.us_per_row} |"
        )
    add("")
    add(
        f"{dispatch.rows_per_config:,} attempts per configuration, one dispatcher task: "
        "reserve rows, `gate.admit()`, one mutation with `mark_dispatched` + a no-op submit, "
        "one completion mutation per attempt, `take_ready`. A row is one attempt (one `/run` "
        "row)."
    )
    add("")
