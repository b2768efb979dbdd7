"""Memory, traffic and cold start per engine replica when an ingress shards stores by
``store_id`` with consistent hashing (issue 24, past one machine; docs/sharding.md).

    python bench/bench_shards.py [--tuples 10M,100M] [--replicas 1,2,4,8,16]
        [--bytes-per-tuple 101.5] [--load-seconds-per-million 3.9] [--base-mib 78]
        [--stores-per-million 200] [--seed 24] [--json PATH]

A simulation, not a run: it takes what one engine measured on this machine and spreads it over a
store population and a hash ring.

Inputs (defaults measured on the 2-core development box, 2026-11-29; bench/RESULTS.md, "Issue
24: sharding by store_id"):

* ``--bytes-per-tuple``: resident memory an engine grows by per tuple loaded
  (``bench/bench_engine_load.py`` on ``bench/data/large``, 979,583 tuples: 101.5 B);
* ``--load-seconds-per-million``: wall seconds to load a million tuples of one store on first
  check (on-demand mode's per-store ``COPY``: 3.9 s best; the start-up snapshot of every store
  took 2.2 s per million at best; both about 2.1 CPU seconds per million in the engine, the rest
  is PostgreSQL and the shared machine);
* ``--base-mib``: resident memory of an engine worker holding no store (``authio serve engine
  --workers 1`` in on-demand mode, after its first request).

The population: ``--stores-per-million`` stores per million tuples, their sizes drawn (seeded)
from a Zipf law (exponent ``--zipf-s``, a few very large tenants and a long tail) or a lognormal
(``--lognormal-sigma``), scaled to the total; ids like the service's (``store_`` and 26
characters). Traffic: checks per store proportional to its size (``size``), or Zipf over the
stores independently of their size (``zipf``: a small store may be the busiest).

The ring is nginx's ``hash $store_id consistent`` (``ngx_http_upstream_hash_module``, ketama,
compatible with Cache::Memcached::Fast): per server 160 points (weight 1), point ``j`` being
``crc32(host "\\0" port prev)`` where ``prev`` is point ``j-1``'s hash as 4 little-endian
bytes (0 for the first); a key goes to the first point at or above ``crc32(key)``, wrapping
around. Servers are ``10.0.0.<n>:8081``.

Per total, distribution and replica count R, the table gives: the largest store (its memory is
the floor no replica count lowers), memory per replica (mean and max, and max/mean), the
traffic share of the busiest replica against the mean (for both traffic models), and the cold
start of the slowest replica (every store routed to it loaded once, one after another) against
an engine that holds every store (``SERVICE_ENGINE_STORES=all``: each replica loads it all).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import statistics
import sys
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

POINTS_PER_SERVER = 160  # nginx: peer->weight * 160
_ID_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lowercase (the ids' ULIDs)


class Ring:
    """nginx's ketama ring over ``servers`` (``"host:port"``), weight 1 each."""

    def __init__(self, servers: Sequence[str]) -> None:
        points: dict[int, int] = {}
        for index, server in enumerate(servers):
            host, _, port = server.rpartition(":")
            base = host.encode() + b"\0" + port.encode()
            prev = 0
            for _ in range(POINTS_PER_SERVER):
                h = zlib.crc32(base + prev.to_bytes(4, "little"))
                points.setdefault(h, index)  # nginx keeps one point per hash value
                prev = h
        self.hashes = sorted(points)
        self.owners = [points[h] for h in self.hashes]

    def server(self, key: str) -> int:
        """The index of the server ``key`` goes to."""
        i = bisect.bisect_left(self.hashes, zlib.crc32(key.encode()))
        return self.owners[i % len(self.hashes)]


def store_ids(n: int, rng: random.Random) -> list[str]:
    return ["store_" + "".join(rng.choice(_ID_ALPHABET) for _ in range(26)) for _ in range(n)]


def sizes(total: int, n: int, dist: str, rng: random.Random, zipf_s: float,
          sigma: float) -> list[int]:
    """``n`` store sizes (tuples, at least 1) summing to about ``total``, shuffled."""
    if dist == "zipf":
        weights = [1 / (k ** zipf_s) for k in range(1, n + 1)]
    else:
        weights = [rng.lognormvariate(0.0, sigma) for _ in range(n)]
    scale = total / sum(weights)
    out = [max(1, round(w * scale)) for w in weights]
    rng.shuffle(out)
    return out


def traffic(n: int, rng: random.Random, zipf_s: float) -> list[float]:
    """Zipf check traffic over the stores, independent of their sizes (a random order)."""
    weights = [1 / (k ** zipf_s) for k in range(1, n + 1)]
    rng.shuffle(weights)
    return weights


@dataclass
class Row:
    tuples: int
    dist: str
    replicas: int
    stores: int
    largest_tuples: int
    largest_mib: float
    mem_mean_mib: float
    mem_max_mib: float
    mem_imbalance: float
    size_traffic_imbalance: float
    zipf_traffic_imbalance: float
    cold_start_max_s: float
    cold_start_all_s: float
    all_mode_mib: float


