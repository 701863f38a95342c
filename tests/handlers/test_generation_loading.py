"""The engine's default dtype: bfloat16 where the device computes it natively, else float32."""

from __future__ import annotations

from pathlib import Path

import pytest

from handlers.generation.loading import auto_dtype, cpu_flags


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
        ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),
        ({"avx2", "avx512f"}, "float32"),  # AVX-512 without BF16: emulated bfloat16 is slower
        (set(), "float32"),  # flags unknown
    ],
)
def test_auto_dtype_on_a_cpu(flags: set[str], expected: str) -> None:
    assert auto_dtype("cpu", flags) == expected


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 sse\nbugs\t\t: none\n")
    assert cpu_flags(str(info)) == {"fpu", "avx512_bf16", "sse"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


def test_a_sliding_window_caps_the_context_the_engine_serves() -> None:
    from types import SimpleNamespace

    from handlers.generation.engine import model_context_length

    def model(**config: object) -> SimpleNamespace:
        return SimpleNamespace(config=SimpleNamespace(**config))

    assert model_context_length(model(max_position_embeddings=8192)) == 8192
    assert model_context_length(model(max_position_embeddings=8192, sliding_window=4096)) == 4096
    unused = model(max_position_embeddings=8192, sliding_window=4096, use_sliding_window=False)
    assert model_context_length(unused) == 8192  # Qwen2's configs name a window they do not use
    assert model_context_length(model(sliding_window=None)) is None
