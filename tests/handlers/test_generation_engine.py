"""The engine on a tiny random model: greedy equals ``generate``, alone and beside others; joins,
chunked prefill, cancellation, the KV budget, sampling controls and per-request failures."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import replace

import pytest
import torch

from handlers.exceptions import PredictionException
from handlers.generation.engine import Engine, StepOutput
from handlers.generation.params import GenerationRequest, SamplingParams
from handlers.generation.scheduler import EngineLimits
from tests.support.generation_fixtures import build_model, build_tokenizer

PROMPTS = [
    "the quick brown fox",
    "a model server answers requests with tokens as they come and the batch",
    "héllo",
    "stop strings end a stream; penalties change what",
]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request, tokenizer):
    return build_model(len(tokenizer), tokenizer.eos_token_id, request.param)


def make_engine(model, tokenizer, running=8, cached=4096, chunk=16) -> Engine:
    return Engine(model, tokenizer, EngineLimits(running, cached, 256, chunk))


def reference(model, tokenizer, prompt: str, n: int) -> list[int]:
    ids = torch.tensor([tokenizer.encode(prompt)])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
    )
    return out[0, ids.shape[1] :].tolist()


def drain(engine: Engine) -> dict[str, list[StepOutput]]:
    seen: dict[str, list[StepOutput]] = defaultdict(list)
    while engine.has_work():
        for out in engine.step():
            seen[out.request_id].append(out)
    return seen


def tokens(outs: list[StepOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def test_greedy_alone_equals_generate(model, tokenizer):
    engine = make_engine(model, tokenizer, chunk=256)
    engine.add("a", GenerationRequest(PROMPTS[1], GREEDY))
    outs = drain(engine)["a"]
    assert tokens(outs) == reference(model, tokenizer, PROMPTS[1], 24)
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert all(len(o.token_ids) == 1 for o in outs)  # one token per step, as it comes


def test_greedy_beside_others_with_late_joins_equals_generate(model, tokenizer):
    engine = make_engine(model, tokenizer, chunk=8)  # prompts over 8 tokens prefill in chunks
    lengths = [24, 9, 17, 24]
    engine.add("0", GenerationRequest(PROMPTS[0], GREEDY))
    seen: dict[str, list[StepOutput]] = defaultdict(list)
    batch_sizes = []
    for step in range(200):
        if step in (3, 6, 10):  # later requests join a running batch
            i = {3: 1, 6: 2, 10: 3}[step]
            params = SamplingParams(max_tokens=lengths[i], temperature=0.0, ignore_eos=True)
            engine.add(str(i), GenerationRequest(PROMPTS[i], params))
        for out in engine.step():
            seen[out.request_id].append(out)
        batch_sizes.append(engine.last_step["decoded"])
        if not engine.has_work() and step > 10:
            break
    assert max(batch_sizes) == 4  # all four decoded in one forward at some step
    for i, prompt in enumerate(PROMPTS):
        assert tokens(seen[str(i)]) == reference(model, tokenizer, prompt, lengths[i]), i
    assert engine.stats() == {
        "waiting": 0,
        "prefilling": 0,
        "running": 0,
        "reserved_tokens": 0,
        "cached_tokens": 0,
        "steps": engine.steps,
        "prefix_cache_tokens": 0,  # off in these engines
        "prefix_queried_tokens": 0,
        "prefix_hit_tokens": 0,
        "shared_prompt_tokens": 0,  # four different prompts
    }


def test_prompts_arriving_together_prefill_in_one_batch_and_equal_generate(model, tokenizer):
    engine = make_engine(model, tokenizer, chunk=256)
    for i, prompt in enumerate(PROMPTS):
        engine.add(str(i), GenerationRequest(prompt, GREEDY))
    first = {o.request_id: o for o in engine.step()}
    assert sorted(first) == ["0", "1", "2", "3"]  # all four prefilled in the first step
    assert engine.stats()["running"] == 4
    seen = drain(engine)
    for i, prompt in enumerate(PROMPTS):
        assert first[str(i)].token_ids + tokens(seen[str(i)]) == reference(
            model, tokenizer, prompt, 24
        )


def test_text_streams_and_matches_the_decoded_tokens(model, tokenizer):
    engine = make_engine(model, tokenizer)
    engine.add("a", GenerationRequest(PROMPTS[2], GREEDY))
    outs = drain(engine)["a"]
    assert "".join(o.text for o in outs) == tokenizer.decode(tokens(outs), skip_special_tokens=True)


def test_a_long_prompt_is_prefilled_in_bounded_chunks_while_others_decode(model, tokenizer):
    engine = make_engine(model, tokenizer, chunk=8)
    engine.add(
        "short",
        GenerationRequest("the", SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)),
    )
    engine.step()
    long_prompt = " ".join(PROMPTS * 3)
    n = len(tokenizer.encode(long_prompt))
    assert n > 40
    engine.add(
        "long", GenerationRequest(long_prompt, SamplingParams(max_tokens=2, temperature=0.0))
    )
    steps_until_first = 0
    while True:
        outs = {o.request_id: o for o in engine.step()}
        steps_until_first += 1
        assert engine.last_step["prefill_tokens"] <= 8
        assert "short" in outs  # the running stream got a token at every step
        if "long" in outs:
            break
    assert steps_until_first == -(-n // 8)


def test_cancel_frees_the_slot_at_the_next_step(model, tokenizer):
    engine = make_engine(model, tokenizer, running=1, chunk=256)
    engine.add("a", GenerationRequest(PROMPTS[0], GREEDY))
    engine.add("b", GenerationRequest(PROMPTS[1], GREEDY))
    engine.step()
    assert engine.stats()["running"] == 1 and engine.stats()["waiting"] == 1
    assert engine.cancel("a") and not engine.cancel("nope")
    outs = {o.request_id: o for o in engine.step()}
    assert outs["a"].finished and outs["a"].finish_reason == "cancelled"
    assert "b" in outs  # admitted and prefilled in the same step
    assert tokens(drain(engine)["b"]) == reference(model, tokenizer, PROMPTS[1], 24)[1:]


def test_the_kv_budget_makes_later_requests_wait(model, tokenizer):
    prompt_len = len(tokenizer.encode(PROMPTS[0]))
    engine = make_engine(model, tokenizer, cached=2 * (prompt_len + 24) + 3)
    for key in "abc":
        engine.add(key, GenerationRequest(PROMPTS[0], GREEDY))
    first = engine.step()
    stats = engine.stats()
    assert stats["running"] + stats["prefilling"] == 2 and stats["waiting"] == 1
    assert stats["reserved_tokens"] == 2 * (prompt_len + 24)
    seen = drain(engine)
    for out in first:
        seen[out.request_id].insert(0, out)
    assert tokens(seen["a"]) == tokens(seen["b"])
    assert len(tokens(seen["c"])) == 24


@pytest.mark.parametrize(
    ("prompt", "params", "code", "message"),
    [
        ("x " * 300, GREEDY, 400, "this model takes at most 255"),
        ("the fox", SamplingParams(max_tokens=200), 507, "KV-cache budget is 100"),
    ],
)
def test_requests_that_can_never_fit_fail_alone(model, tokenizer, prompt, params, code, message):
    engine = make_engine(model, tokenizer, cached=100)
    engine.add("ok", GenerationRequest(PROMPTS[0], SamplingParams(max_tokens=4, temperature=0)))
    with pytest.raises(PredictionException) as caught:
        engine.add("bad", GenerationRequest(prompt, params))
    assert caught.value.error_code == code and message in caught.value.message
    assert len(tokens(drain(engine)["ok"])) == 4


def test_a_tokenizer_that_raises_fails_that_request_only(model, tokenizer, monkeypatch):
    engine = make_engine(model, tokenizer)
    engine.add("ok", GenerationRequest(PROMPTS[0], GREEDY))
    engine.step()

    def broken(text):
        raise ValueError("cannot tokenize")

    monkeypatch.setattr(engine.tokenizer, "encode", broken)
    with pytest.raises(PredictionException) as caught:
        engine.add("bad", GenerationRequest("boom", GREEDY))
    monkeypatch.undo()
    assert caught.value.error_code == 400 and "ValueError: cannot tokenize" in caught.value.message
    assert len(tokens(drain(engine)["ok"])) == 23
    with pytest.raises(PredictionException, match="already being generated"):
        engine.add("x", GenerationRequest("a", GREEDY))
        engine.add("x", GenerationRequest("a", GREEDY))


def test_a_failing_forward_ends_those_streams_and_the_engine_keeps_serving(
    model, tokenizer, monkeypatch
):
    engine = make_engine(model, tokenizer)
    engine.add("a", GenerationRequest(PROMPTS[0], GREEDY))
    engine.step()
    real = engine._forward
    monkeypatch.setattr(engine, "_forward", lambda *a: (_ for _ in ()).throw(MemoryError("oom")))
    outs = engine.step()
    assert [(o.request_id, o.finish_reason, o.error and o.error.error_code) for o in outs] == [
        ("a", "error", 507)
    ]
    monkeypatch.setattr(engine, "_forward", real)
    engine.add("b", GenerationRequest(PROMPTS[0], GREEDY))
    assert tokens(drain(engine)["b"]) == reference(model, tokenizer, PROMPTS[0], 24)


def test_same_seed_same_tokens_whatever_runs_beside(model, tokenizer):
    params = SamplingParams(
        max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True
    )
    alone = make_engine(model, tokenizer)
    alone.add("s", GenerationRequest(PROMPTS[0], params))
    busy = make_engine(model, tokenizer)
    busy.add("other", GenerationRequest(PROMPTS[1], SamplingParams(max_tokens=30, seed=1)))
    busy.step()
    busy.add("s", GenerationRequest(PROMPTS[0], params))
    first, second = tokens(drain(alone)["s"]), tokens(drain(busy)["s"])
    assert first == second
    other = make_engine(model, tokenizer)
    other.add("s", GenerationRequest(PROMPTS[0], SamplingParams(**{**params.__dict__, "seed": 8})))
    assert tokens(drain(other)["s"]) != first


def test_stop_token_ids_min_tokens_and_eos(model, tokenizer, caplog):
    ref = reference(model, tokenizer, PROMPTS[0], 24)
    stop_id = ref[5]
    first = ref.index(stop_id)
    engine = make_engine(model, tokenizer)
    engine.add(
        "stop",
        GenerationRequest(
            PROMPTS[0],
            SamplingParams(max_tokens=24, temperature=0, stop_token_ids=frozenset({stop_id})),
        ),
    )
    engine.add(
        "min",
        GenerationRequest(
            PROMPTS[0],
            SamplingParams(
                max_tokens=24,
                temperature=0,
                stop_token_ids=frozenset({stop_id}),
                min_tokens=first + 2,
            ),
        ),
    )
    seen = drain(engine)
    assert tokens(seen["stop"]) == ref[: first + 1]
    assert seen["stop"][-1].finish_reason == "stop"
    assert stop_id not in tokens(seen["min"])[: first + 2]  # banned until min_tokens
    assert len(tokens(seen["min"])) >= first + 2
    # the banned rows were chosen with the step's one argmax, not one by one after it failed
    # (it once wrote -inf into the forward's inference-mode logits, outside inference mode)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_stop_strings_cut_the_text_before_them(model, tokenizer):
    engine = make_engine(model, tokenizer)
    engine.add("ref", GenerationRequest(PROMPTS[3], GREEDY))
    text = "".join(o.text for o in drain(engine)["ref"])
    stop = text[6:9]
    assert stop and text.find(stop) == 6
    engine.add(
        "cut",
        GenerationRequest(
            PROMPTS[3], SamplingParams(max_tokens=24, temperature=0, stop=(stop, "never"))
        ),
    )
    outs = drain(engine)["cut"]
    assert "".join(o.text for o in outs) == text[:6]
    assert outs[-1].finish_reason == "stop"


def test_penalties_change_greedy_output_and_logprobs_are_reported(model, tokenizer):
    engine = make_engine(model, tokenizer)
    engine.add(
        "plain",
        GenerationRequest(
            PROMPTS[0], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2)
        ),
    )
    engine.add(
        "pen",
        GenerationRequest(
            PROMPTS[0],
            SamplingParams(
                max_tokens=24,
                temperature=0,
                ignore_eos=True,
                frequency_penalty=2.0,
                repetition_penalty=1.5,
            ),
        ),
    )
    seen = drain(engine)
    plain, pen = tokens(seen["plain"]), tokens(seen["pen"])
    assert plain != pen
    assert len(set(pen)) >= len(set(plain))
    lps = [lp for o in seen["plain"] for lp in o.logprobs or []]
    assert [lp.token_id for lp in lps] == plain
    for lp in lps:  # greedy: the chosen token is the most likely one
        assert len(lp.top) == 2 and lp.top[0][0] == lp.token_id and lp.logprob <= 0
    assert seen["pen"][0].logprobs is None


@pytest.mark.parametrize("chunk", [256, 8])  # stored from the step's packed keys / its own cache
def test_a_repeated_prompt_joins_the_batch_at_once_and_equals_generate(model, tokenizer, chunk):
    engine = Engine(model, tokenizer, EngineLimits(8, 4096, 256, chunk, prefix_cache_tokens=512))
    prompt_len = len(tokenizer.encode(PROMPTS[1]))
    assert prompt_len > 16  # a block and more
    expected = reference(model, tokenizer, PROMPTS[1], 24)
    engine.add("first", GenerationRequest(PROMPTS[1], GREEDY))
    early = engine.step()  # its prompt (or first chunk) runs; nothing stored yet
    engine.add("beside", GenerationRequest(PROMPTS[0], GREEDY))
    first = drain(engine)
    assert engine.stats()["prefix_cache_tokens"] >= prompt_len
    engine.add("again", GenerationRequest(PROMPTS[1], GREEDY))
    again = engine.step()  # its last token decodes as a row of the batch: no prefill at all
    assert engine.last_step == {"decoded": 1, "prefill_tokens": 0}
    again += drain(engine)["again"]
    assert tokens(early + first["first"]) == tokens(again) == expected
    assert tokens(first["beside"]) == reference(model, tokenizer, PROMPTS[0], 24)
    stats = engine.stats()
    assert stats["prefix_hit_tokens"] == prompt_len - 1
    assert stats["prefix_queried_tokens"] == 2 * prompt_len + len(tokenizer.encode(PROMPTS[0]))


def test_a_continuation_reuses_the_stored_prompt_while_it_still_runs(model, tokenizer):
    limits = EngineLimits(8, 4096, 256, 8, prefix_cache_tokens=512)
    engine = Engine(model, tokenizer, limits)
    turn = PROMPTS[1] + " and the batch"  # the next chat turn starts with the first one
    engine.add("first", GenerationRequest(PROMPTS[1], GREEDY))
    early = []
    while engine.stats()["running"] < 1:
        early += engine.step()
    engine.add("next", GenerationRequest(turn, GREEDY))  # the first one is decoding beside it
    early += engine.step()
    new_tokens = len(tokenizer.encode(turn)) - len(tokenizer.encode(PROMPTS[1]))
    assert engine.last_step["prefill_tokens"] == min(new_tokens, 8)
    seen = drain(engine)
    for out in reversed(early):
        seen[out.request_id].insert(0, out)
    assert tokens(seen["next"]) == reference(model, tokenizer, turn, 24)
    assert tokens(seen["first"]) == reference(model, tokenizer, PROMPTS[1], 24)


def test_without_a_prefix_cache_every_prompt_is_prefilled_whole(model, tokenizer):
    engine = make_engine(model, tokenizer, chunk=256)  # prefix_cache_tokens defaults to 0
    for name in ("a", "b"):
        engine.add(name, GenerationRequest(PROMPTS[1], GREEDY))
        engine.step()
        assert engine.last_step["prefill_tokens"] == len(tokenizer.encode(PROMPTS[1]))
        drain(engine)
    assert engine.stats()["prefix_hit_tokens"] == engine.stats()["prefix_cache_tokens"] == 0


def test_repeated_prompts_of_different_lengths_join_a_running_batch_together(model, tokenizer):
    engine = Engine(model, tokenizer, EngineLimits(8, 4096, 256, 256, prefix_cache_tokens=512))
    for i, prompt in enumerate(PROMPTS):
        engine.add(f"first{i}", GenerationRequest(prompt, GREEDY))
    drain(engine)
    engine.add("running", GenerationRequest("the batch", GREEDY))
    seen: dict[str, list[StepOutput]] = defaultdict(list)
    for out in engine.step() + engine.step():
        seen[out.request_id].append(out)
    for i, prompt in enumerate(PROMPTS):  # all four found whole: one packed join, no prefill
        engine.add(str(i), GenerationRequest(prompt, GREEDY))
    for out in engine.step():
        seen[out.request_id].append(out)
    assert engine.last_step == {"decoded": 5, "prefill_tokens": 0}
    for key, outs in drain(engine).items():
        seen[key] += outs
    for i, prompt in enumerate(PROMPTS):
        assert tokens(seen[str(i)]) == reference(model, tokenizer, prompt, 24), prompt
    assert tokens(seen["running"]) == reference(model, tokenizer, "the batch", 24)


def run_counting(engine: Engine) -> tuple[dict[str, list[StepOutput]], dict[str, int], int]:
    """Drain the engine: each request's outputs, the step of its first one, tokens prefilled."""
    seen: dict[str, list[StepOutput]] = defaultdict(list)
    first_step: dict[str, int] = {}
    prefilled = 0
    while engine.has_work():
        for out in engine.step():
            seen[out.request_id].append(out)
            first_step.setdefault(out.request_id, engine.steps)
        prefilled += engine.last_step["prefill_tokens"]
    return seen, first_step, prefilled


