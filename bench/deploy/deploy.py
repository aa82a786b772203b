"""Dask dataframe workloads on a cluster that `loci deploy dask` started (loci bench deploy, and
the deploy tests). Every partition is generated inside a worker from its index and a seed, so the
data is the same whatever the layout of the workers, and nothing but answers travels to the client.

  group-by (like W2): count, sum, min, max, mean of v by key over ROWS rows with KEYS keys
  join (like W3):     S (ROWS rows, key uniform in R's keys) joined with R (ROWS/16 rows, unique
                      keys) on key; answered as the number of joined rows and the sums of S.v and R.w

Modes (one JSON document per line on stdout):
  bench  wait for the workers, then per workload WARM untimed runs and one timed run:
         {"workload", "time_s", "hash"}; first a line with the cluster's facts and ready_s
  check  wait for the workers, answer both workloads once and compare each with pandas in this
         process on the same generated data; run one task pinned to every worker and read each
         worker's pid and cpu affinity from the inside; one line with all of it

An answer's hash: SHA-256 of its canonical CSV text (rows sorted by key, floats to 6 decimals),
first 16 hex digits.
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import pandas as pd
import dask.dataframe as dd
from distributed import Client

SEED = 20241124


def sizes(total, parts):
    """Rows of each of `parts` partitions, adding up to `total`."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def gen_kv(spec):
    """Partition `i` of a (key, v) table, both int64, keys uniform in 0..key_range-1: the
    group-by table (stream 2, key_range = the group count) and S (stream 3, key_range = |R|)."""
    stream, i, rows, key_range = spec
    rng = np.random.default_rng([SEED, stream, i])
    return pd.DataFrame(
        {
            "key": rng.integers(0, key_range, rows, dtype=np.int64),
            "v": rng.integers(0, 1_000_000, rows, dtype=np.int64),
        }
    )


def gen_r(spec):
    """Partition `i` of R: keys start..start+rows-1 (unique over R), w derived from the key."""
    start, rows = spec
    key = np.arange(start, start + rows, dtype=np.int64)
    return pd.DataFrame({"key": key, "w": (key * 2654435761) % 1_000_003})


GB_META = pd.DataFrame({"key": pd.Series([], dtype=np.int64), "v": pd.Series([], dtype=np.int64)})
R_META = pd.DataFrame({"key": pd.Series([], dtype=np.int64), "w": pd.Series([], dtype=np.int64)})


def specs(rows, keys, parts):
    """The generator arguments of the three tables."""
    nr = max(rows // 16, 1)
    gb = [(2, i, n, keys) for i, n in enumerate(sizes(rows, parts))]
    s = [(3, i, n, nr) for i, n in enumerate(sizes(rows, parts))]
    r, start = [], 0
    for n in sizes(nr, parts):
        if n:
            r.append((start, n))
        start += n
    return gb, s, r


def frame(gen, meta, args):
    # meta given: the client never calls the generator, every partition is made in a worker.
    return dd.from_map(gen, args, meta=meta, enforce_metadata=False)


def groupby_answer(df):
    """The group-by result as pandas (works on a dask or a pandas frame)."""
    return df.groupby("key")["v"].agg(["count", "sum", "min", "max", "mean"])


def join_answer(s, r):
    j = s.merge(r, on="key", how="inner")
    return pd.DataFrame(
        {"rows": [int(len(j))], "sum_v": [int(j["v"].sum())], "sum_w": [int(j["w"].sum())]}
    )


def digest(df):
    df = df.sort_index()
    text = df.to_csv(float_format="%.6f")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_groupby(args_gb):
    return groupby_answer(frame(gen_kv, GB_META, args_gb)).compute()


def run_join(args_s, args_r):
    s = frame(gen_kv, GB_META, args_s)
    r = frame(gen_r, R_META, args_r)
    j = s.merge(r, on="key", how="inner")
    # One pass: per-partition counts and sums, added on the client.
    part = j.map_partitions(
        lambda p: pd.DataFrame(
            {"rows": [len(p)], "sum_v": [p["v"].sum()], "sum_w": [p["w"].sum()]}
        ),
        meta=pd.DataFrame(
            {
                "rows": pd.Series([], dtype=np.int64),
                "sum_v": pd.Series([], dtype=np.int64),
                "sum_w": pd.Series([], dtype=np.int64),
            }
        ),
    ).compute()
    return pd.DataFrame({k: [int(part[k].sum())] for k in ["rows", "sum_v", "sum_w"]})


def workers_info(client):
    """Each worker's name, threads, memory limit, and (asked inside it) pid and cpu affinity."""
    info = client.scheduler_info()["workers"]
    inside = client.run(lambda: {"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0))})
    return {
        addr: {
            "name": str(w.get("name")),
            "nthreads": w.get("nthreads"),
            "memory_limit": w.get("memory_limit"),
            "pid": inside.get(addr, {}).get("pid"),
            "cpus": inside.get(addr, {}).get("cpus"),
        }
        for addr, w in info.items()
    }


def connect(a):
    t = time.time()
    client = Client(a.scheduler, timeout=f"{a.wait}s")
    client.wait_for_workers(a.workers, timeout=a.wait)
    return client, time.time() - (a.t0 if a.t0 else t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["bench", "check"])
    p.add_argument("--scheduler", required=True)
    p.add_argument("--workers", type=int, required=True, help="wait for this many workers")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--workloads", default="groupby,join")
    p.add_argument("--warm", type=int, default=1)
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the workers")
    p.add_argument("--t0", type=float, default=0.0, help="UNIX time the deployment started")
    a = p.parse_args()
    gb, s, r = specs(a.rows, a.keys, max(a.parts, 1))
    client, ready_s = connect(a)
    workers = workers_info(client)
    head = {
        "ready_s": ready_s,
        "workers": workers,
        "nthreads": sum(w["nthreads"] or 0 for w in workers.values()),
        "versions": {"dask": __import__("dask").__version__, "pandas": pd.__version__},
    }
    run = {"groupby": lambda: run_groupby(gb), "join": lambda: run_join(s, r)}
    names = a.workloads.split(",")
    for n in names:
        if n not in run:
            sys.exit(f"--workloads {n}: unknown; valid: groupby, join")
    if a.mode == "bench":
        print(json.dumps(head), flush=True)
        for n in names:
            for _ in range(a.warm):
                run[n]()
            t = time.perf_counter()
            ans = run[n]()
            dt = time.perf_counter() - t
            print(json.dumps({"workload": n, "time_s": dt, "hash": digest(ans)}), flush=True)
        client.close()
        return
    # check: the cluster's answers against pandas on the same data in this process.
    out = dict(head)
    ref = {
        "groupby": lambda: groupby_answer(pd.concat([gen_kv(x) for x in gb])),
        "join": lambda: join_answer(
            pd.concat([gen_kv(x) for x in s]), pd.concat([gen_r(x) for x in r])
        ),
    }
    for n in names:
        got, want = digest(run[n]()), digest(ref[n]())
        out[n] = {"hash": got, "reference": want, "correct": got == want}
    # One task pinned to each worker: every worker computes, and answers right.
    pinned = {}
    for addr, w in workers.items():
        fut = client.submit(lambda k: int(np.arange(k, dtype=np.int64).sum()), 100_000,
                            workers=[addr], allow_other_workers=False, pure=False)
        pinned[w["name"]] = fut.result(timeout=a.wait) == 100_000 * 99_999 // 2
    out["pinned_tasks_correct"] = pinned
    print(json.dumps(out), flush=True)
    client.close()


if __name__ == "__main__":
    main()
