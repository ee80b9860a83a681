"""The bus interface: publish bytes to a channel; subscribe to channels by exact name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator


class Subscription(ABC):
    """Messages of the subscribed channels as ``(channel, payload)``, in publish order."""

    @abstractmethod
    def __aiter__(self) -> AsyncIterator[tuple[str, bytes]]: ...

    @abstractmethod
    async def close(self) -> None: ...


class Bus(ABC):
    name: str

    @abstractmethod
    async def start(self) -> None:
        """Connect (and fail loudly when the backing service is unreachable)."""

    @abstractmethod
    async def publish(self, channel: str, payload: bytes) -> int:
        """Deliver to every current subscriber of ``channel``; returns how many got it."""

    @abstractmethod
    async def subscribe(self, *channels: str) -> Subscription:
        """Subscribe before returning, so nothing published after the call is missed."""

    @abstractmethod
    async def close(self) -> None: ...
