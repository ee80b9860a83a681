"""Streams of a job share ONE bus subscription per channel on a replica (real Redis: each
subscription there is a connection, and a payload crosses Redis once per subscription)."""

from __future__ import annotations

import asyncio

import redis

from moeplane.controlplane.bus.redis import RedisBus
from moeplane.controlplane.ingest.following import SharedChannels
from tests import aio


def numsub(url: str, channel: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return dict(client.pubsub_numsub(channel))[channel.encode()]
    finally:
        client.close()


async def numsub_becomes(url: str, channel: str, want, timeout: float = 10.0) -> int:
    """NUMSUB of ``channel`` once ``want(n)`` holds (Redis handles a SUBSCRIBE or a closed
    subscription's connection asynchronously); raises after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not want(n := await asyncio.to_thread(numsub, url, channel)):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"NUMSUB {channel} stayed {n}")
        await asyncio.sleep(0.01)  # polling Redis, with the deadline above
    return n


def test_followers_share_one_subscription_and_each_gets_every_payload(redis_url):
    prefix = "moeplane-test-following:"
    channel = "offload.job-1"

    async def scenario():
        bus = RedisBus(redis_url, prefix=prefix)
        await bus.start()
        channels = SharedChannels(bus)
        got: dict[str, list[bytes]] = {k: [] for k in ("a", "b", "c")}
        arrived = asyncio.Event()

        def deliver(key):
            def f(payload: bytes) -> None:
                if key == "b":
                    raise RuntimeError("this follower is broken")
                got[key].append(payload)
                if all(len(got[k]) >= 2 for k in ("a", "c")):
                    arrived.set()
            return f

        for key in got:
            await channels.follow(channel, key, deliver(key))
        subs = await numsub_becomes(redis_url, prefix + channel, lambda n: n >= 1)
        await bus.publish(channel, b"one")
        await bus.publish(channel, b"two")
        await asyncio.wait_for(arrived.wait(), 10)
        await channels.unfollow(channel, "a")
        still = channels.followers(channel)
        for key in ("b", "c"):
            await channels.unfollow(channel, key)
        after = await numsub_becomes(redis_url, prefix + channel, lambda n: n == 0)
        await bus.close()
        return subs, got, still, after

    subs, got, still, after = aio.run(scenario())
    assert subs == 1  # three followers, one Redis subscription
    assert got["a"] == got["c"] == [b"one", b"two"]  # a failing follower starves no one
    assert still == 2
    assert after == 0  # the last follower closed it
