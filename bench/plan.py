"""What a benchmark run measures: the scenarios of each mode (full, ``--quick``, ``--smoke``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.models import Variant

SERVERS = ("hypercorn", "uvicorn")
MODELS = ("tiny", "resnet18", "efficientnet")
BATCH = 8
DELAY_MS = 5
DEMO_DELAY_MS = 100  # a long max_batch_delay, to show a lone request does not wait for it


@dataclass(frozen=True)
class Raw:
    """The handler in a loop: ``processes`` × ``threads``, batches of ``batch``."""

    model: str
    processes: int
    threads: int
    batch: int

    @property
    def key(self) -> str:
        return f"raw:{self.model}:p{self.processes}t{self.threads}:b{self.batch}"


@dataclass(frozen=True)
class Ceiling:
    """The bare ASGI app on ``server`` at ``concurrency``."""

    server: str
    concurrency: int

    @property
    def key(self) -> str:
        return f"ceiling:{self.server}:c{self.concurrency}"


@dataclass(frozen=True)
class Served:
    """Lantern on ``server`` serving ``variant`` at ``concurrency``."""

    server: str
    variant: Variant
    concurrency: int

    @property
    def key(self) -> str:
        return f"served:{self.server}:{self.variant.name}:c{self.concurrency}"


@dataclass
class Plan:
    """Every scenario of one run, and how long and how often each is measured."""

    raw: list[Raw] = field(default_factory=list)
    ceilings: list[Ceiling] = field(default_factory=list)
    served: list[Served] = field(default_factory=list)
    duration: float = 5.0
    repeats: int = 3
    warmup: float = 1.0
    raw_in_every_group: bool = True  # False: only in the first server's group (short modes)
    slow_factor: float = 2.0  # image models complete few batches a second: longer windows

    def groups(self) -> list[tuple[str, str | None, list[Served], list[Ceiling]]]:
        """``(server, model, served, ceilings)``: one Lantern process per server and model. The
        server's ceilings join its first group (the tiny model's, when there is one), so their
        repeats interleave with the served runs they are compared with."""
        out: list[tuple[str, str | None, list[Served], list[Ceiling]]] = []
        servers = [s.server for s in self.served] + [c.server for c in self.ceilings]
        for server in dict.fromkeys(servers):
            ceilings = [c for c in self.ceilings if c.server == server]
            models = [s.variant.model for s in self.served if s.server == server]
            if not models:
                out.append((server, None, [], ceilings))
            for i, model in enumerate(dict.fromkeys(models)):
                runs = [s for s in self.served if s.server == server and s.variant.model == model]
                out.append((server, model, runs, ceilings if i == 0 else []))
        return out


def _w(model: str, workers: int, batch: int = 1, delay: int = 0, cores: int = 2) -> Variant:
    return Variant(model, workers, max(1, cores // workers), batch, delay if batch > 1 else 0)


def build_plan(mode: str, models: list[str], servers: list[str], cores: int = 2) -> Plan:
    """The scenarios for ``mode`` (``full``, ``quick`` or ``smoke``) over the chosen models."""
    plan = Plan()
    if mode == "smoke":
        plan.duration, plan.repeats, plan.warmup = 1.0, 1, 0.5
        plan.raw_in_every_group, plan.slow_factor = False, 1.0
        plan.raw = [Raw("tiny", 1, 1, 1)]
        for server in servers:
            plan.ceilings.append(Ceiling(server, 8))
            plan.served.append(Served(server, Variant("tiny", 1, 1, BATCH, DELAY_MS), 8))
        return plan
    quick = mode == "quick"
    if quick:
        plan.duration, plan.repeats, plan.warmup = 3.0, 1, 1.0
        plan.raw_in_every_group, plan.slow_factor = False, 1.0
    half = max(1, cores // 2)
    for model in models:
        if model == "tiny":
            configs = [(2, half)] if quick else [(1, cores), (2, half)]
            for procs, threads in configs:
                for batch in (1, BATCH):
                    plan.raw.append(Raw(model, procs, threads, batch))
        else:
            batches = (BATCH,) if quick else (1, BATCH)
            plan.raw += [Raw(model, 2, half, batch) for batch in batches]
    for server in servers:
        for c in (32,) if quick else (1, 8, 32):
            plan.ceilings.append(Ceiling(server, c))
        for model in models:
            plan.served += _served(server, model, quick, cores)
    return plan


def _served(server: str, model: str, quick: bool, cores: int) -> list[Served]:
    if model == "tiny":
        runs = []
        workers = (2,) if quick else (1, 2)
        levels = (1, 32) if quick else (1, 8, 32)
        for w in workers:
            for batch in (1, BATCH):
                variant = _w(model, w, batch, DELAY_MS, cores)
                runs += [Served(server, variant, c) for c in levels]
        # Batching on with a long delay, at c=1: the latency must not include the delay.
        runs.append(Served(server, _w(model, 2, BATCH, DEMO_DELAY_MS, cores), 1))
        return runs
    if model == "resnet18":
        unbatched, batched = _w(model, 2, 1, cores=cores), _w(model, 2, BATCH, DELAY_MS, cores)
        return [
            Served(server, unbatched, 8),
            Served(server, batched, 8),
            Served(server, batched, 16),
        ]
    # the pretrained classifier: batching off and on, both workers busy
    if quick:
        return [Served(server, _w(model, 2, BATCH, DELAY_MS, cores), 16)]
    return [
        Served(server, _w(model, 2, 1, cores=cores), 8),
        Served(server, _w(model, 2, BATCH, DELAY_MS, cores), 16),
    ]
