#!/usr/bin/env python3
"""Peers of `loci bench subarray`: the same subarray boxes on the same volume, in numpy, xarray
and TileDB. Run by loci (bench/peers/.venv/bin/python, see bench/peers/setup --subarray).

Input: a raw C-order volume written by loci and a JSON job file:
  {"file": PATH, "shape": [z, y, x], "dtype": "<f4", "sum32": N, "reps": R, "threads": T,
   "peers": ["numpy", "numpy-prealloc", "numpy-threads", "xarray", "tiledb"], "tiledb_dir": DIR,
   "queries": [{"case": "c10/all/s0.2", "bounds": [[lo, hi], ...], "tile": [cz, cy, cx],
                "reps": R2}, ...]}
A query's `reps` (loci's timed reps of that case) overrides the job's. `threads` is the number of
threads loci copies with (numpy-threads uses as many; default 1).
`sum32` is the wrapping sum of the volume's little-endian u32 words (mod 2**64): the check that
the peers read the same bytes loci generated.

The numpy peers and their conditions:
  numpy           `vol[box].copy()`: a fresh result allocated (and its pages faulted) every rep,
                  one thread.
  numpy-prealloc  `np.copyto(out, vol[box])` into one `out` allocated and written (faulted) once
                  per case before the timed reps and reused by every rep, one thread.
  numpy-threads   the same reused `out`; the box split along its first dimension longer than one
                  cell into `threads` slabs (fewer if that dimension is shorter), each slab copied
                  by `np.copyto` on a ThreadPoolExecutor of `threads` workers, made (and its
                  workers started) once before any timed rep; numpy releases the GIL while it
                  copies. A rep is: submit every slab, wait for all.

Output (stdout): one JSON object per line:
  {"system": "numpy", "case": ..., "times_s": [...], "sum32": N, "version": "2.4.6",
   "threads": 1, "result": "fresh"}
`sum32` is of the result after the last rep (loci fails the run when it differs from its own).
Only the query is timed (the volume is loaded, results preallocated, the thread pool started
and TileDB arrays written, before).
"""
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def sum32(a):
    b = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    w = b[: len(b) // 4 * 4].view("<u4")
    return int(w.astype(np.uint64).sum(dtype=np.uint64))


def timed(fn, reps):
    out, times = None, []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, times


def slabs(bounds, n):
    """The box `bounds` ([[lo, hi], ...]) as at most `n` slabs along its first dimension longer
    than one cell: a list of (index into the result, index into the volume) pairs of slice
    tuples, none empty, in order, together covering the box exactly once."""
    dims = len(bounds)
    d = next((i for i, (lo, hi) in enumerate(bounds) if hi - lo > 1), 0)
    lo, hi = bounds[d]
    ext = hi - lo
    n = max(1, min(n, ext))
    out = []
    for k in range(n):
        a, b = ext * k // n, ext * (k + 1) // n
        if a == b:
            continue
        dst = tuple(slice(a, b) if i == d else slice(None) for i in range(dims))
        src = tuple(slice(lo + a, lo + b) if i == d else slice(l, h)
                    for i, (l, h) in enumerate(bounds))
        out.append((dst, src))
    return out


def started_pool(n):
    """A ThreadPoolExecutor of `n` workers, all of them started (the executor starts workers
    lazily, on submit): the timed reps find every worker waiting."""
    ex = ThreadPoolExecutor(max_workers=n)
    barrier = threading.Barrier(n)
    for f in [ex.submit(barrier.wait) for _ in range(n)]:
        f.result()
    return ex


def main():
    job = json.load(open(sys.argv[1]))
    shape = tuple(job["shape"])
    vol = np.fromfile(job["file"], dtype=job["dtype"]).reshape(shape)
    got = sum32(vol)
    if got != job["sum32"]:
        print(json.dumps({"error": f"volume checksum {got} != loci's {job['sum32']}"}))
        sys.exit(1)
    reps = job["reps"]
    nthreads = max(1, int(job.get("threads", 1)))
    peers = job["peers"]
    emit = lambda d: print(json.dumps(d), flush=True)

    if "numpy" in peers:
        for q in job["queries"]:
            sl = tuple(slice(lo, hi) for lo, hi in q["bounds"])
            r, times = timed(lambda: vol[sl].copy(), q.get("reps", reps))
            emit({"system": "numpy", "case": q["case"], "times_s": times, "sum32": sum32(r),
                  "version": np.__version__, "threads": 1, "result": "fresh"})

    def reused_result(q):
        # Allocated and every page written before the timed reps (zeros: a slab or rep that
        # copied nothing leaves them, and the checksum catches it).
        out = np.empty(tuple(hi - lo for lo, hi in q["bounds"]), dtype=vol.dtype)
        out.fill(0)
        return out

    if "numpy-prealloc" in peers:
        for q in job["queries"]:
            sl = tuple(slice(lo, hi) for lo, hi in q["bounds"])
            out = reused_result(q)
            _, times = timed(lambda: np.copyto(out, vol[sl]), q.get("reps", reps))
            emit({"system": "numpy-prealloc", "case": q["case"], "times_s": times,
                  "sum32": sum32(out), "version": np.__version__, "threads": 1,
                  "result": "reused"})
            del out

    if "numpy-threads" in peers:
        ex = started_pool(nthreads)
        for q in job["queries"]:
            out = reused_result(q)
            parts = slabs(q["bounds"], nthreads)
            copy = lambda p: np.copyto(out[p[0]], vol[p[1]])
            # list() waits for every slab (and raises a slab's exception here).
            _, times = timed(lambda: list(ex.map(copy, parts)), q.get("reps", reps))
            emit({"system": "numpy-threads", "case": q["case"], "times_s": times,
                  "sum32": sum32(out), "version": np.__version__, "threads": nthreads,
                  "slabs": len(parts), "result": "reused"})
            del out
        ex.shutdown()

    if "xarray" in peers:
        import xarray as xr

        da = xr.DataArray(vol, dims=("depth", "inline", "crossline"), name="velocity")
        for q in job["queries"]:
            sel = {d: slice(lo, hi) for d, (lo, hi) in zip(da.dims, q["bounds"])}
            r, times = timed(lambda: da.isel(sel).copy(), q.get("reps", reps))
            emit({"system": "xarray", "case": q["case"], "times_s": times,
                  "sum32": sum32(r.values), "version": xr.__version__, "threads": 1,
                  "result": "fresh"})

    if "tiledb" in peers:
        try:
            import tiledb
        except ImportError as e:
            emit({"system": "tiledb", "skipped": f"cannot import tiledb: {e}"})
            return
        made = {}
        for q in job["queries"]:
            tile = tuple(q["tile"])
            if tile not in made:
                uri = f"{job['tiledb_dir']}/v_{'_'.join(map(str, tile))}"
                dims = [tiledb.Dim(name=n, domain=(0, s - 1), tile=t, dtype=np.int64)
                        for n, s, t in zip(("depth", "inline", "crossline"), shape, tile)]
                schema = tiledb.ArraySchema(domain=tiledb.Domain(*dims), sparse=False,
                                            attrs=[tiledb.Attr(name="velocity", dtype=vol.dtype)])
                tiledb.Array.create(uri, schema)
                with tiledb.open(uri, "w") as A:
                    A[:] = vol
                made[tile] = uri
            with tiledb.open(made[tile], "r") as A:
                sl = tuple(slice(lo, hi) for lo, hi in q["bounds"])
                r, times = timed(lambda: A[sl]["velocity"], q.get("reps", reps))
            emit({"system": "tiledb", "case": q["case"], "times_s": times, "sum32": sum32(r),
                  "version": tiledb.__version__, "threads": "tiledb-default",
                  "result": "fresh"})


if __name__ == "__main__":
    main()
