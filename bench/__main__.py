"""``python -m bench``: see `bench.run`."""

import sys

from bench.run import main

sys.exit(main())
