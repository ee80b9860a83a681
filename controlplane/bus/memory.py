"""In-process bus: asyncio queues, one per subscription. For the embedded single process."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator

from moeplane.controlplane.bus.base import Bus, Subscription

_CLOSED = object()


class _QueueSubscription(Subscription):
    def __init__(self, bus: InProcessBus, channels: tuple[str, ...]):
        self._bus = bus
        self.channels = channels
        self.queue: asyncio.Queue = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[tuple[str, bytes]]:
        while True:
            item = await self.queue.get()
            if item is _CLOSED:
                return
            yield item

    async def close(self) -> None:
        self._bus._remove(self)
        self.queue.put_nowait(_CLOSED)


class InProcessBus(Bus):
    name = "in-process"

    def __init__(self) -> None:
        self._subs: dict[str, set[_QueueSubscription]] = defaultdict(set)

    async def start(self) -> None:
        return None

    async def publish(self, channel: str, payload: bytes) -> int:
        subs = list(self._subs.get(channel, ()))
        for sub in subs:
            sub.queue.put_nowait((channel, payload))
        return len(subs)

    async def subscribe(self, *channels: str) -> Subscription:
        sub = _QueueSubscription(self, channels)
        for ch in channels:
            self._subs[ch].add(sub)
        return sub

    def _remove(self, sub: _QueueSubscription) -> None:
        for ch in sub.channels:
            self._subs[ch].discard(sub)

    async def close(self) -> None:
        for subs in list(self._subs.values()):
            for sub in list(subs):
                await sub.close()
