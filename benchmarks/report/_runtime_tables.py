"""The report's sections on the runtime without a Gym: the ledger's memory per attempt, and
dispatch throughput through the gate and the ledger."""

from __future__ import annotations

from ._format import Add, fmt
from ._results import Result

__all__ = ["dispatch_section", "memory_section"]


def memory_section(add: Add, memory: Result) -> None:
    add("## Ledger memory")
    add("")
    add("| attempts | Python heap (tracemalloc) | resident set growth (RSS) |")
    add("| ---: | ---: | ---: |")
    per: dict[int, Result] = {}
    for r in memory["results"]:
        per.setdefault(r["target_attempts"], {})[r["mode"]] = r
    for n, modes in per.items():
        t, rss = modes.get("tracemalloc"), modes.get("rss")
        add(
            f"| {n:,} | {fmt(t['bytes_per_attempt'] if t else None, ' B/attempt', 0)} "
            f"({fmt(t['bytes'] / 2**20 if t else None, ' MiB', 0)}) | "
            f"{fmt(rss['bytes_per_attempt'] if rss else None, ' B/attempt', 0)} "
            f"({fmt(rss['bytes'] / 2**20 if rss else None, ' MiB', 0)}) |"
        )
    add("")
    add("Method: " + memory["method"] + ".")
    add("")


def dispatch_section(add: Add, dispatch: Result) -> None:
    add("## Dispatch throughput (gate + ledger, no Gym)")
    add("")
    add(
        "| in flight | batch | rows/s end to end | admit + dispatch only | completions only "
        "| µs per row |"
    )
    add("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in dispatch["results"]:
        add(
            f"| {r['in_flight']:,} | {r['batch']} | {r['rows_per_s']:,} | "
            f"{r['admit_dispatch_rows_per_s']:,} | {r['completion_rows_per_s']:,} | "
            f"{r['us_per_row']} |"
        )
    add("")
    add(
        f"{dispatch['rows_per_config']:,} attempts per configuration, one dispatcher task: "
        "reserve rows, `gate.admit()`, one mutation with `mark_dispatched` + a no-op submit, "
        "one completion mutation per attempt, `take_ready`. A row is one attempt (one `/run` "
        "row)."
    )
    add("")
