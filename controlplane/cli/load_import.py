"""``moeplane import``: load per-expert token counts recorded elsewhere into a job's history.

    moeplane import FILE [FILE ...] --job JOB [--start-step N] [--step-seconds S]
                    [--rank R] [--key NAME] [--database-url URL]

FILE formats (by content, not by extension):

- an SGLang expert-distribution dump: ``torch.save`` of a dict with ``logical_count``
  ``[steps, L, E]`` (tokens per logical expert per layer per step) and optionally ``rank``
  (needs torch, the ``moeplane[torch]`` extra; read with ``weights_only=True``);
- a ``.npy`` array ``[steps, L, E]`` (or ``[L, E]``, one step);
- a ``.npz`` archive holding one such array (or ``--key NAME`` to pick one).

Counts must be non-negative whole numbers. Several files are ranks of one job (their
``rank``, else ``--rank`` plus the file's position): their counts are summed per step, as the
node agent sums a node's ranks. Step ``i`` of a file is stored as step ``--start-step + i``
with the timestamp ``now - (steps - 1 - i) * --step-seconds``, so the history reads like a
recent run. Importing the same file again changes nothing (each (job, step, rank) part is
stored once). After the import ``moeplane plan``, the REST history and the dashboard read
the job like any other. Unreadable, malformed or mismatched input (a shape that differs
between files or from the job's): exit status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import zipfile

EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """Input that cannot be imported; the message is the one line printed."""


def register(subparsers) -> None:
    from moeplane.controlplane.cli.serve import add_store_args

    parser = subparsers.add_parser(
        "import", help="import per-expert loads (SGLang dump, .npy/.npz [steps, L, E]) into a job",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", metavar="FILE", help="SGLang dump, .npy or .npz")
    parser.add_argument("--job", required=True, help="job id to import into (created if new)")
    parser.add_argument("--start-step", type=int, default=0, help="step of the first row (0)")
    parser.add_argument("--step-seconds", type=float, default=1.0,
                        help="seconds between consecutive steps' timestamps (1.0)")
    parser.add_argument("--rank", type=int, default=0,
                        help="rank of the first file without its own (0); the next get +1")
    parser.add_argument("--key", help="the array to read from a .npz holding several")
    add_store_args(parser)

    def one_line_error(message: str) -> None:
        print(f"moeplane import: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)

    parser.error = one_line_error  # type: ignore[method-assign]
    parser.set_defaults(func=run)


def read_counts(path: str, key: str | None = None):
    """``(counts int64 [steps, L, E], rank or None)`` from one file; BadInput naming the file."""
    import numpy as np

    try:
        with open(path, "rb") as fh:
            head = fh.read(6)
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    rank = None
    if head == np.lib.format.MAGIC_PREFIX:
        array = _np_load(path)
    elif head[:4] == b"PK\x03\x04" and _is_npz(path):
        archive = _np_load(path)
        names = list(archive.files)
        if key is not None and key not in names:
            raise BadInput(f"{path}: no array {key!r} (has {', '.join(names) or 'none'})")
        if key is None and len(names) != 1:
            raise BadInput(f"{path}: {len(names)} arrays ({', '.join(names)}); pick one with --key")
        array = archive[key or names[0]]
    else:
        array, rank = _sglang_dump(path)
    return _as_counts(path, np.asarray(array)), rank


def _np_load(path: str):
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise BadInput(f"{path}: cannot read as .npy/.npz: {exc}") from None


def _is_npz(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return all(name.endswith(".npy") for name in archive.namelist())
    except zipfile.BadZipFile:
        return False


def _sglang_dump(path: str):
    try:
        import torch
    except ImportError:
        raise BadInput(f"{path}: not .npy/.npz; reading an SGLang dump needs torch "
                       "(pip install 'moeplane[torch]')") from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a bad file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(f"{path}: neither .npy/.npz nor a torch.save dump ({reason})") from None
    if not isinstance(data, dict) or "logical_count" not in data:
        what = f"keys {sorted(map(str, data))}" if isinstance(data, dict) else type(data).__name__
        raise BadInput(f"{path}: an SGLang dump is a dict with logical_count; got {what}")
    count = data["logical_count"]
    if not isinstance(count, torch.Tensor):
        raise BadInput(f"{path}: logical_count is {type(count).__name__}, expected a tensor")
    rank = data.get("rank")
    if rank is not None and not isinstance(rank, int):
        raise BadInput(f"{path}: rank is {rank!r}, expected an int")
    return count.numpy(), rank


def _as_counts(path: str, array):
    """int64 ``[steps, L, E]`` from an integer or whole-valued float array."""
    import numpy as np

    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3 or 0 in array.shape:
        raise BadInput(f"{path}: shape {list(array.shape)}, expected [steps, layers, experts]")
    if array.dtype.kind not in "iuf":
        raise BadInput(f"{path}: dtype {array.dtype}, expected integer or float counts")
    if array.dtype.kind == "f" and not (np.isfinite(array).all() and (array == np.round(array)).all()):
        raise BadInput(f"{path}: counts are not whole numbers")
    if (array < 0).any():
        raise BadInput(f"{path}: negative counts")
    return array.astype(np.int64)


def run(args: argparse.Namespace) -> int:
    try:
        if args.step_seconds <= 0:
            raise BadInput(f"--step-seconds: must be > 0, got {args.step_seconds}")
        if args.start_step < 0:
            raise BadInput(f"--start-step: must be >= 0, got {args.start_step}")
        if not args.job.strip():
            raise BadInput("--job: empty job id")
        parts = []
        for i, path in enumerate(args.files):
            counts, rank = read_counts(path, args.key)
            parts.append((path, counts, args.rank + i if rank is None else rank))
        _check_together(parts)
        steps = _store(args, parts)
    except BadInput as exc:
        print(f"moeplane import: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _, counts, _ = parts[0]
    print(f"imported {steps} steps of [{counts.shape[1]}, {counts.shape[2]}] loads from "
          f"{len(parts)} file(s) into job {args.job}")
    return 0


def _check_together(parts) -> None:
    first_path, first, _ = parts[0]
    seen: dict[int, str] = {}
    for path, counts, rank in parts:
        if counts.shape != first.shape:
            raise BadInput(f"{path}: shape {list(counts.shape)} differs from {first_path}'s "
                           f"{list(first.shape)}")
        if rank in seen:
            raise BadInput(f"{path}: rank {rank} again (also {seen[rank]})")
        seen[rank] = path


def _store(args, parts) -> int:
    import time

    from moeplane.controlplane.cli.serve import settings_from
    from moeplane.controlplane.store import claims
    from moeplane.controlplane.store.engine import make_engine
    from moeplane.controlplane.store.records import LoadsRecord
    from moeplane.controlplane.store.writes import StoreWriter

    _, first, _ = parts[0]
    steps, layers, experts = first.shape
    engine = make_engine(settings_from(args).database_url)
    now = time.time()
    try:
        with engine.begin() as conn:
            claims.fix_job_spec(conn, args.job, {"layers": layers, "experts": experts}, now)
        records = [
            LoadsRecord(node_id=f"import/{args.job}/rank{rank}", seq=args.start_step + i + 1,
                        job_id=args.job, step=args.start_step + i,
                        ts=now - (steps - 1 - i) * args.step_seconds, ranks=(rank,),
                        missing_ranks=(), counts=counts[i])
            for _, counts, rank in parts for i in range(steps)
        ]
        StoreWriter(engine).write(records)
    except claims.SpecConflict as exc:
        raise BadInput(f"--job {args.job}: {str(exc).split(': ', 1)[1]}") from None
    finally:
        engine.dispose()
    return steps
