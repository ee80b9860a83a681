"""Idempotent writes. At-least-once on the wire becomes exactly-once here.

Every sequenced record first claims its (node, seq) row in ``received`` with
INSERT ... ON CONFLICT DO NOTHING RETURNING (one set-based statement per batch, see bulk.py):
a record whose claim returns nothing was stored before and is a duplicate. Loads are additionally deduplicated by (job, step, node, ranks), so
a node that re-numbers after losing its spool still cannot count a step twice. Everything in one call
commits in one transaction: the caller acknowledges only after it returns.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.store import bulk, claims
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.records import (
    HelloRecord,
    LoadsRecord,
    MarkerRecord,
    SamplesRecord,
    SequencedRecord,
    StepStatsRecord,
)


def upsert(
    conn: Connection, table: sa.Table, key: dict, values: dict, *, insert_only: dict | None = None, newer=None
) -> None:
    """Insert ``key | values | insert_only``, or set ``values`` on the row with that primary ``key``.

    ``newer(excluded)``: an optional SQL condition (given the proposed row) under which an
    existing row is overwritten, e.g. only by a newer step; it must depend on nothing but its
    argument (it is compiled once per call site, see ``bulk.run_compiled``).
    """
    upsert_many(conn, table, list(key), [key | values | (insert_only or {})], list(values), newer=newer)


def upsert_many(conn: Connection, table: sa.Table, key: Sequence[str], rows: Sequence[dict],
                update: Sequence[str], *, newer=None, only_changes: bool = False) -> None:
    """``upsert`` of many rows (dicts with the same columns) in one executemany: insert each, or
    set its ``update`` columns on the existing row with that primary ``key``.

    ``only_changes``: leave an existing row alone when none of its ``update`` columns would
    change (no new row version, no row lock held to commit: 1,024 agents reconnecting declare
    the same job and devices again)."""
    if not rows:
        return
    cols = tuple(rows[0])
    if newer is not None and (newer.__closure__ or newer.__defaults__):
        raise ValueError("upsert: newer must not capture variables (it is compiled once)")

    def build(c: Connection):
        ins = bulk.dialect_insert(c, table)
        where = None if newer is None else newer(ins.excluded)
        if only_changes:
            changed = sa.or_(*(table.c[col].is_distinct_from(ins.excluded[col]) for col in update))
            where = changed if where is None else sa.and_(where, changed)
        return ins.values({col: sa.bindparam(col) for col in cols}).on_conflict_do_update(
            index_elements=[table.c[k] for k in key], set_={col: ins.excluded[col] for col in update},
            where=where,
        )

    ck = ("upsert", table.name, tuple(key), cols, tuple(update), None if newer is None else newer.__code__,
          only_changes)
    bulk.run_compiled(conn, ck, build, rows if len(rows) > 1 else rows[0])


def layout_key(node_id: str, device_ids: Sequence[str], metrics: Sequence[str]) -> str:
    text = json.dumps([node_id, list(device_ids), list(metrics)])
    return hashlib.sha256(text.encode()).hexdigest()


def _ranks_text(ranks: Iterable[int]) -> str:
    return ",".join(str(r) for r in ranks)


class StoreWriter:
    """Writes records; caches sample-layout ids (they only ever grow)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._layouts: dict[tuple[str, tuple[str, ...], tuple[str, ...]], int] = {}

    # ------------------------------------------------------------------ registration
    def register_hello(self, hello: HelloRecord) -> int:
        """Upsert the node, its devices and its job. Returns the highest seq stored for the node.

        Raises ``claims.SpecConflict`` when the hello's job spec differs from the job's, and
        ``claims.Claimed`` when it declares a device or announces a rank of another node; then
        nothing is written."""
        with self.engine.begin() as conn:
            if hello.job_id:
                job = hello.job
                spec = {} if job is None else {k: getattr(job, k) for k in claims.SPEC_FIELDS if getattr(job, k)}
                claims.fix_job_spec(conn, hello.job_id, spec, hello.ts)
                claims.check_ranks(conn, hello.job_id, hello.node_id, hello.ranks)
            claims.check_devices(conn, hello.node_id, [d.device_id for d in hello.devices])
            upsert(conn, t.nodes, {"node_id": hello.node_id}, {
                "hostname": hello.hostname,
                "agent_version": hello.agent_version,
                "job_id": hello.job_id or None,
                "ranks": _ranks_text(hello.ranks),
                "last_seen": hello.ts,
            }, insert_only={"first_seen": hello.ts})
            device_cols = ("node_id", "idx", "kind", "model", "memory_total_bytes", "rank")
            upsert_many(conn, t.devices, ("device_id",), [
                {"device_id": dev.device_id, "node_id": hello.node_id, "idx": dev.index, "kind": dev.kind,
                 "model": dev.model, "memory_total_bytes": dev.memory_total_bytes, "rank": dev.rank}
                for dev in hello.devices
            ], device_cols, only_changes=True, newer=_same_node)
            max_seq = conn.execute(
                sa.select(sa.func.max(t.received.c.seq)).where(t.received.c.node_id == hello.node_id)
            ).scalar()
        return int(max_seq or 0)

    def set_job_shape(self, job_id: str, layers: int, experts: int) -> None:
        """Fix a job's [L, E] from its first loads when no hello declared it."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(t.jobs)
                .where(t.jobs.c.job_id == job_id, t.jobs.c.layers.is_(None))
                .values(layers=layers, experts=experts)
            )

    def job_shape(self, job_id: str) -> tuple[int | None, int | None] | None:
        """(layers, experts) of a known job, None entries while unknown; None for no such job."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.jobs.c.layers, t.jobs.c.experts).where(t.jobs.c.job_id == job_id)
            ).first()
        return None if row is None else (row.layers, row.experts)

    def layout_id(self, node_id: str, device_ids: Sequence[str], metrics: Sequence[str]) -> int:
        """Id of the (node, devices, metrics) layout of a sample frame; created when new."""
        return self.layout_ids([(node_id, tuple(device_ids), tuple(metrics))])[0]

    def layout_ids(self, layouts: Sequence[tuple[str, tuple[str, ...], tuple[str, ...]]]) -> list[int]:
        """Ids of (node_id, device_ids, metrics) layouts, the new ones created together in one
        transaction (1,024 agents' first frames arrive within a second).

        Cached by the tuples themselves (a dict lookup per frame; the sha256 key is only
        computed for a layout this process has not seen)."""
        new = {lay: layout_key(*lay) for lay in layouts if lay not in self._layouts}
        if new:
            rows = [{"key": key, "node_id": lay[0], "device_ids": json.dumps(list(lay[1])),
                     "metrics": json.dumps(list(lay[2]))} for lay, key in new.items()]
            with self.engine.begin() as conn:
                bulk.run_compiled(
                    conn, "layout-if-new",
                    lambda c: bulk.dialect_insert(c, t.sample_layouts)
                    .values({k: sa.bindparam(k) for k in ("key", "node_id", "device_ids", "metrics")})
                    .on_conflict_do_nothing(index_elements=[t.sample_layouts.c.key]),
                    rows if len(rows) > 1 else rows[0],
                )
                ids = dict(conn.execute(
                    sa.select(t.sample_layouts.c.key, t.sample_layouts.c.id)
                    .where(t.sample_layouts.c.key.in_(list(new.values())))
                ).all())
            for lay, key in new.items():
                self._layouts[lay] = ids[key]
        return [self._layouts[lay] for lay in layouts]

    # ------------------------------------------------------------------ batched writes
    def write(self, records: Sequence[SequencedRecord]) -> list[bool]:
        """Store a batch in one transaction. Returns, per record, whether it was a duplicate.

        Set-based: one claim statement for all (node, seq), one for all load parts, one insert
        per table for frames, latest frames and step statistics, and one read-modify-write of
        the global matrix per (job, step) with every fresh part of the batch summed first.
        A key repeated inside the batch counts once (its first occurrence).
        """
        samples = [rec for rec in records if isinstance(rec, SamplesRecord)]
        ids = self.layout_ids([(rec.node_id, tuple(rec.device_ids), tuple(rec.metrics)) for rec in samples])
        layouts = {id(rec): lid for rec, lid in zip(samples, ids, strict=True)}
        duplicate = [True] * len(records)
        with self.engine.begin() as conn:
            new = bulk.claim(
                conn, t.received, ("node_id", "seq", "received_at"),
                [(r.node_id, r.seq, rec_ts(r)) for r in records], ("node_id", "seq"),
            )
            fresh: list[int] = []
            for i, rec in enumerate(records):
                key = (rec.node_id, rec.seq)
                if key in new:
                    new.discard(key)  # a repeat later in this batch is a duplicate
                    fresh.append(i)
            loads = [i for i in fresh if isinstance(records[i], LoadsRecord)]
            parts = bulk.claim(
                conn, t.load_parts, ("job_id", "step", "node_id", "ranks", "missing_ranks"),
                [(records[i].job_id, records[i].step, records[i].node_id, _ranks_text(records[i].ranks),
                  _ranks_text(records[i].missing_ranks)) for i in loads],
                ("job_id", "step", "node_id", "ranks"),
            )
            fresh_loads: list[LoadsRecord] = []
            for i in fresh:
                rec = records[i]
                if isinstance(rec, LoadsRecord):
                    key = (rec.job_id, rec.step, rec.node_id, _ranks_text(rec.ranks))
                    if key not in parts:
                        continue
                    parts.discard(key)
                    fresh_loads.append(rec)
                duplicate[i] = False
            samples = [records[i] for i in fresh if isinstance(records[i], SamplesRecord)]
            self._write_samples(conn, samples, layouts)
            self._write_step_stats(
                conn, [records[i] for i in fresh if isinstance(records[i], StepStatsRecord)]
            )
            self._add_global_loads(conn, fresh_loads)
        return duplicate

    def _write_samples(self, conn: Connection, recs: Sequence[SamplesRecord], layouts: dict[int, int]) -> None:
        """One frame row per record; the newest frame of each node upserted once."""
        if not recs:
            return
        blobs = [np.ascontiguousarray(r.values, dtype="<f4").tobytes() for r in recs]
        bulk.insert(
            conn, t.sample_frames, ("layout", "ts", "values"),
            [(layouts[id(r)], r.ts, b) for r, b in zip(recs, blobs, strict=True)],
        )
        newest: dict[str, tuple] = {}
        for r, b in zip(recs, blobs, strict=True):
            cur = newest.get(r.node_id)
            if cur is None or r.ts >= cur[2]:
                newest[r.node_id] = (r.node_id, layouts[id(r)], r.ts, b)
        bulk.upsert_rows(conn, t.node_latest, ("node_id", "layout", "ts", "values"), list(newest.values()),
                         ("node_id",), newer_than="ts")

    def _add_global_loads(self, conn: Connection, loads: Sequence[LoadsRecord]) -> None:
        """Sum fresh node parts into the per-(job, step) global matrix, one row update per step."""
        by_step: dict[tuple[str, int], list[LoadsRecord]] = defaultdict(list)
        for rec in loads:
            by_step[(rec.job_id, rec.step)].append(rec)
        for (job_id, step), parts in by_step.items():
            total = np.zeros(parts[0].counts.shape, dtype=np.int64)
            for p in parts:
                total += p.counts
            ts = max(p.ts for p in parts)
            for _attempt in range(3):
                row = conn.execute(
                    sa.select(t.expert_loads.c.counts, t.expert_loads.c.nodes_reported, t.expert_loads.c.ts)
                    .where(t.expert_loads.c.job_id == job_id, t.expert_loads.c.step == step)
                    .with_for_update()
                ).first()
                if row is not None:
                    prev = np.frombuffer(row.counts, dtype="<i8").reshape(total.shape)
                    conn.execute(
                        sa.update(t.expert_loads)
                        .where(t.expert_loads.c.job_id == job_id, t.expert_loads.c.step == step)
                        .values(
                            counts=(prev + total).astype("<i8").tobytes(),
                            nodes_reported=row.nodes_reported + len(parts),
                            ts=max(ts, row.ts),
                        )
                    )
                    break
                done = bulk.run_compiled(
                    conn, "step-loads-if-new", _new_step_loads,
                    {"job_id": job_id, "step": step, "ts": ts, "layers": total.shape[0], "experts": total.shape[1],
                     "nodes_reported": len(parts), "counts": total.astype("<i8").tobytes()},
                ).first()
                if done is not None:
                    break
            else:  # pragma: no cover - needs three lost races in a row
                raise RuntimeError(f"could not add loads of job {job_id} step {step}")

    def _write_step_stats(self, conn: Connection, recs: Sequence[StepStatsRecord]) -> None:
        rows = [
            (rec.job_id, rec.step, r.rank, rec.node_id, rec.ts, r.step_time_s, r.host_bound_ratio, r.tokens)
            for rec in recs
            for r in rec.ranks
        ]
        bulk.insert(
            conn, t.step_stats,
            ("job_id", "step", "rank", "node_id", "ts", "step_time_s", "host_bound_ratio", "tokens"),
            rows, ignore_conflicts_on=("job_id", "step", "rank"),
        )


def _same_node(excluded):
    """A device row is updated only by the node it belongs to (a race past ``check_devices``
    leaves it alone)."""
    return t.devices.c.node_id == excluded.node_id


def _new_step_loads(conn: Connection):
    cols = ("job_id", "step", "ts", "layers", "experts", "nodes_reported", "counts")
    return (
        bulk.dialect_insert(conn, t.expert_loads).values({c: sa.bindparam(c) for c in cols})
        .on_conflict_do_nothing(index_elements=[t.expert_loads.c.job_id, t.expert_loads.c.step])
        .returning(t.expert_loads.c.step)
    )


def rec_ts(rec: SequencedRecord) -> float:
    return 0.0 if isinstance(rec, MarkerRecord) else rec.ts
