"""Chat ``messages`` in a generation request: checked, then rendered into the prompt."""

from __future__ import annotations

import pytest

from handlers.exceptions import PredictionException
from handlers.generation.params import parse_request


def render(messages: list[dict[str, str]]) -> str:
    return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"


def test_messages_become_the_prompt_through_the_renderer() -> None:
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    request = parse_request({**body, "max_tokens": 3}, 64, 320, render)
    assert request.prompt == "system:s|user:u|assistant:"
    assert request.params.max_tokens == 3


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 3}]}, "content"),
        ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "role"),
        ({"messages": [{"role": "user", "content": "x"}], "prompt": "p"}, "not both"),
    ],
)
def test_bad_messages_are_400(body: dict, fragment: str) -> None:
    with pytest.raises(PredictionException) as err:
        parse_request(body, 64, 320, render)
    assert err.value.error_code == 400 and fragment in err.value.message


def test_messages_without_a_renderer_are_400() -> None:
    with pytest.raises(PredictionException, match="takes a prompt"):
        parse_request({"messages": [{"role": "user", "content": "x"}]}, 64, 320)


def test_the_handler_renders_with_the_chat_template_or_refuses() -> None:
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from handlers.text_generation import TextGenerationHandler
    from tests.support.generation_fixtures import build_tokenizer

    handler = TextGenerationHandler()
    tokenizer = build_tokenizer()
    handler.engine = SimpleNamespace(tokenizer=tokenizer)  # type: ignore[assignment]
    with pytest.raises(PredictionException, match="no chat template"):
        handler._chat_prompt([{"role": "user", "content": "hi"}])
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    )
    assert handler._chat_prompt([{"role": "user", "content": "hi"}]) == "[user]hi"