@pytest.mark.parametrize("prefix_cache", [0, 512])  # sharing needs no prefix cache
@pytest.mark.parametrize("chunk", [256, 8])  # the first joins from the step's keys / its own cache
def test_equal_prompts_admitted_together_are_prefilled_once_and_equal_generate(
    model, tokenizer, chunk, prefix_cache
):
    limits = EngineLimits(8, 4096, 256, chunk, prefix_cache_tokens=prefix_cache)
    engine = Engine(model, tokenizer, limits)
    shared, other = len(tokenizer.encode(PROMPTS[1])), len(tokenizer.encode(PROMPTS[0]))
    assert shared > 2 * 8  # over several chunks of 8
    for key in "abc":
        engine.add(key, GenerationRequest(PROMPTS[1], GREEDY))
    engine.add("other", GenerationRequest(PROMPTS[0], GREEDY))
    seen, first_step, prefilled = run_counting(engine)
    assert prefilled == shared + other  # each prompt once
    assert first_step["a"] == first_step["b"] == first_step["c"]  # the riders joined with a
    expected = reference(model, tokenizer, PROMPTS[1], 24)
    for key in "abc":
        assert tokens(seen[key]) == expected, key
        assert seen[key][-1].prompt_tokens == shared
    assert tokens(seen["other"]) == reference(model, tokenizer, PROMPTS[0], 24)
    assert engine.stats()["shared_prompt_tokens"] == 2 * shared
    assert engine.stats()["running"] == engine.stats()["reserved_tokens"] == 0


