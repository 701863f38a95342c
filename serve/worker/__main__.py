"""``python -m serve.worker SPEC_JSON``: the worker process entry point."""

import sys

from serve.worker.main import main

sys.exit(main(sys.argv))
