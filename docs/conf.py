"""Sphinx configuration of the gymckpt site (built by ``tests/test_docs.py`` with warnings as
errors: ``sphinx-build -W --keep-going -n -b html docs OUT``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "gymckpt"
author = "the gymckpt authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "gymckpt_docs"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext"]
root_doc = "index"
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
nitpicky = True
autodoc_member_order = "bysource"
autodoc_typehints = "none"
html_theme = "alabaster"
nitpick_ignore_regex = [
    # the standard library's and dependencies' classes: no inventory of theirs is fetched
    (
        "py:class",
        r"(enum|typing|collections\.abc|builtins|pathlib|datetime|os|trio|anyio|attrs|asyncio|contextlib|types|abc|logging|subprocess|socket|ssl|httpx)\..*",
    ),
]
nitpick_ignore_regex += [
    ("py:class", r"(numpy|gymnasium|random|pyspiel|textarena|ray)\..*"),
    # a private class named in a public signature (a base, a return type): not documented
    ("py:class", r"gymckpt(\.\w+)*\._\w+\..*"),
]
