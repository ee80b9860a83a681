"""Streams of a job share ONE bus subscription per channel on a replica (real Redis: each
subscription there is a connection, and a payload crosses Redis once per subscription)."""

from __future__ import annotations

import asyncio

import redis

from controlplane.bus.redis import RedisBus
from controlplane.ingest.following import SharedChannels
from tests import aio


def numsub(url: str, channel: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return dict(client.pubsub_numsub(channel))[channel.encode()]
    finally:
        client.close()


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
        subs = await asyncio.to_thread(numsub, redis_url, prefix + channel)
        await bus.publish(channel, b"one")
        await bus.publish(channel, b"two")
        await asyncio.wait_for(arrived.wait(), 10)
        await channels.unfollow(channel, "a")
        still = channels.followers(channel)
        for key in ("b", "c"):
            await channels.unfollow(channel, key)
        after = await asyncio.to_thread(numsub, redis_url, prefix + channel)
        await bus.close()
        return subs, got, still, after

    subs, got, still, after = aio.run(scenario())
    assert subs == 1  # three followers, one Redis subscription
    assert got["a"] == got["c"] == [b"one", b"two"]  # a failing follower starves no one
    assert still == 2
    assert after == 0  # the last follower closed it
