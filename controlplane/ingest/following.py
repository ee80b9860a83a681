"""One bus subscription per channel on this replica, shared by every stream that follows it.

With Redis each subscription is a connection of its own, and a payload published once crosses
Redis once per subscription: 1,024 agent streams each subscribing to their job's channel would
hold 1,024 Redis connections per replica and receive every plan or offload decision 1,024
times. Here the first follower of a channel subscribes, each payload is handed to every
follower's ``deliver`` in turn (the same bytes object: a follower may cache work by identity),
and the last one to leave closes the subscription.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Deliver = Callable[[bytes], None]


@dataclass
class _Channel:
    receivers: dict[Hashable, Deliver] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    sub: object = None
    task: asyncio.Task | None = None


class SharedChannels:
    """Followers by channel, over one ``bus`` subscription per channel."""

    def __init__(self, bus) -> None:
        self.bus = bus
        self._channels: dict[str, _Channel] = {}

    def followers(self, channel: str) -> int:
        ch = self._channels.get(channel)
        return len(ch.receivers) if ch is not None else 0

    async def follow(self, channel: str, key: Hashable, deliver: Deliver) -> None:
        """Call ``deliver(payload)`` for each payload published on ``channel`` from now on
        (returns once the subscription is live). ``key`` names the follower for
        :meth:`unfollow`. Raises the bus's error, or ConnectionError when another follower's
        subscription attempt failed meanwhile."""
        ch = self._channels.get(channel)
        if ch is not None:
            ch.receivers[key] = deliver
            await ch.ready.wait()
            if self._channels.get(channel) is not ch:  # its subscription failed meanwhile
                raise ConnectionError(f"cannot subscribe to {channel}")
            return
        ch = self._channels[channel] = _Channel()
        ch.receivers[key] = deliver
        try:
            ch.sub = await self.bus.subscribe(channel)
        except BaseException:
            self._channels.pop(channel, None)
            ch.ready.set()
            raise
        ch.task = asyncio.create_task(self._forward(channel, ch))
        ch.ready.set()
        if not ch.receivers:  # every follower left while the subscription was being made
            await self._close(channel, ch)

    async def unfollow(self, channel: str, key: Hashable) -> None:
        """Stop delivering ``channel`` to ``key``; the last follower closes the subscription."""
        ch = self._channels.get(channel)
        if ch is None:
            return
        ch.receivers.pop(key, None)
        if not ch.receivers and ch.ready.is_set():
            await self._close(channel, ch)

    async def _close(self, channel: str, ch: _Channel) -> None:
        if self._channels.get(channel) is ch:
            del self._channels[channel]
        if ch.task is not None:
            ch.task.cancel()
        if ch.sub is not None:
            await ch.sub.close()

    async def _forward(self, channel: str, ch: _Channel) -> None:
        try:
            async for _channel, payload in ch.sub:
                for key, deliver in list(ch.receivers.items()):
                    try:
                        deliver(payload)
                    except Exception:  # one follower's failure must not starve the others
                        log.exception("delivering a payload of %s to %r failed", channel, key)
        finally:
            if self._channels.get(channel) is ch and ch.receivers:  # the bus failed: not a close
                del self._channels[channel]
                log.warning("subscription to %s ended: %d follower(s) get nothing more until "
                            "they follow again (reconnect)", channel, len(ch.receivers))
