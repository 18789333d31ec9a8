"""``python -m gymckpt ...`` is the ``gymckpt`` command."""

import sys

from gymckpt.app.cli import main

sys.exit(main())