def test_riders_choose_their_own_tokens_from_the_shared_logits(model, tokenizer):
    def sampled(seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=12, temperature=1.0, seed=seed, ignore_eos=True)

    alone = {}
    for seed in (3, 4):
        engine = make_engine(model, tokenizer)
        engine.add("s", GenerationRequest(PROMPTS[1], sampled(seed)))
        alone[seed] = tokens(drain(engine)["s"])
    engine = make_engine(model, tokenizer, chunk=256)
    engine.add("greedy", GenerationRequest(PROMPTS[1], GREEDY))
    for seed in (3, 4):
        engine.add(f"seed{seed}", GenerationRequest(PROMPTS[1], sampled(seed)))
    seen, first_step, prefilled = run_counting(engine)
    assert prefilled == len(tokenizer.encode(PROMPTS[1])) and len(set(first_step.values())) == 1
    assert tokens(seen["greedy"]) == reference(model, tokenizer, PROMPTS[1], 24)
    assert tokens(seen["seed3"]) == alone[3] and tokens(seen["seed4"]) == alone[4]
    assert alone[3] != alone[4]


def test_a_rider_prefills_on_its_own_when_its_first_is_cancelled_half_way(model, tokenizer):
    engine = make_engine(model, tokenizer, chunk=8)
    engine.add("first", GenerationRequest(PROMPTS[1], GREEDY))
    engine.add("rider", GenerationRequest(PROMPTS[1], GREEDY))
    assert engine.step() == [] and engine.last_step["prefill_tokens"] == 8
    engine.cancel("first")
    seen, _, prefilled = run_counting(engine)
    assert [o.finish_reason for o in seen["first"]] == ["cancelled"]
    assert prefilled == len(tokenizer.encode(PROMPTS[1]))  # the rider's prompt, from its start
    assert tokens(seen["rider"]) == reference(model, tokenizer, PROMPTS[1], 24)
    assert engine.stats()["shared_prompt_tokens"] == 0


