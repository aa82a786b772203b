"""TPC-H driver of `loci bench tpch` (crates/cli/src/bench/tpch): loads and queries one engine.

  tpch.py duckdb   --data DIR ...   DuckDB embedded in this process (run under `loci run`): the
                                    Parquet tables loaded into memory, then the queries
  tpch.py datafusion --data DIR ... the same with Apache DataFusion (datafusion-python)
  tpch.py postgres --socket DIR ... a client of the PostgreSQL server listening in DIR (the
                                    server runs under `loci run`; this client does not)
  tpch.py load-postgres --socket DIR --data DIR
                                    schema, COPY from CSV (exported by DuckDB), keys, indexes, ANALYZE

Query runs print one JSON line per timed run on stdout:
  {"query": 5, "time_s": 0.12, "rows": 5}
then one line describing the engine process: {"engine": ..., "version": ..., "pid": ...,
"maps_allocators": [...], "own_allocator": ..., "cpus_allowed": ..., "thp_enabled": ...}. With --answers FILE the
rows of every query's first timed run go to FILE as JSON (decimals as floats, dates as ISO text).
"""

import argparse
import datetime
import decimal
import json
import os
import sys
import time

TABLES = ["region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"]

# Columns in dbgen order with PostgreSQL types matching the Parquet schema of tpchgen-cli
# (BIGINT keys, DECIMAL(15,2), DATE, VARCHAR), so both engines see the same values.
SCHEMA = {
    "region": "r_regionkey bigint, r_name varchar, r_comment varchar",
    "nation": "n_nationkey bigint, n_name varchar, n_regionkey bigint, n_comment varchar",
    "supplier": "s_suppkey bigint, s_name varchar, s_address varchar, s_nationkey bigint, "
    "s_phone varchar, s_acctbal decimal(15,2), s_comment varchar",
    "customer": "c_custkey bigint, c_name varchar, c_address varchar, c_nationkey bigint, "
    "c_phone varchar, c_acctbal decimal(15,2), c_mktsegment varchar, c_comment varchar",
    "part": "p_partkey bigint, p_name varchar, p_mfgr varchar, p_brand varchar, p_type varchar, "
    "p_size integer, p_container varchar, p_retailprice decimal(15,2), p_comment varchar",
    "partsupp": "ps_partkey bigint, ps_suppkey bigint, ps_availqty integer, "
    "ps_supplycost decimal(15,2), ps_comment varchar",
    "orders": "o_orderkey bigint, o_custkey bigint, o_orderstatus varchar, "
    "o_totalprice decimal(15,2), o_orderdate date, o_orderpriority varchar, o_clerk varchar, "
    "o_shippriority integer, o_comment varchar",
    "lineitem": "l_orderkey bigint, l_partkey bigint, l_suppkey bigint, l_linenumber integer, "
    "l_quantity decimal(15,2), l_extendedprice decimal(15,2), l_discount decimal(15,2), "
    "l_tax decimal(15,2), l_returnflag varchar, l_linestatus varchar, l_shipdate date, "
    "l_commitdate date, l_receiptdate date, l_shipinstruct varchar, l_shipmode varchar, "
    "l_comment varchar",
}

# Primary keys and the usual secondary indexes (foreign keys and the date columns queries filter on).
INDEXES = [
    "alter table region add primary key (r_regionkey)",
    "alter table nation add primary key (n_nationkey)",
    "alter table supplier add primary key (s_suppkey)",
    "alter table customer add primary key (c_custkey)",
    "alter table part add primary key (p_partkey)",
    "alter table partsupp add primary key (ps_partkey, ps_suppkey)",
    "alter table orders add primary key (o_orderkey)",
    "alter table lineitem add primary key (l_orderkey, l_linenumber)",
    "create index on nation (n_regionkey)",
    "create index on supplier (s_nationkey)",
    "create index on customer (c_nationkey)",
    "create index on partsupp (ps_suppkey)",
    "create index on orders (o_custkey)",
    "create index on orders (o_orderdate)",
    "create index on lineitem (l_partkey, l_suppkey)",
    "create index on lineitem (l_suppkey)",
    "create index on lineitem (l_shipdate)",
]

# Allocator libraries looked for in /proc/PID/maps.
ALLOCATOR_LIBS = ["jemalloc", "tcmalloc", "tbbmalloc", "mimalloc", "loci_malloc"]

# Messages an allocator compiled into a module carries (its symbols may be hidden or prefixed).
LINKED_ALLOCATORS = {"jemalloc": b"<jemalloc>: ", "mimalloc": b"mimalloc: error: "}


def linked_allocator(module_file):
    """The allocator statically linked into an engine's extension module, if any: its own
    allocations then bypass an LD_PRELOADed malloc (which still serves Python and libraries)."""
    with open(module_file, "rb") as f:
        data = f.read()
    found = [name for name, sig in LINKED_ALLOCATORS.items() if sig in data]
    return f"{'+'.join(found)} (statically linked)" if found else None


def value(v):
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    return v