def simulate(total: int, dist: str, replica_counts: Sequence[int], args: argparse.Namespace,
             ) -> list[Row]:
    rng = random.Random(f"{args.seed}:{total}:{dist}")
    n = max(1, round(total / 1e6 * args.stores_per_million))
    ids = store_ids(n, rng)
    tuple_counts = sizes(total, n, dist, rng, args.zipf_s, args.lognormal_sigma)
    checks = traffic(n, rng, args.zipf_s)
    real_total = sum(tuple_counts)
    bpt, base = args.bytes_per_tuple, args.base_mib
    mib = 1024 * 1024
    rows = []
    for r in replica_counts:
        ring = Ring([f"10.0.0.{i + 1}:8081" for i in range(r)])
        held = [0] * r
        busy = [0.0] * r
        for sid, size, weight in zip(ids, tuple_counts, checks, strict=True):
            owner = ring.server(sid)
            held[owner] += size
            busy[owner] += weight
        mem = [base + h * bpt / mib for h in held]
        size_share = [h / real_total for h in held]
        zipf_share = [b / sum(checks) for b in busy]
        rows.append(Row(
            tuples=real_total, dist=dist, replicas=r, stores=n,
            largest_tuples=max(tuple_counts), largest_mib=max(tuple_counts) * bpt / mib,
            mem_mean_mib=statistics.fmean(mem), mem_max_mib=max(mem),
            mem_imbalance=max(mem) / statistics.fmean(mem),
            size_traffic_imbalance=max(size_share) * r,
            zipf_traffic_imbalance=max(zipf_share) * r,
            cold_start_max_s=max(held) / 1e6 * args.load_seconds_per_million,
            cold_start_all_s=real_total / 1e6 * args.snapshot_seconds_per_million,
            all_mode_mib=base + real_total * bpt / mib,
        ))
    return rows


def _mib(v: float) -> str:
    return f"{v / 1024:,.1f} GiB" if v >= 1024 else f"{v:,.0f} MiB"


def _count(v: int) -> str:
    return f"{v / 1e6:,.1f}M" if v >= 1e6 else f"{v / 1e3:,.0f}k"


def markdown(rows: Sequence[Row]) -> str:
    head = ("| tuples | sizes | R | stores | largest store | memory/replica mean | max | max/mean "
            "| checks max/mean (∝ size) | (Zipf) | cold start, slowest replica | every store "
            "(`all`) |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for x in rows:
        out.append(
            f"| {_count(x.tuples)} | {x.dist} | {x.replicas} | {x.stores:,} "
            f"| {_count(x.largest_tuples)} ({_mib(x.largest_mib)}) | {_mib(x.mem_mean_mib)} "
            f"| {_mib(x.mem_max_mib)} | {x.mem_imbalance:.2f} | {x.size_traffic_imbalance:.2f} "
            f"| {x.zipf_traffic_imbalance:.2f} | {x.cold_start_max_s:,.0f} s "
            f"| {x.cold_start_all_s:,.0f} s, {_mib(x.all_mode_mib)} |")
    return "\n".join(out)


def _tuples(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tuples", default="10M,100M")
    ap.add_argument("--replicas", default="1,2,4,8,16")
    ap.add_argument("--dists", default="zipf,lognormal")
    ap.add_argument("--bytes-per-tuple", type=float, default=101.5)
    ap.add_argument("--load-seconds-per-million", type=float, default=3.9,
                    help="one store's load on first check (on-demand mode)")
    ap.add_argument("--snapshot-seconds-per-million", type=float, default=2.2,
                    help="the start-up snapshot of every store (all mode)")
    ap.add_argument("--base-mib", type=float, default=78.0)
    ap.add_argument("--stores-per-million", type=float, default=200.0)
    ap.add_argument("--zipf-s", type=float, default=1.1)
    ap.add_argument("--lognormal-sigma", type=float, default=2.0)
    ap.add_argument("--seed", default="24")
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    replicas = [int(x) for x in args.replicas.split(",")]
    rows: list[Row] = []
    for total in (_tuples(t) for t in args.tuples.split(",")):
        for dist in args.dists.split(","):
            if dist not in ("zipf", "lognormal"):
                ap.error(f"unknown distribution {dist!r}")
            rows += simulate(total, dist, replicas, args)
    print(f"inputs: {args.bytes_per_tuple} B/tuple, {args.load_seconds_per_million} s per "
          f"million on first check, {args.snapshot_seconds_per_million} s per million at "
          f"start (all mode), {args.base_mib:.0f} MiB per replica without stores, "
          f"{args.stores_per_million:.0f} stores per million tuples, Zipf s={args.zipf_s}, "
          f"lognormal sigma={args.lognormal_sigma}, seed {args.seed}, {POINTS_PER_SERVER} "
          f"points per server (crc32)\n")
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"inputs": vars(args), "rows": [asdict(r) for r in rows]}, f, indent=1)
    assert all(math.isfinite(r.mem_max_mib) for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
