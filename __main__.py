"""``python -m gymckpt ...`` is the ``gymckpt`` command."""

import sys

from gymckpt.nurseries.app.cli import main

sys.exit(main())
