"""The installed version of gymckpt (read from the distribution's metadata)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__: str = version("gymckpt")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
