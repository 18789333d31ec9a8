"""``gymckpt chaos``: a training program run uninterrupted and under random SIGKILLs, its final
weights compared (``main``); the kill points a program arms to have kills aimed at its
checkpoint stages (``points``). Parts: ``plan`` (where kills land), ``process`` (one start of
the program, its process group, no orphans), ``run`` (the runs and their digests)."""

from .main import add_chaos_parser, chaos, main_chaos, report
from .points import arm_kill_points

__all__ = ["add_chaos_parser", "arm_kill_points", "chaos", "main_chaos", "report"]
