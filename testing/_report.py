"""The result of a conformance run."""

from __future__ import annotations

import attrs

__all__ = ["ConformanceError", "ConformanceReport"]


class ConformanceError(AssertionError):
    """One or more conformance checks failed; the message lists each with what differed."""


@attrs.frozen
class ConformanceReport:
    """The checks that ran (by name) and how many episodes they played."""

    subject: str
    checks: tuple[str, ...]
    episodes: int


@attrs.define
class Checks:
    """Collects check results; ``finish`` raises ``ConformanceError`` if any failed."""

    subject: str
    passed: list[str] = attrs.field(factory=list)
    failed: list[str] = attrs.field(factory=list)
    episodes: int = 0

    def check(self, name: str, ok: bool, why: str = "") -> bool:
        if ok:
            self.passed.append(name)
        else:
            self.failed.append(f"{name}: {why}" if why else name)
        return ok

    def finish(self) -> ConformanceReport:
        if self.failed:
            raise ConformanceError(
                f"{self.subject}: {len(self.failed)} conformance check(s) failed:\n- "
                + "\n- ".join(self.failed)
            )
        return ConformanceReport(self.subject, tuple(self.passed), self.episodes)
