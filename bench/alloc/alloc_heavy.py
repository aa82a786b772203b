"""Allocation-heavy Python for `loci bench alloc --programs` (program `python3`).

    python3 alloc_heavy.py N

Fixed work for a given N, deterministic output (one line with a SHA-256 of the results):
dicts of records built and dropped, strings joined and split, lists grown and sorted, JSON
encoded and decoded, and byte buffers of 1 KiB..256 KiB (above pymalloc's 512-byte limit, so
they come from malloc) allocated and freed in varying order. Uses no randomness and no time.
"""

import hashlib
import json
import sys


def lcg(x):
    return (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF


def main():
    n = int(sys.argv[1])
    h = hashlib.sha256()
    x = 12345
    keep = []
    for rnd in range(n):
        # Records: many small objects (pymalloc) and dict tables that grow (malloc).
        table = {}
        for i in range(2000):
            x = lcg(x)
            table[f"k{rnd}-{i}-{x % 9973}"] = {"id": i, "v": x % 100003, "tags": [x % 7, x % 11, x % 13]}
        rows = sorted(table.items(), key=lambda kv: (kv[1]["v"], kv[0]))
        h.update(rows[0][0].encode())
        h.update(rows[-1][0].encode())
        # Text: long strings built, split and joined.
        text = " ".join(k for k, _ in rows)
        words = text.split(" ")
        h.update(str(len(text)).encode())
        h.update(words[len(words) // 2].encode())
        # JSON round trip of the whole table.
        blob = json.dumps(table, sort_keys=True)
        back = json.loads(blob)
        h.update(hashlib.sha256(blob.encode()).digest())
        h.update(str(len(back)).encode())
        # Large buffers with mixed lifetimes: some kept for a few rounds, freed out of order.
        for j in range(64):
            x = lcg(x)
            size = 1024 << (x % 9)
            buf = bytearray(size)
            buf[0] = j
            buf[-1] = rnd & 0xFF
            keep.append(buf)
        if len(keep) > 256:
            x = lcg(x)
            cut = x % len(keep)
            keep = keep[cut:] + keep[:cut]
            del keep[:128]
        h.update(str(sum(len(b) for b in keep)).encode())
    print(f"rounds {n} sha256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
