"""History reads under load: REST ``/api/v1/history/*`` latency with many concurrent readers
while a job ingests, against one reader on the same job in the same run (issue 33).

    .venv/bin/python -m benchmarks.history_load --database sqlite --readers 50 --seconds 30

A fresh ``moeplane serve`` (SQLite file or a fresh PostgreSQL database) and ``moeplane
loadgen`` (``--nodes`` nodes x 8 ranks, [58, 256] loads every ``--step-time`` s, 16 metrics at
1 Hz) run for the whole benchmark. Once ``--warmup`` steps are stored, phase 1 runs one reader and
phase 2 runs ``--readers`` readers, each for ``--seconds``. A reader loops over the three
history reads a dashboard makes: one device metric, the job's step statistics, and its load
matrix (each over the default window, one page). Latency is measured from request to complete
response. Target: p99 <= 1 s with 50 readers.

The readers speak HTTP/1.1 with keep-alive over asyncio streams (:class:`KeepAlive`), one
connection each: httpx cost ~5 ms of client CPU per request, twice the server's cost per page,
so on a 2-core machine the client, not the server, set the pace and the tail (``--client
httpx`` measures with it). Each row also gives the server's CPU (cores) and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

from benchmarks.scaleharness import (
    NO_CONTROLLER,
    cpu_of,
    loadgen,
    pg_database,
    sqlite_database,
    start_serve,
)
from moeplane.controlplane.procs import wait_until

JOB = "loadgen"


def history_urls(nodes: int) -> list[str]:
    """The reads each reader cycles through (device of node n % nodes)."""
    urls = []
    for n in range(max(1, nodes)):
        urls += [f"/api/v1/history/devices?device_id=lg-{n:05d}/dev0&metric=lg_metric_0",
                 f"/api/v1/history/jobs/{JOB}/steps",
                 f"/api/v1/history/jobs/{JOB}/loads?view=layer&layer=0"]
    return urls


class KeepAlive:
    """One HTTP/1.1 keep-alive connection: ``GET`` a path, read the whole response (the server
    sends Content-Length). Status and body bytes; raises OSError/IncompleteReadError/ValueError
    when the connection fails."""

    def __init__(self, base: str):
        u = urlsplit(base)
        self.host, self.port = u.hostname, u.port
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self, path: str) -> tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode())
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = dict(line.lower().split(":", 1) for line in head[1:] if ":" in line)
            body = await reader.readexactly(int(fields["content-length"]))
        except (OSError, asyncio.IncompleteReadError, KeyError, ValueError):
            writer.close()
            self.streams = None
            raise
        return int(head[0].split(" ", 2)[1]), body

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()


async def read_for(base: str, readers: int, seconds: float, urls: list[str], client: str = "raw") -> dict:
    """``readers`` concurrent loops of GETs over ``urls`` for ``seconds``, each on its own
    keep-alive connection (``client`` "raw": :class:`KeepAlive`; "httpx": one httpx pool):
    latencies (s), errors."""
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=readers, max_keepalive_connections=readers)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:

        async def reader(i: int) -> None:
            conn = KeepAlive(base)
            k = i
            while time.monotonic() < deadline:
                url = urls[k % len(urls)]
                k += 1
                t0 = time.perf_counter()
                try:
                    if client == "httpx":
                        status = (await http.get(url)).status_code
                    else:
                        status = (await conn.get(url))[0]
                    if status != 200:
                        errors.append(f"{url} -> {status}")
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, KeyError, ValueError) as exc:
                    errors.append(f"{url} -> {type(exc).__name__}")
                latencies.append(time.perf_counter() - t0)
            conn.close()

        await asyncio.gather(*(reader(i) for i in range(readers)))
    lat = np.array(latencies)
    return {"readers": readers, "requests": len(lat), "errors": len(errors), "first_errors": errors[:3],
            "p50_s": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
            "p99_s": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
            "max_s": float(lat.max()) if len(lat) else float("nan")}


def _latest_step(base: str) -> int:
    return httpx.get(f"{base}/api/v1/jobs/{JOB}", timeout=10).json()["latest_step"]


def run(database: str, readers: int, seconds: float, warmup: float, nodes: int, step_time: float,
        client: str = "raw") -> list[dict]:
    db = pg_database() if database == "postgres" else sqlite_database()
    with db as url, tempfile.TemporaryDirectory(prefix="moeplane-histload-") as tmp_s:
        tmp = Path(tmp_s)
        serve = start_serve(url, tmp, env=NO_CONTROLLER)
        total = warmup * step_time + 2 * seconds + 60
        gen = loadgen([serve.grpc], tmp, "--job", JOB, "--nodes", str(nodes), "--step-time", str(step_time),
                      "--duration", str(total))
        try:
            wait_until(lambda: _latest_step(serve.http) >= warmup, 120 + 2 * warmup * step_time,
                       f"{warmup:.0f} steps ingested", retry_on=(httpx.HTTPError, KeyError, TypeError))
            urls = history_urls(nodes)
            rows = []
            for n in (1, readers):
                cpu0, t0 = cpu_of(serve.popen.pid), time.monotonic()
                row = asyncio.run(read_for(serve.http, n, seconds, urls, client))
                rows.append({"database": database, **row, "ingest_running": gen.poll() is None,
                             "serve_cores": (cpu_of(serve.popen.pid) - cpu0) / (time.monotonic() - t0),
                             "load_average": os.getloadavg()[0]})
            return rows
        finally:
            with contextlib.suppress(Exception):
                gen.kill()
            serve.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database", choices=("sqlite", "postgres"), action="append")
    p.add_argument("--readers", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30.0, help="per phase")
    p.add_argument("--warmup", type=int, default=20, help="steps ingested before reading")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--step-time", type=float, default=1.0)
    p.add_argument("--client", choices=("raw", "httpx"), default="raw", help="the readers' HTTP client")
    args = p.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}; readers={args.readers} "
          f"seconds/phase={args.seconds} nodes={args.nodes} step_time={args.step_time} client={args.client}")
    print("| database | readers | requests | errors | p50 s | p99 s | max s | server CPU, cores | load average "
          "| ingest running |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for database in args.database or ["sqlite"]:
        for r in run(database, args.readers, args.seconds, args.warmup, args.nodes, args.step_time, args.client):
            print(f"| {r['database']} | {r['readers']} | {r['requests']} | {r['errors']} | {r['p50_s']:.3f} | "
                  f"{r['p99_s']:.3f} | {r['max_s']:.3f} | {r['serve_cores']:.2f} | {r['load_average']:.1f} | "
                  f"{r['ingest_running']} |", flush=True)
            if r["first_errors"]:
                print(f"<!-- errors: {r['first_errors']} -->")


if __name__ == "__main__":
    main()
