-- Fixed workload for `loci bench alloc --programs` (program `sqlite3`), run as
--   sqlite3 :memory:  with  `.parameter set @n N`  and then this file on stdin.
-- Builds tables of @n rows of text and numbers (no random(): every value follows from the row
-- number), indexes them, and runs joins, group-bys, sorts, window functions and updates with a
-- large page cache, so the page cache, sorter and statement memory come from malloc. Every
-- result is printed; the bench compares a digest of the output across allocators.
PRAGMA cache_size = -262144;
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, grp INTEGER, name TEXT, body TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < @n)
INSERT INTO t SELECT i, (i * 7919) % 100003, i % 97, 'name-' || ((i * 31) % 50021),
  substr(hex(zeroblob(16 + (i * 13) % 200)), 1, 32 + (i * 17) % 400) || i FROM c;
CREATE INDEX t_k ON t(k);
CREATE INDEX t_name ON t(name, grp);
CREATE TABLE u AS SELECT grp, k % 1000 AS k2, count(*) AS n, sum(length(body)) AS bytes
  FROM t GROUP BY grp, k % 1000;
CREATE INDEX u_k2 ON u(k2, grp);
SELECT count(*), sum(k), sum(length(body)) FROM t;
SELECT grp, count(*), min(name), max(name), sum(length(body)) FROM t GROUP BY grp ORDER BY grp;
SELECT t.grp, sum(u.n), sum(u.bytes) FROM t JOIN u ON u.k2 = t.k % 1000 AND u.grp = t.grp
  WHERE t.id % 5 = 0 GROUP BY t.grp ORDER BY 2 DESC, 1 LIMIT 20;
SELECT name, count(*) FROM t GROUP BY name ORDER BY count(*) DESC, name LIMIT 20;
SELECT id, k, rank() OVER (PARTITION BY grp ORDER BY k, id) AS r FROM t
  WHERE id % 1000 = 0 ORDER BY id LIMIT 50;
SELECT group_concat(name, ',') FROM (SELECT name FROM t ORDER BY body, id LIMIT 200);
UPDATE t SET body = body || body WHERE id % 3 = 0;
DELETE FROM t WHERE id % 4 = 1;
SELECT count(*), sum(length(body)), total(k) FROM t;
SELECT k % 17, count(DISTINCT name), max(length(body)) FROM t GROUP BY k % 17 ORDER BY 1;
