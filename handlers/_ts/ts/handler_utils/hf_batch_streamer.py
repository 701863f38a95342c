"""``ts.handler_utils.hf_batch_streamer``: one text stream per row of a batched ``generate``.

A handler passes ``TextIteratorStreamerBatch(tokenizer, batch_size)`` as ``streamer=`` to
``model.generate`` running in a thread, and iterates it meanwhile: each item is one new piece of
text per row, which it sends with ``send_intermediate_predict_response``. As in TorchServe it is a
transformers ``BaseStreamer`` over one ``TextIteratorStreamer`` per row (needs transformers).

Adapted: rows are decoded word by word, so they yield different numbers of pieces; a row that
has ended yields ``""`` until every row has, where TorchServe's iterator stops at the first row
to end and loses the other rows' last pieces.
"""

from __future__ import annotations

from typing import Any

from transformers.generation.streamers import BaseStreamer, TextIteratorStreamer

__all__ = ["TextIteratorStreamerBatch"]


class TextIteratorStreamerBatch(BaseStreamer):
    """``batch_size`` text streams, fed together by ``generate`` and read together."""

    def __init__(
        self,
        tokenizer: Any,
        batch_size: int,
        skip_prompt: bool = False,
        timeout: float | None = None,
        **decode_kwargs: Any,
    ) -> None:
        self.batch_size = batch_size
        self.streamers = [
            TextIteratorStreamer(tokenizer, skip_prompt, timeout, **decode_kwargs)
            for _ in range(batch_size)
        ]
        self.streamer_iterators = [iter(streamer) for streamer in self.streamers]
        self._ended = [False] * batch_size

    def put(self, value: Any) -> None:
        """Token ids from ``generate``: the prompts (rows x length), then one id per row."""
        if value.shape[0] != self.batch_size:
            raise ValueError(
                f"TextIteratorStreamerBatch batch size is set to {self.batch_size} but got "
                f"input tensor of shape {tuple(value.shape)}"
            )
        for index, streamer in enumerate(self.streamers):
            streamer.put(value[index : index + 1])

    def end(self) -> None:
        for streamer in self.streamers:
            streamer.end()

    def __iter__(self) -> TextIteratorStreamerBatch:
        return self

    def __next__(self) -> list[str]:
        """The next piece of every row (``""`` for a row that has ended); the end once all have."""
        values: list[str] = []
        for index, iterator in enumerate(self.streamer_iterators):
            if self._ended[index]:
                values.append("")
                continue
            try:
                values.append(next(iterator))
            except StopIteration:
                self._ended[index] = True
                values.append("")
        if all(self._ended):
            if any(values):
                return values
            raise StopIteration
        return values
