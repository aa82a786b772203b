#!/usr/bin/env python3
"""The loci engine workloads W1-W4 in DuckDB and Polars, on the very rows loci generated.

loci exports each table (64-bit, every workload) as raw little-endian columns: <dir>/<table>.k.u64
(keys, uint64) and <dir>/<table>.v.i64 (values, int64) or, for W1/W2 with `--values f64`,
<dir>/<table>.v.f64 (values, float64). This script loads them into each peer's native in-memory
format in the same types (untimed: DuckDB UBIGINT and BIGINT or DOUBLE, Polars UInt64 and Int64
or Float64), then times the query only, `--reps` times, and prints one JSON object per peer:
  {"system": "duckdb", "version": "...", "timed": "...", "times_s": [...], "checksum": {...}}

What is timed, every rep: the query up to a materialised result (DuckDB: `fetchnumpy()` of every
output row; Polars: the collected DataFrame). W2 computes count, sum, min, max and avg of v for
every group; W1 the exact median of every group; W3 and W4 the join with count(*) and
sum(r.p + s.q) (the peer's hash join builds on R and probes with S; loci compares its W4 index
build + probe with it).

The checksum is a digest of the result, with the same definitions as loci (loci_engine::wide),
computed after the timed reps:
  tuple_hash(x1..xn) = h, where h = TUPLE_SEED and h = mix64(h ^ xi) for each field (64-bit
  two's-complement patterns of integers, IEEE bit patterns of doubles with -0.0 as +0.0;
  SplitMix64's finalizer); the digest is the wrapping sum over every output tuple, compared
  exactly: W2 (key, count, sum, min, max) on i64 values, (key, count, min, max) on f64 values; W1
  (key, count, 2*median) on i64, (key, count) on f64; W3 and W4 (key, r.p, s.q) of every matched
  pair, with the count and sum(r.p + s.q). What floating point makes order-dependent is compared
  to a relative tolerance of 1e-9 (|a - b| <= 1e-9 * max(|a|, |b|, 1)) through sum(x) and
  sum(x * w(key)), w(key) = (mix64(key ^ WEIGHT_SALT) >> 11) / 2^53, which binds every x to its
  key: W2's sum and avg, W1's median (DuckDB's (lo + hi) / 2 and Polars' lo + (hi - lo) / 2 of
  two doubles differ in the last bit). The joins' pair digest is computed by a separate, untimed
  pass over the join's output in slices of S.

Usage: peers.py --workload w2 --values f64 --dir DIR --reps 3 --threads 2 --peers duckdb,polars
"""
import argparse
import json
import os
import sys
import time

TUPLE_SEED = 0x243F6A8885A308D3
WEIGHT_SALT = 0x13198A2E03707344
# Rows of S per slice of W3's untimed pair-digest pass.
SLICE = 1 << 25


def cols(d, name, np, mmap, values="i64"):
    f = (lambda p, t: np.memmap(p, dtype=t, mode="r")) if mmap else (lambda p, t: np.fromfile(p, dtype=t))
    vt = {"i64": "<i8", "f64": "<f8"}[values]
    return f(os.path.join(d, f"{name}.k.u64"), "<u8"), f(os.path.join(d, f"{name}.v.{values}"), vt)


def mix64(z, np):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def u64(a, np):
    """A column as 64-bit patterns: two's complement of integers, the bits of doubles with -0.0
    as +0.0 (which zero a min or max keeps is up to the system)."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        return (a.astype(np.float64) + 0.0).view(np.uint64)
    if a.dtype.kind == "u":
        return a.astype(np.uint64)
    return a.astype(np.int64).view(np.uint64)


def tuple_hashes(columns, np):
    n = len(columns[0])
    h = np.full(n, TUPLE_SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for c in columns:
            h = mix64(h ^ u64(c, np), np)
    return h


def wsum(h, np):
    """Wrapping sum of uint64 hashes, as a Python int."""
    return int(np.add.reduce(h, dtype=np.uint64)) if len(h) else 0


def weights(k, np):
    """w(key) in [0, 1) for every key."""
    with np.errstate(over="ignore"):
        return (mix64(u64(k, np) ^ np.uint64(WEIGHT_SALT), np) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def float_sums(name, x, w, np):
    x = np.asarray(x, dtype=np.float64)
    return {f"{name}_sum": float(x.sum()), f"{name}_wsum": float((x * w).sum())}


def agg_digest(k, c, s, mn, mx, a, exact, np):
    """W2's digest; exact: i64 values (the sums are hashed too)."""
    fields = [k, c, s, mn, mx] if exact else [k, c, mn, mx]
    w = weights(k, np)
    d = {"groups": int(len(k)), "hash": wsum(tuple_hashes(fields, np), np)}
    return {**d, **float_sums("sum", s, w, np), **float_sums("avg", a, w, np)}


def median_digest(k, c, m, exact, np):
    """W1's digest; exact: i64 values (twice the median is an integer, hashed)."""
    m = np.asarray(m, dtype=np.float64)
    fields = [k, c, np.rint(m * 2).astype(np.int64)] if exact else [k, c]
    d = {"groups": int(len(k)), "hash": wsum(tuple_hashes(fields, np), np)}
    return {**d, **float_sums("median", m, weights(k, np), np)}


