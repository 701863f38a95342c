"""One forward pass for a whole engine step: decode rows and prompt chunks packed together.

The engine packs every token of a step into one sequence of batch 1 (first one token per running
row, then each prefill chunk's tokens) with its own position ids, and runs the model once:
embeddings, norms and MLPs are per token, so the weights are read once for decode and prefill
alike (a separate prefill forward costs about one more decode step on a CPU). Attention is the
one place where tokens meet; `attend`, registered as the model's attention implementation,
splits the packed tokens back into their sequences:

- the decode rows attend, as one batch, to the running batch's cache (`BatchCache`), their new
  keys written in place at each row's length;
- each prefill chunk attends causally to its own earlier chunks and itself (its cache grows in
  its `ChunkState` and joins the batch when the prompt is complete). One call per chunk and
  layer measured faster than one call over all of a step's chunks with a block-diagonal mask
  (0.9 against 1.4 ms a layer for 24 chunks of ~12 tokens in bfloat16 on two CPU threads:
  SDPA's masked path computes every pair of tokens).

The step's keys and values of every layer stay in the plan (`StepPlan.keys`) until it ends, so
that the prompts prefilled whole in this step join the batch from them in one copy per layer.

What a step holds is set in a context variable for the length of the forward (`StepPlan`); with
no plan (``model.generate``, a test's reference) `attend` is plain SDPA attention.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from handlers.generation.cache import Layers

IMPLEMENTATION = "lantern_ragged"


@dataclass
class ChunkState:
    """One prefill chunk in this step: its place among the packed tokens and its own cache."""

    offset: int  # first of its tokens in the packed input
    length: int
    past: Layers  # its cache before this chunk (empty for a prompt's first chunk)
    layers: Layers = field(default_factory=list)  # its cache after, filled layer by layer
    keep: bool = True  # False: the engine takes its keys from `StepPlan.keys`, not `layers`

    @property
    def past_length(self) -> int:
        return self.past[0][0].shape[2] if self.past else 0


class DecodeWrites(Protocol):
    """Where a step's decode rows write their new keys and what their attention reads: the
    running batch's cache (`BatchCache`), or its fixed view in a captured step
    (`handlers.generation.graphs.FixedWrites`)."""

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class StepPlan:
    """What the packed tokens of one forward are: ``rows`` decode rows, then ``chunks``."""

    rows: int
    batch: DecodeWrites
    chunks: list[ChunkState]
    decode_mask: torch.Tensor | None = None  # (rows, 1, 1, width), from the batch
    keys: Layers = field(default_factory=list)  # per layer the step's packed (keys, values)


_plan: contextvars.ContextVar[StepPlan | None] = contextvars.ContextVar("step_plan", default=None)


@contextmanager
def planned(plan: StepPlan) -> Iterator[None]:
    """Run the model's attention for ``plan`` inside the block."""
    token = _plan.set(plan)
    try:
        yield
    finally:
        _plan.reset(token)


def _sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None,
    causal: bool = False,
) -> torch.Tensor:
    """Attention of ``query (b, heads, q, d)`` over ``key``/``value (b, kv_heads, k, d)``."""
    groups = query.shape[1] // key.shape[1]
    if softcap is None:
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            is_causal=causal,
            scale=scaling,
            enable_gqa=groups > 1,
        )
    if groups > 1:  # the math form for logit soft-capping (Gemma 2)
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * (scaling or query.shape[-1] ** -0.5)
    scores = torch.tanh(scores / softcap) * softcap
    if causal:
        q, k = scores.shape[-2:]
        mask = torch.ones((q, k), dtype=torch.bool, device=scores.device).tril(k - q)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores.softmax(-1).to(value.dtype) @ value


# Dtypes whose one-query-per-row attention runs faster with each key/value head's query heads
# where the query positions would be (no grouped-query expansion): SDPA's ``enable_gqa`` was 5x
# slower in bfloat16 (1.07 against 0.20 ms a layer at 32 rows, two CPU threads), while in float32
# it is the faster one (288 against 426 us a layer at 32 rows x 70 columns, 39 against 66 us at one
# masked row). float16 goes with bfloat16 unmeasured; on CUDA neither layout was measured.
GROUPED_LAYOUT_DTYPES = (torch.bfloat16, torch.float16)


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None,
) -> torch.Tensor:
    """One new token per row: ``query (rows, heads, d)`` over the batch's ``key``/``value
    (rows, kv_heads, width, d)`` under ``mask (rows, 1, 1, width)``; returns ``(rows, heads,
    d)``, in the layout that is faster for the dtype (`GROUPED_LAYOUT_DTYPES`)."""
    rows, heads, dim = query.shape
    if query.dtype in GROUPED_LAYOUT_DTYPES:
        q = query.reshape(rows, key.shape[1], heads // key.shape[1], dim)
    else:
        q = query.unsqueeze(2)
    return _sdpa(q, key, value, mask, scaling, softcap).reshape(rows, heads, dim)


def attend(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention interface transformers calls per layer (``query (1, heads, tokens, d)``);
    returns ``(1, tokens, heads, d)``."""
    plan = _plan.get()
    softcap = kwargs.get("softcap")
    if plan is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    layer = module.layer_idx
    out = query.new_empty((1, query.shape[2], query.shape[1], query.shape[3]))
    rows = plan.rows
    if rows:
        k, v = plan.batch.write(
            layer, key[0, :, :rows].transpose(0, 1), value[0, :, :rows].transpose(0, 1)
        )
        q = query[0, :, :rows].transpose(0, 1)
        out[0, :rows] = decode_attention(q, k, v, plan.decode_mask, scaling, softcap)
    if plan.chunks:
        plan.keys.append((key, value))
    for chunk in plan.chunks:
        span = slice(chunk.offset, chunk.offset + chunk.length)
        k, v = key[:, :, span], value[:, :, span]
        if chunk.past:
            past_k, past_v = chunk.past[layer]
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        if chunk.keep:
            chunk.layers.append((k, v))
        q = query[:, :, span]
        if chunk.past:
            n, total = chunk.length, k.shape[2]
            mask = torch.ones((n, total), dtype=torch.bool, device=q.device).tril(total - n)
            result = _sdpa(q, k, v, mask, scaling, softcap)
        else:
            result = _sdpa(q, k, v, None, scaling, softcap, causal=True)
        out[0, span] = result[0].transpose(0, 1)
    return out, None


def install(model: Any) -> None:
    """Make `attend` the model's attention; raises ``ValueError`` for a model whose attention
    cannot be swapped (not written against transformers' attention interface)."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, attend)
    if not model._can_set_attn_implementation():
        raise ValueError(
            f"{type(model).__name__} does not use transformers' attention interface, which the "
            "engine's packed steps need"
        )
    model.set_attn_implementation(IMPLEMENTATION)
    for module in model.modules():
        # Some models (GPT-2) look for padding in the first and last input ids when no attention
        # mask is given, to warn once: a read of the ids on the device, a wait on it, in every
        # step. The engine's packed steps have no padding and no mask by design.
        if hasattr(module, "warn_if_padding_and_no_attention_mask"):
            module.warn_if_padding_and_no_attention_mask = _no_padding_check


def _no_padding_check(input_ids: Any, attention_mask: Any) -> None:
    return None
