"""Where Open Inference Protocol JSON decoding should run: inline or on the decode thread.

``python -m bench.decode`` times `serve.wire.oip.parse_request` inline and through
`serve.core.offload`'s thread for bodies of growing size, and the event loop's longest pause
while two large BYTES bodies are decoded on the thread. `serve.core.offload.INLINE_MAX` is set
from this.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time

from serve.wire import oip


def body(count: int, datatype: str = "FP32") -> bytes:
    data: list[object] = ["abcd"] * count if datatype == "BYTES" else [1.5] * count
    tensor = {"name": "x", "datatype": datatype, "shape": [count], "data": data}
    return json.dumps({"inputs": [tensor]}).encode()


async def hop_vs_inline() -> None:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    print(f"{'body':>10} {'inline us':>10} {'thread us':>10}")
    for count in (4, 64, 512, 2048, 8192, 65536):
        data = body(count)
        rounds = max(5, 20_000 // count)
        started = time.perf_counter()
        for _ in range(rounds):
            oip.parse_request(data, None)
        inline = (time.perf_counter() - started) / rounds
        started = time.perf_counter()
        for _ in range(rounds):
            await loop.run_in_executor(pool, oip.parse_request, data, None)
        thread = (time.perf_counter() - started) / rounds
        print(f"{len(data):>10} {inline * 1e6:>10.0f} {thread * 1e6:>10.0f}")


async def loop_pause() -> None:
    from serve.core.offload import run_sized

    data = body(700_000, "BYTES")
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    started = time.perf_counter()
    await asyncio.gather(*(run_sized(len(data), oip.parse_request, data, None) for _ in range(2)))
    elapsed = time.perf_counter() - started
    done.set()
    await ticker
    print(
        f"two {len(data) / 1e6:.1f} MB BYTES bodies: {elapsed:.2f} s on the thread; "
        f"longest event-loop pause {max(gaps) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    asyncio.run(hop_vs_inline())
    asyncio.run(loop_pause())