def run_duckdb(args, np):
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {args.threads}")
    con.execute("SET preserve_insertion_order = false")

    def table(name, file, vcol, values="i64"):
        k, v = cols(args.dir, file, np, True, values)
        con.register("src", {"k": k, vcol: v})
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM src")
        con.unregister("src")

    if args.workload in ("w1", "w2"):
        table("t", "t", "v", args.values)
        if args.workload == "w2":
            # sum(BIGINT) is a HUGEINT in DuckDB: back to BIGINT, loci's type; sum(DOUBLE) is a DOUBLE.
            total = "sum(v)::BIGINT" if args.values == "i64" else "sum(v)"
            q = (f"SELECT k, count(*) AS c, {total} AS s, min(v) AS mn, max(v) AS mx, avg(v) AS a "
                 "FROM t GROUP BY k")
            timed = "GROUP BY k: count, sum, min, max, avg; fetchnumpy of every group"
        else:
            q = "SELECT k, count(*) AS c, median(v)::DOUBLE AS m FROM t GROUP BY k"
            timed = "GROUP BY k: count, median; fetchnumpy of every group"
    else:
        table("r", "r", "p")
        table("s", "s", "q")
        q = "SELECT count(*) AS c, sum(r.p + s.q)::BIGINT AS x FROM r JOIN s ON r.k = s.k"
        timed = "hash join (build R, probe S): count(*), sum(r.p + s.q)"
    times = []
    res = None
    for _ in range(args.reps):
        t = time.perf_counter()
        res = con.execute(q).fetchnumpy()
        times.append(time.perf_counter() - t)
    exact = args.values == "i64"
    if args.workload == "w2":
        ck = agg_digest(res["k"], res["c"], res["s"], res["mn"], res["mx"], res["a"], exact, np)
    elif args.workload == "w1":
        ck = median_digest(res["k"], res["c"], res["m"], exact, np)
    else:
        n = con.execute("SELECT count(*) FROM s").fetchone()[0]
        h = 0
        for lo in range(0, n, SLICE):
            part = con.execute(
                "SELECT r.k AS k, r.p AS p, s.q AS q FROM r JOIN (SELECT k, q FROM s WHERE rowid >= ? AND rowid < ?) s "
                "ON r.k = s.k", [lo, lo + SLICE]).fetchnumpy()
            h = (h + wsum(tuple_hashes([part["k"], part["p"], part["q"]], np), np)) % (1 << 64)
        ck = {"count": int(res["c"][0]), "sum": int(res["x"][0]), "hash": h}
    return {"system": "duckdb", "version": duckdb.__version__, "timed": timed, "times_s": times, "checksum": ck}


def run_polars(args, np):
    os.environ["POLARS_MAX_THREADS"] = str(args.threads)
    import polars as pl

    if args.workload in ("w1", "w2"):
        k, v = cols(args.dir, "t", np, False, args.values)
        df = pl.DataFrame({"k": k, "v": v})
        del k, v
        if args.workload == "w2":
            def q():
                return df.group_by("k").agg(
                    pl.len().alias("c"), pl.col("v").sum().alias("s"),
                    pl.col("v").min().alias("mn"), pl.col("v").max().alias("mx"), pl.col("v").mean().alias("a"))
            timed = "group_by(k).agg(len, sum, min, max, mean): DataFrame of every group"
        else:
            def q():
                return df.group_by("k").agg(pl.len().alias("c"), pl.col("v").median().alias("m"))
            timed = "group_by(k).agg(len, median): DataFrame of every group"
    else:
        rk, rv = cols(args.dir, "r", np, False)
        r = pl.DataFrame({"k": rk, "p": rv})
        del rk, rv
        sk, sv = cols(args.dir, "s", np, False)
        s = pl.DataFrame({"k": sk, "q": sv})
        del sk, sv

        def q():
            return r.lazy().join(s.lazy(), on="k").select(
                pl.len().alias("c"), (pl.col("p") + pl.col("q")).sum().alias("x")).collect()
        timed = "lazy join on k (build + probe): len, sum(p + q)"
    times = []
    res = None
    for _ in range(args.reps):
        t = time.perf_counter()
        res = q()
        times.append(time.perf_counter() - t)
    exact = args.values == "i64"
    if args.workload == "w2":
        ck = agg_digest(res["k"].to_numpy(), res["c"].to_numpy(), res["s"].to_numpy(), res["mn"].to_numpy(),
                        res["mx"].to_numpy(), res["a"].to_numpy(), exact, np)
    elif args.workload == "w1":
        ck = median_digest(res["k"].to_numpy(), res["c"].to_numpy(), res["m"].to_numpy(), exact, np)
    else:
        h = 0
        for lo in range(0, s.height, SLICE):
            part = r.join(s.slice(lo, SLICE), on="k")
            h = (h + wsum(tuple_hashes([part["k"].to_numpy(), part["p"].to_numpy(), part["q"].to_numpy()], np), np)) % (1 << 64)
        ck = {"count": int(res["c"][0]), "sum": int(res["x"][0]), "hash": h}
    return {"system": "polars", "version": pl.__version__, "timed": timed, "times_s": times, "checksum": ck}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, choices=["w1", "w2", "w3", "w4"])
    ap.add_argument("--values", default="i64", choices=["i64", "f64"],
                    help="type of the value column of W1/W2's table t (the joins' payloads are i64)")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--peers", default="duckdb,polars")
    args = ap.parse_args()
    import numpy as np

    runners = {"duckdb": run_duckdb, "polars": run_polars}
    for p in args.peers.split(","):
        if p not in runners:
            sys.exit(f"unknown peer '{p}'; valid: {', '.join(runners)}")
    for p in args.peers.split(","):
        out = runners[p](args, np)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
