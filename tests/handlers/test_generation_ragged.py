"""The packed step's attention pieces: the decode rows' attention in either layout, soft-capped
attention, and models it cannot serve."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from handlers.generation.ragged import _sdpa, decode_attention, install


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the two layouts
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_decode_attention_is_each_rows_attention_over_its_columns(dtype, masked, softcap) -> None:
    gen = torch.Generator().manual_seed(1)
    rows, heads, kv_heads, width, dim = 3, 6, 2, 7, 8
    q = torch.randn(rows, heads, dim, generator=gen).to(dtype)
    k = torch.randn(rows, kv_heads, width, dim, generator=gen).to(dtype)
    v = torch.randn(rows, kv_heads, width, dim, generator=gen).to(dtype)
    lengths = [7, 4, 1] if masked else [width] * rows
    mask = None
    if masked:
        mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
    got = decode_attention(q, k, v, mask, None, softcap)
    assert got.shape == (rows, heads, dim) and got.dtype == dtype
    for row, n in enumerate(lengths):  # one row alone, its own columns only, heads expanded
        rk = k[row, :, :n].float().repeat_interleave(heads // kv_heads, 0)
        rv = v[row, :, :n].float().repeat_interleave(heads // kv_heads, 0)
        scores = q[row].float()[:, None, :] @ rk.transpose(-1, -2) * dim**-0.5
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        want = (scores.softmax(-1) @ rv)[:, 0]
        tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
        assert torch.allclose(got[row].float(), want, atol=tolerance), (row, dtype)
