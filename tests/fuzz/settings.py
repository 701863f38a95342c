"""How hard the fuzz tests try: bounded for CI, longer on demand.

``LANTERN_FUZZ=long`` (or ``LANTERN_FUZZ_EXAMPLES=N``) raises the examples per property or API
operation from the CI default; see docs/faults.md.
"""

from __future__ import annotations

import os

CI_EXAMPLES = 6  # per API operation and auth mode (~300 requests in all) and per codec property
LONG_EXAMPLES = 300


def examples(ci: int = CI_EXAMPLES) -> int:
    """Examples for one property: ``ci`` by default, more in the long mode."""
    if os.environ.get("LANTERN_FUZZ_EXAMPLES"):
        return int(os.environ["LANTERN_FUZZ_EXAMPLES"])
    return LONG_EXAMPLES if os.environ.get("LANTERN_FUZZ") == "long" else ci
