"""The packed step's attention pieces: soft-capped attention, and models it cannot serve."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from handlers.generation.ragged import _sdpa, install


def test_softcapped_attention_is_plain_attention_when_the_cap_is_far() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 8, generator=gen)
    k, v = torch.randn(1, 2, 5, 8, generator=gen), torch.randn(1, 2, 5, 8, generator=gen)
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    capped = _sdpa(q, k, v, None, None, softcap=1e6, causal=True)
    assert torch.allclose(capped, plain, atol=1e-5)
    near = _sdpa(q, k, v, None, None, softcap=0.1, causal=True)
    assert not torch.allclose(near, plain, atol=1e-3)  # a close cap changes the result


def test_a_model_whose_attention_cannot_be_swapped_is_refused() -> None:
    class Opaque(torch.nn.Module):
        def _can_set_attn_implementation(self) -> bool:
            return False

    with pytest.raises(ValueError, match="attention interface"):
        install(Opaque())
