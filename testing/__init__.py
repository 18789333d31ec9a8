"""gymckpt.testing: conformance kits for users and backend authors.

    from gymckpt.testing import check_environment, check_backend

    report = await check_environment(my_environment, workdir)        # your environment
    report = await check_backend(my_backend, workdir)                # your GymBackend

Both run under trio (or any anyio loop for ``check_environment``), raise ``ConformanceError``
listing every failed check, and return a ``ConformanceReport`` of the checks that ran.
"""

from gymckpt.testing._backend_kit import check_backend
from gymckpt.testing._environment_kit import check_environment
from gymckpt.testing._report import ConformanceError, ConformanceReport

__all__ = ["ConformanceError", "ConformanceReport", "check_backend", "check_environment"]
