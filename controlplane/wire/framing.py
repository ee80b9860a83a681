"""Protobuf wire framing by hand, for messages built on the hot path without message objects
(shared plan bytes, OK acks). Only what those need: varints and length-delimited fields."""

from __future__ import annotations


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def length_delimited(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: ``tag`` (field number << 3 | 2, one byte) + varint length + bytes."""
    return bytes((tag,)) + varint(len(payload)) + payload