def test_a_rider_outlives_a_forward_that_failed_its_first(model, tokenizer, monkeypatch):
    engine = make_engine(model, tokenizer, chunk=256)
    engine.add("first", GenerationRequest(PROMPTS[1], GREEDY))
    engine.add("rider", GenerationRequest(PROMPTS[1], GREEDY))
    real = engine._forward
    monkeypatch.setattr(engine, "_forward", lambda *a: (_ for _ in ()).throw(MemoryError("oom")))
    outs = engine.step()
    assert [(o.request_id, o.error and o.error.error_code) for o in outs] == [("first", 507)]
    monkeypatch.setattr(engine, "_forward", real)
    seen, _, prefilled = run_counting(engine)
    assert prefilled == len(tokenizer.encode(PROMPTS[1]))  # prefilled again, for itself
    assert tokens(seen["rider"]) == reference(model, tokenizer, PROMPTS[1], 24)


def test_a_step_reads_from_the_device_once(model, tokenizer, monkeypatch):
    """Every way a tensor's values reach Python (``item``, ``tolist``, ``cpu``, ``numpy``,
    ``int()``/``float()``/``bool()`` of a tensor) is counted inside each step: steps of greedy
    and sampled rows joining, leaving and prefilling in chunks make at most one (the chosen
    tokens). On a GPU each of those is a wait on the device."""
    engine = make_engine(model, tokenizer, chunk=8)
    reads = 0

    def counted(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            nonlocal reads
            reads += 1
            return real(self, *args, **kwargs)

        return read

    for i, prompt in enumerate(PROMPTS):  # greedy and sampled rows, some with top-k / top-p
        params = SamplingParams(max_tokens=6 + 3 * i, temperature=0.0, ignore_eos=True)
        if i % 2:
            params = replace(params, temperature=0.8, top_k=5 * i, top_p=0.9, seed=i)
        engine.add(str(i), GenerationRequest(prompt, params))
    per_step = []
    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__"):
            patch.setattr(torch.Tensor, name, counted(name))
        while engine.has_work():
            reads = 0
            engine.step()
            per_step.append(reads)
            if len(per_step) == 3:  # a late joiner, prefilled beside the running rows
                engine.add("late", GenerationRequest(PROMPTS[1], GREEDY))
    assert len(per_step) > 10
    assert max(per_step) <= 1, per_step


def test_a_captured_decode_step_as_a_graph_holds_it_equals_the_eager_step(model, tokenizer):
    """What a CUDA graph replays (`DecodeGraphs.forward`: rows padded to a captured size,
    attention over every allocated column under a mask built from the positions) gives the
    eager step's logits, on the CPU; and the sequences go on to ``generate``'s tokens after it
    (the padding rows' writes touched no sequence's cache)."""
    from handlers.generation.graphs import DecodeGraphs
    from handlers.generation.ragged import StepPlan

    engine = make_engine(model, tokenizer, chunk=256)
    for i in range(3):
        engine.add(str(i), GenerationRequest(PROMPTS[i], GREEDY))
    seen: dict[str, list[StepOutput]] = defaultdict(list)
    for _ in range(3):  # all three prefilled and decoding, rows of different lengths
        for out in engine.step():
            seen[out.request_id].append(out)
    batch = engine.batch
    assert len(batch) == 3 and len(set(batch.lengths)) == 3
    graphs = DecodeGraphs(model, torch.device("cpu"), 8)
    by_id = {seq.request_id: seq for seq in engine.scheduler.running}
    ids = [by_id[key].last_token for key in batch.keys]
    with torch.inference_mode():
        batch.begin_step()
        size = graphs.size_for(len(ids), batch)
        assert size == 4 and batch.layers[0][0].shape[2] > max(batch.lengths) + 1
        graphs.stage(batch, ids, size)
        replayed = graphs.forward(batch, size)[:3].float()
        plan = StepPlan(3, batch, [], batch.step_mask(batch.write_positions))
        positions = torch.tensor(batch.lengths)
        eager = engine._forward(torch.tensor([ids]), positions[None], torch.arange(3), plan)
    assert torch.allclose(replayed, eager.float(), atol=1e-4)
    for key, outs in drain(engine).items():
        seen[key].extend(outs)
    for i in range(3):
        assert tokens(seen[str(i)]) == reference(model, tokenizer, PROMPTS[i], 24)


def test_decode_steps_through_graphs_captured_at_warm_up_equal_generate(model, tokenizer):
    """The engine with graphs as on a GPU, the graph's recording stood in for by the eager
    forward into a fixed output (a CPU has no CUDA graphs): `warm_up` reserves the cache and
    captures every size; sequences joining late, prefilled in chunks beside replayed decode
    steps, leaving at different steps, give ``generate``'s tokens; the cache never moved."""
    from handlers.generation.cache import BatchCache
    from handlers.generation.graphs import DecodeGraphs, Recorded

    class EagerGraphs(DecodeGraphs):
        def record(self, batch, size):
            expected = self.forward(batch, size).clone()
            out = expected.clone()

            def replay() -> None:
                out.copy_(self.forward(batch, size))

            return expected, Recorded(replay, out)

    engine = make_engine(model, tokenizer, running=6, chunk=8)
    engine.graphs = EagerGraphs(model, torch.device("cpu"), 6)
    engine.batch = BatchCache(keep_memory=True)
    with torch.inference_mode():
        engine.warm_up()
    cache = engine.batch.layers[0][0]
    assert engine.graphs.sizes == [1, 2, 4, 8] and engine.graphs.captures == 4
    assert cache.shape[0] == 8 and len(engine.batch) == 0
    lengths = [24, 9, 17, 24]
    seen: dict[str, list[StepOutput]] = defaultdict(list)
    for step in range(200):
        if step < len(PROMPTS):  # one more joins each step
            params = SamplingParams(max_tokens=lengths[step], temperature=0.0, ignore_eos=True)
            engine.add(str(step), GenerationRequest(PROMPTS[step], params))
        for out in engine.step():
            seen[out.request_id].append(out)
        if not engine.has_work():
            break
    for i, prompt in enumerate(PROMPTS):
        assert tokens(seen[str(i)]) == reference(model, tokenizer, prompt, lengths[i])
    assert engine.graphs.hits > 10 and engine.graphs.enabled
    assert engine.batch.layers[0][0] is cache and engine.stats()["cuda_graph_hits"] > 10


def test_a_graph_that_differs_from_the_eager_step_turns_graphs_off(model, tokenizer, caplog):
    from handlers.generation.cache import BatchCache
    from handlers.generation.graphs import DecodeGraphs, Recorded

    class WrongGraphs(DecodeGraphs):
        def record(self, batch, size):
            expected = self.forward(batch, size).clone()
            return expected, Recorded(lambda: None, expected + 1.0)

    engine = make_engine(model, tokenizer, chunk=256)
    engine.graphs = WrongGraphs(model, torch.device("cpu"), 8)
    engine.batch = BatchCache(keep_memory=True)
    engine.add("a", GenerationRequest(PROMPTS[1], GREEDY))
    with caplog.at_level(logging.WARNING):
        outs = drain(engine)["a"]
    assert tokens(outs) == reference(model, tokenizer, PROMPTS[1], 24)  # eager, after the check
    assert not engine.graphs.enabled and "CUDA graphs off" in caplog.text
