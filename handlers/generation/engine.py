"""The generative engine a worker runs: iteration-level scheduling over ``model.forward``.

What the worker calls (docs/generation.md has the loop): ``add(request_id, request)`` queues a
sequence (bad input raises `PredictionException` for that request alone); ``step()`` runs one
iteration and returns a `StepOutput` for every sequence that produced something or ended;
``cancel(request_id)`` drops a sequence, freeing its slot before the next forward pass;
``limits()`` and ``stats()`` say what the worker can take and holds.

One step is one forward pass (handlers/generation/ragged.py): one token for every running
sequence and at most ``prefill_chunk_tokens`` of newcomers' prompts, packed together; a sequence
whose prompt is complete emits its first token and decodes with the batch from the next step.
A completed prompt's keys and values are kept (`PrefixCache`), and an admitted sequence whose
prompt starts with a kept one prefills only the rest; one found whole but its last token joins
the batch at once and decodes that token as a row of the step. Sequences admitted with the
same prompt share one prefill: the later ones join with the first from its keys and values and
take their first tokens from its logits (`PrefillChunk.riders`).
The engine runs in the calling thread and uses torch's intra-op threads only (the worker's
thread budget).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from handlers.exceptions import PredictionException, report_failure
from handlers.generation.cache import BatchCache, Layers
from handlers.generation.detokenize import IncrementalDecoder, StopMatcher
from handlers.generation.graphs import DecodeGraphs
from handlers.generation.params import GenerationRequest, SamplingParams
from handlers.generation.prefix import PrefixCache
from handlers.generation.ragged import ChunkState, StepPlan, install, planned
from handlers.generation.sampling import Choice, Sampler, TokenLogprobs, choose_tokens
from handlers.generation.scheduler import EngineLimits, PrefillChunk, Scheduler
from handlers.generation.transfers import to_device

logger = logging.getLogger(__name__)

FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED, FINISH_ERROR = "stop", "length", "cancelled", "error"
WARM_UP = "\x00warm-up"  # the one-token sequence `Engine.warm_up` shapes the cache with


@dataclass
class StepOutput:
    """What one sequence produced in one step (``token_ids`` may be empty when it just ended)."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] | None = None
    error: PredictionException | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(eq=False)
