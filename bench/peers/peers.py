#!/usr/bin/env python3
"""The loci engine workloads W1-W4 in DuckDB and Polars, on the very rows loci generated.

loci exports each table as raw little-endian u32 files (<dir>/<table>.k.u32, <dir>/<table>.v.u32);
this script loads them into each peer's native in-memory format (untimed), then times the query
only, `--reps` times, and prints one JSON object per peer on stdout:
  {"system": "duckdb", "version": "...", "times_s": [...], "checksum": {...}}
The checksum is computed from the query result, with the same definition loci uses, so the bench
can check that both sides computed the same answer on the same data.

Usage: peers.py --workload w2 --dir DIR --reps 3 --threads 2 --peers duckdb,polars
"""
import argparse
import json
import os
import sys
import time


def load(d, name, np):
    k = np.fromfile(os.path.join(d, name + ".k.u32"), dtype="<u4")
    v = np.fromfile(os.path.join(d, name + ".v.u32"), dtype="<u4")
    return k, v


def mapped(d, name, np):
    """The columns as read-only file mappings: DuckDB copies them into its own table, so the rows
    are held once in anonymous memory (the file pages are page cache the kernel may drop)."""
    k = np.memmap(os.path.join(d, name + ".k.u32"), dtype="<u4", mode="r")
    v = np.memmap(os.path.join(d, name + ".v.u32"), dtype="<u4", mode="r")
    return k, v


def agg_checksum(groups, count, s, mn, mx):
    return {"groups": int(groups), "count": int(count), "sum": int(s), "min": int(mn), "max": int(mx)}


def run_duckdb(args, np):
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {args.threads}")
    con.execute("SET preserve_insertion_order = false")
    if args.workload in ("w1", "w2"):
        k, v = mapped(args.dir, "t", np)
        con.register("src", {"k": k, "v": v})
        con.execute("CREATE TABLE t AS SELECT * FROM src")
        con.unregister("src")
        del k, v
        if args.workload == "w2":
            q = "SELECT k, count(v) AS c, sum(v)::UBIGINT AS s, min(v) AS mn, max(v) AS mx, avg(v) AS a FROM t GROUP BY k"
        else:
            q = "SELECT k, count(v) AS c, median(v)::DOUBLE AS m FROM t GROUP BY k"
    else:
        rk, rv = mapped(args.dir, "r", np)
        con.register("src", {"k": rk, "p": rv})
        con.execute("CREATE TABLE r AS SELECT * FROM src")
        con.unregister("src")
        del rk, rv
        sk, sv = mapped(args.dir, "s", np)
        con.register("src", {"k": sk, "q": sv})
        con.execute("CREATE TABLE s AS SELECT * FROM src")
        con.unregister("src")
        del sk, sv
        q = "SELECT count(*) AS c, sum(r.p::BIGINT + s.q::BIGINT)::BIGINT AS x FROM r JOIN s ON r.k = s.k"
    times = []
    res = None
    for _ in range(args.reps):
        t = time.perf_counter()
        res = con.execute(q).fetchnumpy()
        times.append(time.perf_counter() - t)
    if args.workload == "w2":
        ck = agg_checksum(len(res["k"]), res["c"].sum(), res["s"].astype("uint64").sum(), res["mn"].astype("int64").sum(), res["mx"].astype("int64").sum())
    elif args.workload == "w1":
        ck = {"groups": int(len(res["k"])), "count": int(res["c"].sum()), "twice_median": int(round(float((res["m"].astype("float64") * 2).sum())))}
    else:
        ck = {"count": int(res["c"][0]), "checksum": int(res["x"][0])}
    return {"system": "duckdb", "version": duckdb.__version__, "times_s": times, "checksum": ck}


def run_polars(args, np):
    os.environ["POLARS_MAX_THREADS"] = str(args.threads)
    import polars as pl

    if args.workload in ("w1", "w2"):
        k, v = load(args.dir, "t", np)
        df = pl.DataFrame({"k": k, "v": v})
        del k, v
        if args.workload == "w2":
            def q():
                return df.group_by("k").agg(
                    pl.col("v").count().alias("c"), pl.col("v").cast(pl.UInt64).sum().alias("s"),
                    pl.col("v").min().alias("mn"), pl.col("v").max().alias("mx"), pl.col("v").mean().alias("a"))
        else:
            def q():
                return df.group_by("k").agg(pl.col("v").count().alias("c"), pl.col("v").median().alias("m"))
    else:
        rk, rv = load(args.dir, "r", np)
        r = pl.DataFrame({"k": rk, "p": rv})
        del rk, rv
        sk, sv = load(args.dir, "s", np)
        s = pl.DataFrame({"k": sk, "q": sv})
        del sk, sv

        def q():
            return r.lazy().join(s.lazy(), on="k").select(
                pl.len().alias("c"), (pl.col("p").cast(pl.Int64) + pl.col("q").cast(pl.Int64)).sum().alias("x")).collect()
    times = []
    res = None
    for _ in range(args.reps):
        t = time.perf_counter()
        res = q()
        times.append(time.perf_counter() - t)
    if args.workload == "w2":
        ck = agg_checksum(res.height, res["c"].sum(), res["s"].sum(), res["mn"].cast(pl.Int64).sum(), res["mx"].cast(pl.Int64).sum())
    elif args.workload == "w1":
        ck = {"groups": res.height, "count": int(res["c"].sum()), "twice_median": int(round(float((res["m"].cast(pl.Float64) * 2).sum())))}
    else:
        ck = {"count": int(res["c"][0]), "checksum": int(res["x"][0])}
    return {"system": "polars", "version": pl.__version__, "times_s": times, "checksum": ck}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, choices=["w1", "w2", "w3", "w4"])
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
