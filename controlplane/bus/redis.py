"""Redis pub/sub bus (redis.asyncio): carries live data and plans between replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from moeplane.controlplane.bus.base import Bus, Subscription


class _RedisSubscription(Subscription):
    def __init__(self, pubsub):
        self._pubsub = pubsub

    async def __aiter__(self) -> AsyncIterator[tuple[str, bytes]]:
        async for msg in self._pubsub.listen():
            if msg["type"] == "message":
                yield msg["channel"].decode(), msg["data"]

    async def close(self) -> None:
        await self._pubsub.aclose()


class RedisBus(Bus):
    name = "redis"

    def __init__(self, url: str, prefix: str = "moeplane:"):
        self.url = url
        self.prefix = prefix
        self._client = aioredis.Redis.from_url(url)

    async def start(self) -> None:
        await self._client.ping()

    async def publish(self, channel: str, payload: bytes) -> int:
        return int(await self._client.publish(self.prefix + channel, payload))

    async def subscribe(self, *channels: str) -> Subscription:
        pubsub = self._client.pubsub()
        await pubsub.subscribe(*(self.prefix + c for c in channels))
        sub = _RedisSubscription(pubsub)
        return _Unprefixed(sub, len(self.prefix))

    async def close(self) -> None:
        await self._client.aclose()


class _Unprefixed(Subscription):
    def __init__(self, inner: _RedisSubscription, cut: int):
        self._inner = inner
        self._cut = cut

    async def __aiter__(self) -> AsyncIterator[tuple[str, bytes]]:
        async for channel, payload in self._inner:
            yield channel[self._cut :], payload

    async def close(self) -> None:
        await self._inner.close()