class Sequence:
    """One request's state inside the engine."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    reserved: int
    sampler: Sampler
    decoder: IncrementalDecoder
    stops: StopMatcher
    prefilled: int = 0
    output_ids: list[int] = field(default_factory=list)
    cache: Any = None  # its own cache while prefilling
    prompt_stored: bool = False  # the prefix cache holds its whole prompt already
    arrived: float = field(default_factory=time.monotonic)
    prompt_key: tuple[int, ...] = field(init=False)  # equal prompts share a prefill

    def __post_init__(self) -> None:
        self.prompt_key = tuple(self.prompt_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def last_token(self) -> int:
        """The token its next decode step feeds the model."""
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]


def _eos_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def model_context_length(model: Any) -> int | None:
    """The longest sequence the model's positions allow, when its config says; a model with
    sliding-window attention in use is capped at its window (the engine's attention is the full
    one, which is the same inside the window)."""
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    window = getattr(config, "sliding_window", None)
    if not getattr(config, "use_sliding_window", True) or not isinstance(window, int) or window < 1:
        window = None
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return min(value, window) if window else value
    return window


class Engine:
    """Continuous batching over a Hugging Face causal LM and its tokenizer."""

    def __init__(
        self, model: Any, tokenizer: Any, limits: EngineLimits, cuda_graphs: bool = True
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._limits = limits
        self.scheduler: Scheduler[Sequence] = Scheduler(limits)
        self.prefixes = PrefixCache(limits.prefix_cache_tokens)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self.device = getattr(model, "device", torch.device("cpu"))
        if self.device.type == "cuda":
            # cuDNN's attention (torch's first choice for bfloat16 on Hopper) builds a plan for
            # every new shape, and every decode step is one (the rows' lengths grow): 74 against
            # 17 ms a step at one stream on an H200 (docs/performance.md, GPU run 1). Flash and
            # memory-efficient attention take any shape as it comes.
            torch.backends.cuda.enable_cudnn_sdp(False)
        install(model)
        self.graphs = (  # decode steps replayed from CUDA graphs (`handlers.generation.graphs`)
            DecodeGraphs(model, self.device, limits.max_running_sequences)
            if cuda_graphs and self.device.type == "cuda"
            else None
        )
        self.batch = BatchCache(keep_memory=self.graphs is not None)
        self._cancelled: set[str] = set()
        self._leaving: set[str] = set()  # ended this step: their rows go together (`_leave_batch`)
        self.steps = 0
        self.shared_prompt_tokens = 0  # prompt tokens a rider did not prefill (its first's did)
        self.last_step: dict[str, int] = {}

    # -- the worker's interface ---------------------------------------------------------------

    def warm_up(self) -> None:
        """With CUDA graphs: reserve the batch cache for the KV budget (the largest captured
        row count x the budget's share of columns) and capture every decode size now, so that
        requests do not wait for captures. Called once after loading; nothing on a CPU. A
        failure only turns the graphs off."""
        if self.graphs is None:
            return
        rows = self.graphs.sizes[-1]
        columns = min(
            max(256, -(-self._limits.max_cached_tokens // rows)), self._limits.max_model_len
        )
        started = time.perf_counter()
        with torch.inference_mode():
            try:
                state = ChunkState(0, 1, [], keep=True)  # one token shows the cache's shapes
                token = torch.zeros((1, 1), dtype=torch.long, device=self.device)
                self._forward(token, token, token[0], StepPlan(0, self.batch, [state]))
                self.batch.join(WARM_UP, state.layers, 1)
                self.batch.reserve(rows, columns + 1)
                self.batch.leave({WARM_UP})
                captured = self.graphs.capture_all(self.batch)
            except Exception:
                logger.exception("Warming up the CUDA graphs failed; decode steps run eagerly")
                self.graphs.enabled = False
                return
        logger.info(
            "CUDA graphs: %d decode sizes (1 to %d rows) captured over %d cache columns in %.1f s",
            captured, rows, self.batch.layers[0][0].shape[2], time.perf_counter() - started,
        )  # fmt: skip

    def limits(self) -> EngineLimits:
        return self._limits

    def stats(self) -> dict[str, int]:
        """Live counts: sequences by state, reserved and padded cache positions, steps run."""
        s = self.scheduler
        return {
            "waiting": len(s.waiting),
            "prefilling": len(s.prefilling),
            "running": len(s.running),
            "reserved_tokens": s.reserved_tokens,
            "cached_tokens": self.batch.padded_tokens,
            "steps": self.steps,
            "prefix_cache_tokens": self.prefixes.tokens,
            "prefix_queried_tokens": self.prefixes.queried_tokens,
            "prefix_hit_tokens": self.prefixes.hit_tokens,
            "shared_prompt_tokens": self.shared_prompt_tokens,
            **(
                {"cuda_graph_hits": self.graphs.hits, "cuda_graph_captures": self.graphs.captures}
                if self.graphs is not None
                else {}
            ),
        }

    def has_work(self) -> bool:
        return len(self.scheduler) > 0

    def reservation(self, request_id: str) -> int | None:
        """The cache positions a request reserves once admitted (prompt + max_tokens, capped by
        max_model_len); None when it is not here."""
        seq = self.scheduler.find(request_id)
        return seq.reserved if seq is not None else None

    def __contains__(self, request_id: str) -> bool:
        return self.scheduler.find(request_id) is not None

    def check(self, request: GenerationRequest) -> tuple[list[int], int]:
        """Tokenize and check a request: (prompt ids, the cache positions it will reserve);
        raises `PredictionException` (400, or 507 if it can never fit). Touches no engine state,
        so a worker may run it on another thread (to report the reservation early)."""
        try:
            prompt_ids = list(self.tokenizer.encode(request.prompt))
        except Exception as exc:  # a tokenizer bug fails this request, not the worker
            raise PredictionException(
                f"the tokenizer failed on this prompt: {type(exc).__name__}: {exc}", 400
            ) from exc
        if not prompt_ids:
            raise PredictionException("the prompt encodes to no tokens", 400)
        limit = self._limits.max_model_len
        if len(prompt_ids) >= limit:
            raise PredictionException(
                f"the prompt has {len(prompt_ids)} tokens; this model takes at most {limit - 1}",
                400,
            )
        reserved = min(len(prompt_ids) + request.params.max_tokens, limit)
        if reserved > self._limits.max_cached_tokens:
            raise PredictionException(
                f"the request needs {reserved} cache positions (prompt + max_tokens); this "
                f"worker's KV-cache budget is {self._limits.max_cached_tokens}",
                507,
            )
        return prompt_ids, reserved

    def add(
        self,
        request_id: str,
        request: GenerationRequest,
        checked: tuple[list[int], int] | None = None,
    ) -> None:
        """Queue a request (``checked``: what `check` gave for it, if it ran already); raises
        `PredictionException` (400, or 507 if it can never fit)."""
        if request_id in self:
            raise PredictionException(f"request {request_id!r} is already being generated", 400)
        prompt_ids, reserved = checked if checked is not None else self.check(request)
        params = request.params
        seq = Sequence(
            request_id=request_id,
            prompt_ids=prompt_ids,
            params=params,
            reserved=reserved,
            sampler=Sampler(params, prompt_ids, self.eos_token_ids),
            decoder=IncrementalDecoder(self.tokenizer),
            stops=StopMatcher(params.stop),
        )
        self.scheduler.add(seq)

    def cancel(self, request_id: str) -> bool:
        """Drop a sequence at the start of the next step; False when it is not here."""
        if request_id not in self:
            return False
        self._cancelled.add(request_id)
        return True

    def step(self) -> list[StepOutput]:
        """One iteration: cancellations, admission, then one forward pass for the running batch's
        next tokens and at most ``prefill_chunk_tokens`` of newcomers' prompts. All of it runs
        in inference mode: the forward's tensors (its logits, the step's keys) are inference
        tensors, which may be written in place only there."""
        with torch.inference_mode():
            outputs = self._drop_cancelled()
            self._leave_batch()
            self._reuse_prefixes(self.scheduler.admit())
            running = len(self.batch)
            chunks = self.scheduler.plan_prefill()
            if running or chunks:
                outputs += self._forward_step(chunks)
                self._leave_batch()
        self.steps += 1
        self.last_step = {
            "decoded": running,
            "prefill_tokens": sum(c.end - c.start for c in chunks),
        }
        if logger.isEnabledFor(logging.DEBUG):  # the step log: how big each batch was, who joined
            logger.debug(
                "step %d: decoded %d, prefilled %d tokens, waiting %d, finished %d",
                self.steps,
                running,
                self.last_step["prefill_tokens"],
                len(self.scheduler.waiting),
                sum(out.finished for out in outputs),
            )
        return outputs

    # -- inside a step ------------------------------------------------------------------------

    def _forward_step(self, chunks: list[PrefillChunk[Sequence]]) -> list[StepOutput]:
        """Decode every running row and prefill ``chunks`` in one packed forward pass."""
        by_id = {seq.request_id: seq for seq in self.scheduler.running}
        rows = [by_id[key] for key in self.batch.keys]
        prefill = [c.sequence for c in chunks]
        assert all(isinstance(seq, Sequence) for seq in prefill)
        ids = [seq.last_token for seq in rows]
        positions = list(self.batch.lengths)  # each row's next position is its length
        states, last = [], []
        for chunk, seq in zip(chunks, prefill, strict=True):
            # A whole prompt in one chunk joins the batch from the step's keys (`StepPlan.keys`)
            joins_packed = chunk.last and not seq.cache
            states.append(
                ChunkState(
                    len(ids), chunk.end - chunk.start, seq.cache or [], keep=not joins_packed
                )
            )
            ids += seq.prompt_ids[chunk.start : chunk.end]
            positions += range(chunk.start, chunk.end)
            last.append(len(ids) - 1)
        self.batch.begin_step()
        plan = StepPlan(len(rows), self.batch, states)
        try:
            logits = None
            if self.graphs is not None and not chunks:  # a decode step: replayed if it fits
                logits = self.graphs.run(self.batch, ids)
            if logits is None:
                plan.decode_mask = self.batch.step_mask(self.batch.write_positions)
                ids_on, positions_on, keep = to_device(  # the step's inputs in one copy
                    self.device,
                    torch.tensor(ids, dtype=torch.long),
                    torch.tensor(positions, dtype=torch.long),
                    torch.tensor(list(range(len(rows))) + last, dtype=torch.long),
                )
                logits = self._forward(ids_on[None], positions_on[None], keep, plan)
        except Exception as exc:
            return [self._fail(seq, exc) for seq in rows + prefill]
        if rows:
            self.batch.advanced()
        emitting, at = list(rows), list(range(len(rows)))
        joining: list[tuple[str, int, int]] = []  # (key, length, offset) in the step's keys
        for i, (chunk, seq, state) in enumerate(zip(chunks, prefill, states, strict=True)):
            self.shared_prompt_tokens += sum(r.prompt_len - r.prefilled for r in chunk.riders)
            self.scheduler.prefilled(chunk)
            seq.cache = state.layers
            if not chunk.last:
                continue
            if state.keep:
                prompt_layers = state.layers
            else:
                span = slice(state.offset, state.offset + seq.prompt_len)
                prompt_layers = [(k[:, :, span], v[:, :, span]) for k, v in plan.keys]
            self._store_prefix(seq, prompt_layers, owned=state.keep)
            for joiner in (seq, *chunk.riders):  # a rider's prompt is its first's
                if state.keep:
                    self.batch.join(joiner.request_id, state.layers, seq.prompt_len)
                else:
                    joining.append((joiner.request_id, seq.prompt_len, state.offset))
                joiner.cache = None
                emitting.append(joiner)
                at.append(len(rows) + i)
        if joining:
            keys, lengths, offsets = (list(column) for column in zip(*joining, strict=True))
            self.batch.join_packed(keys, lengths, offsets, plan.keys)
        if at != list(range(logits.shape[0])):  # riders take copies of their first's row
            logits = logits[to_device(self.device, torch.tensor(at, dtype=torch.long))[0]]
        samplers = [seq.sampler for seq in emitting]
        try:
            choices = choose_tokens(samplers, logits)
        except Exception as exc:  # choosing together failed: every row of the step fails
            return [self._fail(seq, exc) for seq in emitting]
        return [self._emit(seq, choice) for seq, choice in zip(emitting, choices, strict=True)]

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, plan: StepPlan
    ) -> torch.Tensor:
        """The packed forward: logits at the positions in ``keep`` (``(rows, vocab)``, float,
        on the model's device; the inputs are there already). Float: a CPU's argmax over
        bfloat16 took 2.6 ms a step at 32 rows of a 49k vocabulary, over float 0.4 ms."""
        with planned(plan):
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                use_cache=False,
                logits_to_keep=keep,
            )
        return out.logits[0].float()

    def _reuse_prefixes(self, admitted: list[Sequence]) -> None:
        """Start admitted sequences' prefills after the longest kept prefix of their prompts. A
        prompt found whole but its last token joins the batch now and decodes that token with
        it: one row of this step's decode, not a prefill chunk of its own (which costs an
        attention call per layer)."""
        found: list[tuple[Sequence, Layers]] = []
        for seq in admitted:
            hit = self.prefixes.lookup(seq.prompt_ids)
            if hit is None:
                continue
            seq.prompt_stored = hit.whole
            if hit.length == seq.prompt_len - 1:
                found.append((seq, hit.layers))
            else:
                seq.cache, seq.prefilled = hit.layers, hit.length
        if not found:
            return
        lengths = [seq.prompt_len - 1 for seq, _ in found]
        offsets = [sum(lengths[:i]) for i in range(len(lengths))]
        packed = [
            (
                torch.cat([layers[i][0] for _, layers in found], dim=2),
                torch.cat([layers[i][1] for _, layers in found], dim=2),
            )
            for i in range(len(found[0][1]))
        ]
        self.batch.join_packed([seq.request_id for seq, _ in found], lengths, offsets, packed)
        for seq, _ in found:
            self.scheduler.prefilled(PrefillChunk(seq, seq.prompt_len - 1, seq.prompt_len))

    def _store_prefix(self, seq: Sequence, layers: Layers, owned: bool) -> None:
        """Keep a prefilled prompt's keys and values (copied unless ``owned``: fresh tensors
        that nothing else writes) for the prompts that start like it."""
        if not self.prefixes.capacity or seq.prompt_stored:
            return
        if not owned:
            layers = [(k.clone(), v.clone()) for k, v in layers]
        self.prefixes.store(seq.prompt_ids, layers)

    def _leave_batch(self) -> None:
        if self._leaving:
            self.batch.leave(self._leaving)
            self._leaving.clear()

    def _drop_cancelled(self) -> list[StepOutput]:
        outputs = []
        for request_id in sorted(self._cancelled):
            seq = self.scheduler.find(request_id)
            if seq is not None:
                outputs.append(self._finish(seq, FINISH_CANCELLED, [], ""))
        self._cancelled.clear()
        return outputs

    def _emit(self, seq: Sequence, choice: Choice | Exception) -> StepOutput:
        """Take the sequence's next token (``choice``, `choose_tokens`'s for its row) and say what
        it adds; ends it when it should stop, or with the error its choice met."""
        if isinstance(choice, Exception):
            return self._fail(seq, choice)
        token, logprobs = choice
        try:
            seq.output_ids.append(token)
            lp = [logprobs] if logprobs is not None else None
            if seq.sampler.is_stop_token(token):
                return self._finish(seq, FINISH_STOP, [token], "", lp)
            text = seq.stops.feed(seq.decoder.add(token))
            if seq.stops.stopped:
                return self._finish(seq, FINISH_STOP, [token], text, lp)
            total = seq.prompt_len + len(seq.output_ids)
            if len(seq.output_ids) >= seq.params.max_tokens or total >= self._limits.max_model_len:
                return self._finish(seq, FINISH_LENGTH, [token], text, lp)
        except Exception as exc:
            return self._fail(seq, exc)
        return StepOutput(
            seq.request_id,
            [token],
            text,
            logprobs=lp,
            prompt_tokens=seq.prompt_len,
            completion_tokens=len(seq.output_ids),
        )

    def _finish(
        self,
        seq: Sequence,
        reason: str,
        token_ids: list[int],
        text: str,
        logprobs: list[TokenLogprobs] | None = None,
        error: PredictionException | None = None,
    ) -> StepOutput:
        if reason in (FINISH_STOP, FINISH_LENGTH) and not seq.stops.stopped:
            text += seq.stops.feed(seq.decoder.flush())
            text += seq.stops.flush()
        self.scheduler.remove(seq)
        self._leaving.add(seq.request_id)
        seq.cache = None
        return StepOutput(
            seq.request_id,
            token_ids,
            text,
            True,
            reason,
            logprobs,
            error,
            prompt_tokens=seq.prompt_len,
            completion_tokens=len(seq.output_ids),
        )

    def _fail(self, seq: Sequence, exc: Exception) -> StepOutput:
        code, _, message = report_failure(exc, [seq.request_id], logger)
        error = exc if isinstance(exc, PredictionException) else PredictionException(message, code)
        return self._finish(seq, FINISH_ERROR, [], "", error=error)