def process_facts(pid):
    """The allocator libraries mapped into process `pid`, the cpus it may run on, its THP state."""
    with open(f"/proc/{pid}/maps") as f:
        libs = {line.split()[-1].rsplit("/", 1)[-1] for line in f if "/" in line}
    with open(f"/proc/{pid}/status") as f:
        status = dict(l.rstrip("\n").split(":\t", 1) for l in f if ":\t" in l)
    found = sorted(l for l in libs if any(a in l for a in ALLOCATOR_LIBS))
    # THP_enabled (Linux 6.x): 0 once `loci run --thp off` set PR_SET_THP_DISABLE.
    return {"pid": pid, "maps_allocators": found, "cpus_allowed": status["Cpus_allowed_list"].strip(),
            "thp_enabled": status.get("THP_enabled", "").strip() or None}


def query_text(qdir, q, sf):
    with open(os.path.join(qdir, f"q{q:02}.sql")) as f:
        return f.read().replace("{sf}", repr(float(sf)))


def embedded(engine, version, module_file, execute, args):
    """Runs the queries in this process and prints its facts."""
    run_queries(execute, args)
    facts = process_facts(os.getpid())
    facts.update(engine=engine, version=version, own_allocator=linked_allocator(module_file))
    print(json.dumps(facts), flush=True)


def run_queries(execute, args):
    """Runs each query --warm times untimed, then once timed; prints the JSON lines."""
    answers = {}
    for q in [int(x) for x in args.list.split(",")]:
        sql = query_text(args.queries, q, args.sf)
        for _ in range(args.warm):
            execute(sql)
        t0 = time.perf_counter()
        rows = execute(sql)
        t = time.perf_counter() - t0
        answers[f"q{q:02}"] = [[value(v) for v in r] for r in rows]
        print(json.dumps({"query": q, "time_s": t, "rows": len(rows)}), flush=True)
    if args.answers:
        with open(args.answers, "w") as f:
            json.dump(answers, f)


def duckdb_engine(args):
    import duckdb

    con = duckdb.connect()
    con.execute(f"set threads = {args.threads}")
    for t in TABLES:
        path = os.path.join(args.data, f"{t}.parquet")
        con.execute(f"create table {t} as select * from read_parquet('{path}')")
    import _duckdb

    embedded("duckdb", duckdb.__version__, _duckdb.__file__,
             lambda sql: con.execute(sql).fetchall(), args)


def datafusion_engine(args):
    import datafusion
    from datafusion import _internal

    ctx = datafusion.SessionContext(
        datafusion.SessionConfig().with_target_partitions(args.threads))
    for t in TABLES:
        # In memory like DuckDB's tables: the Parquet decoded once, before any query.
        batches = ctx.read_parquet(os.path.join(args.data, f"{t}.parquet")).collect()
        ctx.register_record_batches(t, [batches])

    def execute(sql):
        return [list(r.values()) for r in ctx.sql(sql).to_arrow_table().to_pylist()]

    embedded("datafusion", datafusion.__version__, _internal.__file__, execute, args)


def pg_connect(args):
    import psycopg

    return psycopg.connect(host=args.socket, port=args.port, user="postgres", dbname="postgres",
                           autocommit=True)


def postgres_engine(args):
    con = pg_connect(args)
    cur = con.cursor()

    def execute(sql):
        cur.execute(sql)
        return cur.fetchall()

    run_queries(execute, args)
    cur.execute("select pg_backend_pid(), current_setting('server_version')")
    pid, version = cur.fetchone()
    facts = process_facts(pid)
    facts.update(engine="postgres", version=version, own_allocator=None)
    print(json.dumps(facts), flush=True)


def load_postgres(args):
    import duckdb

    con = pg_connect(args)
    cur = con.cursor()
    exp = duckdb.connect()
    exp.execute(f"set threads = {args.threads}")
    for t in TABLES:
        cur.execute(f"drop table if exists {t}")
        cur.execute(f"create table {t} ({SCHEMA[t]})")
        csv = os.path.join(args.csv_dir, f"{t}.csv")
        src = os.path.join(args.data, f"{t}.parquet")
        exp.execute(f"copy (select * from read_parquet('{src}')) to '{csv}' (header false)")
        with open(csv, "rb") as f, cur.copy(f"copy {t} from stdin (format csv)") as cp:
            while chunk := f.read(1 << 20):
                cp.write(chunk)
        os.remove(csv)
        print(f"loaded {t}", file=sys.stderr, flush=True)
    for stmt in INDEXES:
        cur.execute(stmt)
    cur.execute("analyze")
    print("indexed and analyzed", file=sys.stderr, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", choices=["duckdb", "datafusion", "postgres", "load-postgres"])
    p.add_argument("--data", help="directory of the Parquet tables")
    p.add_argument("--queries", help="directory of q01.sql .. q22.sql")
    p.add_argument("--sf", default="1", help="scale factor (Q11's FRACTION is 0.0001 / SF)")
    p.add_argument("--list", default=",".join(str(q) for q in range(1, 23)))
    p.add_argument("--warm", type=int, default=1, help="untimed runs of a query before its timed one")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--answers", help="write the rows of every query here (JSON)")
    p.add_argument("--socket", help="PostgreSQL's Unix socket directory")
    p.add_argument("--port", type=int, default=5432)
    p.add_argument("--csv-dir", help="load-postgres: where the CSV exports are written")
    args = p.parse_args()
    modes = {"duckdb": duckdb_engine, "datafusion": datafusion_engine, "postgres": postgres_engine,
             "load-postgres": load_postgres}
    modes[args.mode](args)


if __name__ == "__main__":
    main()
