"""`bench.memory_scaling.table`: MiB per column, the spare's three figures, "-" without one."""

from __future__ import annotations

from bench.memory_scaling import MIB, Row, table
from serve.core.host import ProcessMemory


def test_table_rows() -> None:
    spare = ProcessMemory(523 * MIB, 315 * MIB, 282 * MIB)
    rows = [
        Row("Lantern", "tiny", 2, 1061 * MIB, 630 * MIB, 568 * MIB, spare, 985 * MIB),
        Row("TorchServe 0.12", "tiny", 2, 1112 * MIB, 727 * MIB, 593 * MIB, None, 931 * MIB),
    ]
    lines = table(rows)
    assert lines[0].split()[-1] == "PSS" and "spare RSS/PSS/USS" in lines[0]
    assert lines[2].split() == ["Lantern", "tiny", "2", "1061", "630", "568", "523/315/282", "985"]
    assert lines[3].split()[-4:] == ["727", "593", "-", "931"]
