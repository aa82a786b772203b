#!/usr/bin/env python3
"""Peers of `loci bench subarray`: the same subarray boxes on the same volume, in numpy, xarray
and TileDB. Run by loci (bench/peers/.venv/bin/python, see bench/peers/setup --subarray).

Input: a raw C-order volume written by loci and a JSON job file:
  {"file": PATH, "shape": [z, y, x], "dtype": "<f4", "sum32": N, "reps": R,
   "peers": ["numpy", "xarray", "tiledb"], "tiledb_dir": DIR,
   "queries": [{"case": "c10/all/s0.2", "bounds": [[lo, hi], ...], "tile": [cz, cy, cx],
                "reps": R2}, ...]}
A query's `reps` (loci's timed reps of that case) overrides the job's.
`sum32` is the wrapping sum of the volume's little-endian u32 words (mod 2**64): the check that
the peers read the same bytes loci generated.

Output (stdout): one JSON object per line:
  {"system": "numpy", "case": ..., "times_s": [...], "sum32": N, "version": "2.4.6"}
Only the query is timed (the volume is loaded, and TileDB arrays written, before).
"""
import json
import sys
import time

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


def main():
    job = json.load(open(sys.argv[1]))
    shape = tuple(job["shape"])
    vol = np.fromfile(job["file"], dtype=job["dtype"]).reshape(shape)
    got = sum32(vol)
    if got != job["sum32"]:
        print(json.dumps({"error": f"volume checksum {got} != loci's {job['sum32']}"}))
        sys.exit(1)
    reps = job["reps"]
    peers = job["peers"]
    emit = lambda d: print(json.dumps(d), flush=True)

    if "numpy" in peers:
        for q in job["queries"]:
            sl = tuple(slice(lo, hi) for lo, hi in q["bounds"])
            r, times = timed(lambda: vol[sl].copy(), q.get("reps", reps))
            emit({"system": "numpy", "case": q["case"], "times_s": times, "sum32": sum32(r),
                  "version": np.__version__})

    if "xarray" in peers:
        import xarray as xr

        da = xr.DataArray(vol, dims=("depth", "inline", "crossline"), name="velocity")
        for q in job["queries"]:
            sel = {d: slice(lo, hi) for d, (lo, hi) in zip(da.dims, q["bounds"])}
            r, times = timed(lambda: da.isel(sel).copy(), q.get("reps", reps))
            emit({"system": "xarray", "case": q["case"], "times_s": times,
                  "sum32": sum32(r.values), "version": xr.__version__})

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
                  "version": tiledb.__version__})


if __name__ == "__main__":
    main()
