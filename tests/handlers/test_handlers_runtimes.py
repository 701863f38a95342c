"""BaseHandler loading each model format: eager model.py + state dict, .pt fallback, .pt2."""

from __future__ import annotations

import pytest
import torch
from handler_helpers import set_batch, write

from handlers.exceptions import HandlerLoadError

MODEL_PY = """
    import torch
    from torch import nn


    class Doubler(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            return self.linear(x) * 2
    """


class Doubler(torch.nn.Module):
    """Same architecture as MODEL_PY, to produce weights and expected outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * 2


# Tests script models themselves; torch.jit's deprecation notice is not what they check.
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.*deprecated:FutureWarning")

ROWS = [[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]]


@pytest.fixture
def doubler() -> Doubler:
    torch.manual_seed(0)
    return Doubler().eval()


def expected(model: torch.nn.Module) -> list:
    with torch.no_grad():
        return model(torch.tensor(ROWS)).tolist()


def assert_close(actual: list, wanted: list) -> None:
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(wanted))


def run(service, ctx) -> list:
    # JSON bodies arrive decoded: one list of floats per request.
    batch = [{"body": row} for row in ROWS]
    set_batch(ctx, batch)
    return service.predict(batch, ctx)


def test_eager_model_file_with_state_dict(package, tmp_path, doubler):
    weights = tmp_path / "doubler.pth"
    torch.save(doubler.state_dict(), weights)
    service, ctx = package(
        model_name="doubler",
        handler="base_handler",
        serialized_file=weights,
        model_file=write(tmp_path / "model.py", MODEL_PY),
    )
    assert_close(run(service, ctx), expected(doubler))


def test_state_dict_named_pt_falls_back_to_eager(package, tmp_path, doubler):
    weights = tmp_path / "doubler.pt"
    torch.save(doubler.state_dict(), weights)
    service, ctx = package(
        model_name="doubler_pt",
        handler="base_handler",
        serialized_file=weights,
        model_file=write(tmp_path / "model.py", MODEL_PY),
    )
    assert_close(run(service, ctx), expected(doubler))


def test_non_torchscript_pt_without_model_file_is_a_clear_error(package, tmp_path, doubler):
    weights = tmp_path / "doubler.pt"
    torch.save(doubler.state_dict(), weights)
    with pytest.raises(HandlerLoadError, match="not a TorchScript archive"):
        package(model_name="broken", handler="base_handler", serialized_file=weights)


def test_torch_export_pt2(package, tmp_path, doubler):
    program = torch.export.export(
        doubler,
        (torch.randn(2, 3),),
        dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}},
    )
    path = tmp_path / "doubler.pt2"
    torch.export.save(program, str(path))
    service, ctx = package(model_name="doubler_pt2", handler="base_handler", serialized_file=path)
    assert_close(run(service, ctx), expected(doubler))
    batch = [{"body": ROWS[0]}] * 3  # another batch size through the dynamic dimension
    set_batch(ctx, batch)
    assert len(service.predict(batch, ctx)) == 3


def test_torchscript_on_cpu_with_thread_cap(package, tmp_path, doubler):
    path = tmp_path / "doubler_ts.pt"
    torch.jit.script(doubler).save(str(path))
    before = torch.get_num_threads()
    try:
        service, ctx = package(
            model_name="doubler_ts", handler="base_handler", serialized_file=path, num_threads=1
        )
        assert torch.get_num_threads() == 1
        assert service.handler.device == torch.device("cpu")
        assert ctx.system_properties["num_threads"] == 1
        assert_close(run(service, ctx), expected(doubler))
    finally:
        torch.set_num_threads(before)


def test_model_file_with_two_modules_is_rejected(package, tmp_path):
    two = (
        MODEL_PY
        + """

    class Other(nn.Module):
        def forward(self, x):
            return x
    """
    )
    with pytest.raises(HandlerLoadError, match="exactly one torch.nn.Module"):
        package(
            model_name="two_modules",
            handler="base_handler",
            model_file=write(tmp_path / "model.py", two),
        )
