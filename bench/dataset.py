"""Deterministic relationship-tuple dataset generator for authio benchmarks.

    python bench/dataset.py --scale small|medium|large [--out bench/data/<scale>] [--seed 1]

Writes three files into the output directory:

* ``tuples.jsonl`` - one ``{"object","relation","user"}`` per line, no duplicates.
* ``checks.jsonl`` - ``{"object","relation","user","allowed"}`` per line; ``allowed`` is
  computed by the independent reference evaluator in this module (BFS, see ``Graph.check``).
* ``meta.json``    - counts, allowed ratio, depth statistics and the check mix.

The same ``--scale`` and ``--seed`` always produce byte-identical files (only
``random.Random(seed)`` is used and every iteration order is deterministic).

Shape of the data
-----------------
* users ``user:<n>``; about 10 % belong to no group at all ("lonely" users, useful for
  denied checks that must walk a whole subgraph).
* groups ``group:<n>`` in six levels (0 = top).  Every group below level 0 has a primary
  parent one level up (``group:parent#member@group:child#member``), some have extra
  parents higher up, and a few close cycles (a child containing its parent or its
  grandparent).  Nesting is therefore up to 6 groups deep.
* direct memberships ``group:<n>#member@user:<m>`` (Zipf-like group popularity).
* folders ``folder:<n>`` with ``viewer``/``editor`` grants to users and to
  ``group:<n>#member`` usersets; sub-folders inherit from their parent folder via
  ``folder:child#viewer@folder:parent#viewer`` (up to 3 folder levels).
* documents ``document:<n>`` with ``owner``/``editor``/``viewer`` grants to users and to
  group usersets, ``document:n#viewer@folder:k#viewer`` (and sometimes ``#editor``) for
  the folder they live in (the engine has no tuple-to-userset, so the folder's viewers
  are granted as a userset), and for some documents the computed-relation emulation
  ``document:n#viewer@document:n#editor`` / ``document:n#editor@document:n#owner``.
  About 1 % of documents are shared with many groups (large subgraphs to walk).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from random import Random

import orjson

MAX_DEPTH = 25  # evaluator cap: the top node has depth 1
GROUP_LEVELS = 6
GROUP_LEVEL_FRACTIONS = (0.04, 0.08, 0.14, 0.20, 0.24, 0.30)
FOLDER_MAX_LEVEL = 3


@dataclass(frozen=True)
class Scale:
    users: int
    groups: int
    folders: int
    documents: int
    checks: int


SCALES: dict[str, Scale] = {
    "small": Scale(users=1_000, groups=130, folders=120, documents=1_400, checks=2_000),
    "medium": Scale(users=20_000, groups=2_600, folders=2_500, documents=28_000, checks=20_000),
    "large": Scale(
        users=100_000, groups=13_000, folders=12_500, documents=140_000, checks=50_000
    ),
}

# Share of the checks per outcome bucket (see ``bucket_of``).
CHECK_MIX: dict[str, float] = {
    "allowed_direct": 0.15,  # tuple exists (depth 1)
    "allowed_userset_d2": 0.12,  # one userset hop (depth 2)
    "allowed_d3": 0.08,  # two userset hops (depth 3)
    "allowed_deep": 0.10,  # depth >= 4 (nested groups, sub-folders, self-usersets)
    "allowed_userset_subject": 0.05,  # subject is itself a userset "group:n#member"
    "denied_small": 0.30,  # denied, small subgraph walked
    "denied_large": 0.20,  # denied after walking a large subgraph
}
LARGE_WALK = 25  # a denied check visiting at least this many nodes is "large"


class Graph:
    """Tuple store + reference evaluator.

    Nodes are ``"object#relation"`` strings, which is also the spelling of a userset
    subject, so expanding a userset is a dictionary lookup.
    """

    def __init__(self) -> None:
        self.objects: list[str] = []
        self.relations: list[str] = []
        self.users: list[str] = []
        self.pairs: set[tuple[str, str]] = set()  # (node, user) for every tuple
        self.usersets: dict[str, list[str]] = {}  # node -> userset subjects
        self.direct_users: dict[str, list[str]] = {}  # node -> plain user subjects
        self.lonely: list[str] = []  # users that belong to no group

    def __len__(self) -> int:
        return len(self.objects)

    def add(self, obj: str, rel: str, node: str, user: str) -> bool:
        key = (node, user)
        if key in self.pairs or user == node:
            return False
        self.pairs.add(key)
        self.objects.append(obj)
        self.relations.append(rel)
        self.users.append(user)
        if "#" in user:
            self.usersets.setdefault(node, []).append(user)
        else:
            self.direct_users.setdefault(node, []).append(user)
        return True

    def check(self, node: str, user: str) -> tuple[bool, int, int, int]:
        """Independent reference check.

        Allowed if ``(o, r, u)`` exists, or ``(o, r, "U#R")`` exists and ``U#R`` has ``u``
        recursively; ``u == "o#r"`` is allowed.  Breadth-first with a visited set; the
        top node has depth 1 and nodes deeper than ``MAX_DEPTH`` are not visited.

        Returns ``(allowed, depth_found, nodes_visited, max_depth_reached)``.
        """
        pairs = self.pairs
        usersets = self.usersets
        visited = {node}
        queue: deque[tuple[str, int]] = deque([(node, 1)])
        max_seen = 1
        while queue:
            cur, depth = queue.popleft()
            if depth > max_seen:
                max_seen = depth
            if cur == user or (cur, user) in pairs:
                return True, depth, len(visited), max_seen
            if depth >= MAX_DEPTH:
                continue
            for sub in usersets.get(cur, ()):
                if sub not in visited:
                    visited.add(sub)
                    queue.append((sub, depth + 1))
        return False, 0, len(visited), max_seen


def _zipf_cum_weights(n: int, rng: Random, exponent: float = 0.8) -> tuple[list[int], list[float]]:
    """A random permutation of range(n) and cumulative Zipf weights for it."""
    order = list(range(n))
    rng.shuffle(order)
    cum: list[float] = []
    total = 0.0
    for rank in range(n):
        total += 1.0 / (rank + 1) ** exponent
        cum.append(total)
    return order, cum


def generate(scale: Scale, seed: int) -> tuple[Graph, dict[str, int]]:
    rng = Random(seed)
    g = Graph()

    users = [f"user:{i}" for i in range(scale.users)]
    groups = [f"group:{i}" for i in range(scale.groups)]
    member = [f"{grp}#member" for grp in groups]

    # ---- group hierarchy ------------------------------------------------------------
    bounds: list[int] = [0]
    for frac in GROUP_LEVEL_FRACTIONS[:-1]:
        bounds.append(bounds[-1] + max(1, round(frac * scale.groups)))
    bounds.append(scale.groups)
    level_of = [0] * scale.groups
    for lvl in range(GROUP_LEVELS):
        for gi in range(bounds[lvl], bounds[lvl + 1]):
            level_of[gi] = lvl
    parent_of = [-1] * scale.groups
    for gi in range(bounds[1], scale.groups):
        lvl = level_of[gi]
        parent = rng.randrange(bounds[lvl - 1], bounds[lvl])
        parent_of[gi] = parent
        g.add(groups[parent], "member", member[parent], member[gi])
    for gi in range(bounds[2], scale.groups):
        if rng.random() < 0.08:  # extra parent, any level above
            extra = rng.randrange(0, bounds[level_of[gi]])
            g.add(groups[extra], "member", member[extra], member[gi])
    n_cycles = 0
    for gi in range(bounds[1], scale.groups):
        r = rng.random()
        if r < 0.01:  # 2-cycle: child contains its parent
            target = parent_of[gi]
        elif r < 0.013 and parent_of[parent_of[gi]] >= 0:  # 3-cycle via the grandparent
            target = parent_of[parent_of[gi]]
        else:
            continue
        if g.add(groups[gi], "member", member[gi], member[target]):
            n_cycles += 1

    # ---- direct memberships -----------------------------------------------------------
    # Leaf-heavy, Zipf-like popularity.
    g_order, g_cum = _zipf_cum_weights(scale.groups, rng)
    lonely: list[str] = []
    for ui, user in enumerate(users):
        k = rng.choices((0, 1, 2, 3, 4), weights=(10, 30, 30, 20, 10))[0]
        if k == 0:
            lonely.append(user)
            continue
        for pick in rng.choices(g_order, cum_weights=g_cum, k=k):
            # Deep groups get most direct members: move shallow picks down a level.
            gi = pick
            if level_of[gi] < 3 and ui % 3:
                gi = rng.randrange(bounds[level_of[gi] + 1], bounds[level_of[gi] + 2])
            g.add(groups[gi], "member", member[gi], user)

    # ---- folders ------------------------------------------------------------------------
    folders = [f"folder:{i}" for i in range(scale.folders)]
    f_viewer = [f"{f}#viewer" for f in folders]
    f_editor = [f"{f}#editor" for f in folders]
    f_level = [0] * scale.folders
    for fi in range(scale.folders):
        if fi > 10 and rng.random() < 0.35:
            parent = rng.randrange(0, fi)
            if f_level[parent] < FOLDER_MAX_LEVEL - 1:
                f_level[fi] = f_level[parent] + 1
                g.add(folders[fi], "viewer", f_viewer[fi], f_viewer[parent])
                g.add(folders[fi], "editor", f_editor[fi], f_editor[parent])
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            g.add(folders[fi], "viewer", f_viewer[fi], rng.choice(users))
        for _ in range(rng.choice((0, 1, 1, 2))):
            gi = rng.randrange(scale.groups)
            g.add(folders[fi], "viewer", f_viewer[fi], member[gi])
        if rng.random() < 0.5:
            g.add(folders[fi], "editor", f_editor[fi], rng.choice(users))
        if rng.random() < 0.3:
            gi = rng.randrange(scale.groups)
            g.add(folders[fi], "editor", f_editor[fi], member[gi])

    # ---- documents -----------------------------------------------------------------------
    u_order, u_cum = _zipf_cum_weights(scale.users, rng, exponent=0.6)
    for di in range(scale.documents):
        doc = f"document:{di}"
        owner, editor, viewer = f"{doc}#owner", f"{doc}#editor", f"{doc}#viewer"
        if di % 4 == 0:  # a quarter of the owners follow a skewed (Zipf) popularity
            g.add(doc, "owner", owner, users[rng.choices(u_order, cum_weights=u_cum)[0]])
        else:
            g.add(doc, "owner", owner, rng.choice(users))
        for _ in range(rng.choice((0, 0, 1, 1, 1, 2, 3))):
            g.add(doc, "viewer", viewer, rng.choice(users))
        for _ in range(rng.choice((0, 0, 0, 1, 1, 2))):
            g.add(doc, "editor", editor, rng.choice(users))
        r = rng.random()
        if r < 0.01:  # widely shared document, mostly with top-level groups
            for _ in range(rng.randint(5, 20)):
                gi = rng.randrange(bounds[2] if rng.random() < 0.7 else scale.groups)
                g.add(doc, "viewer", viewer, member[gi])
        elif r < 0.4:
            for _ in range(rng.choice((1, 1, 2))):
                g.add(doc, "viewer", viewer, member[rng.randrange(scale.groups)])
        if rng.random() < 0.15:
            g.add(doc, "editor", editor, member[rng.randrange(scale.groups)])
        if rng.random() < 0.8:
            fi = rng.randrange(scale.folders)
            g.add(doc, "viewer", viewer, f_viewer[fi])
            if rng.random() < 0.25:
                g.add(doc, "editor", editor, f_editor[fi])
        if rng.random() < 0.3:
            g.add(doc, "viewer", viewer, editor)
            g.add(doc, "editor", editor, owner)

    counts = {
        "users": scale.users,
        "lonely_users": len(lonely),
        "groups": scale.groups,
        "group_levels": GROUP_LEVELS,
        "group_cycle_edges": n_cycles,
        "folders": scale.folders,
        "documents": scale.documents,
    }
    g.lonely = lonely
    return g, counts


def bucket_of(allowed: bool, depth: int, visited: int, user: str) -> str:
    if allowed:
        if "#" in user:
            return "allowed_userset_subject"
        if depth == 1:
            return "allowed_direct"
        if depth == 2:
            return "allowed_userset_d2"
        if depth == 3:
            return "allowed_d3"
        return "allowed_deep"
    return "denied_large" if visited >= LARGE_WALK else "denied_small"


def make_checks(
    g: Graph, scale: Scale, seed: int
) -> tuple[list[tuple[str, str, str, bool]], dict[str, object]]:
    """Pick a deterministic, mixed set of checks and evaluate each with ``Graph.check``."""
    rng = Random(seed * 7919 + 17)
    n_tuples = len(g)
    quotas = {b: round(frac * scale.checks) for b, frac in CHECK_MIX.items()}
    quotas["denied_small"] += scale.checks - sum(quotas.values())
    buckets: dict[str, list[tuple[str, str, str, bool, int]]] = {b: [] for b in quotas}
    overflow: dict[str, list[tuple[str, str, str, bool, int]]] = {b: [] for b in quotas}
    seen: set[tuple[str, str]] = set()
    lonely = g.lonely
    users = [f"user:{i}" for i in range(scale.users)]
    rel_choices = {"document": ("viewer", "editor", "owner"), "folder": ("viewer", "editor"),
                   "group": ("member",)}

    # Objects with a big reachable subgraph, for the expensive denied checks.
    heavy: list[str] = []
    for node in sorted(g.usersets, key=lambda n: -len(g.usersets[n]))[:400]:
        heavy.append(node)

    def walk_down(node: str, max_steps: int, stop_at_userset: bool,
                  descend: float = 0.6) -> str | None:
        """Random walk from a userset node to a user (or a userset) below it."""
        cur = node
        for _ in range(max_steps):
            subs = g.usersets.get(cur, ())
            directs = g.direct_users.get(cur, ())
            if stop_at_userset and cur != node and rng.random() < 0.5:
                return cur
            if subs and (not directs or rng.random() < descend):
                cur = rng.choice(subs)
                continue
            if directs:
                return cur if stop_at_userset else rng.choice(directs)
            return None
        directs = g.direct_users.get(cur, ())
        if stop_at_userset:
            return cur if cur != node else None
        return rng.choice(directs) if directs else None

    def strategy(name: str) -> tuple[str, str, str] | None:
        if name == "allowed_direct":
            i = rng.randrange(n_tuples)
            u = g.users[i]
            return (g.objects[i], g.relations[i], u) if "#" not in u else None
        if name in ("allowed_userset_d2", "allowed_d3", "allowed_deep",
                    "allowed_userset_subject"):
            for _ in range(20):
                i = rng.randrange(n_tuples)
                if "#" in g.users[i]:
                    break
            else:
                return None
            steps = {"allowed_userset_d2": 1, "allowed_d3": 2}.get(name) or rng.randint(3, 9)
            target = walk_down(
                g.users[i], steps, stop_at_userset=name == "allowed_userset_subject",
                descend=0.9 if name == "allowed_deep" else 0.6,
            )
            return (g.objects[i], g.relations[i], target) if target else None
        if name == "denied_large":
            node = rng.choice(heavy) if rng.random() < 0.7 else None
            if node is None:
                i = rng.randrange(n_tuples)
                node = f"{g.objects[i]}#{g.relations[i]}"
            obj, _, rel = node.partition("#")
            user = rng.choice(lonely) if lonely and rng.random() < 0.7 else rng.choice(users)
            return obj, rel, user
        # denied_small: random object / relation / user
        kind = rng.choice(("document", "document", "document", "folder", "group"))
        count = {"document": scale.documents, "folder": scale.folders, "group": scale.groups}
        obj = f"{kind}:{rng.randrange(count[kind])}"
        return obj, rng.choice(rel_choices[kind]), rng.choice(users)

    names = list(quotas)
    max_attempts = scale.checks * 60
    attempts = 0
    max_visited = 0
    max_reached = 0
    while attempts < max_attempts:
        open_names = [n for n in names if len(buckets[n]) < quotas[n]]
        if not open_names:
            break
        name = open_names[attempts % len(open_names)]
        attempts += 1
        cand = strategy(name)
        if cand is None:
            continue
        obj, rel, user = cand
        key = (f"{obj}#{rel}", user)
        if key in seen:
            continue
        seen.add(key)
        allowed, depth, visited, reached = g.check(key[0], user)
        max_visited = max(max_visited, visited)
        max_reached = max(max_reached, reached)
        bucket = bucket_of(allowed, depth, visited, user)
        row = (obj, rel, user, allowed, depth)
        if len(buckets[bucket]) < quotas[bucket]:
            buckets[bucket].append(row)
        elif len(overflow[bucket]) < scale.checks:
            overflow[bucket].append(row)

    # Top up underfilled buckets from the overflow of the others (closest in kind first).
    missing = scale.checks - sum(len(b) for b in buckets.values())
    for name in ("denied_small", "allowed_direct", "allowed_d3", "allowed_userset_d2",
                 "allowed_deep", "denied_large", "allowed_userset_subject"):
        if missing <= 0:
            break
        take = overflow[name][:missing]
        buckets[name].extend(take)
        missing -= len(take)

    rows = [row for name in names for row in buckets[name]]
    rng.shuffle(rows)
    depth_hist: dict[str, int] = {}
    for row in rows:
        if row[3]:
            depth_hist[str(row[4])] = depth_hist.get(str(row[4]), 0) + 1
    n_allowed = sum(1 for r in rows if r[3])
    stats: dict[str, object] = {
        "checks": len(rows),
        "allowed": n_allowed,
        "denied": len(rows) - n_allowed,
        "allowed_ratio": round(n_allowed / len(rows), 4) if rows else 0.0,
        "mix": {name: len(buckets[name]) for name in names},
        "allowed_depth_histogram": dict(sorted(depth_hist.items(), key=lambda kv: int(kv[0]))),
        "max_depth": max((r[4] for r in rows), default=0),
        "max_depth_walked": max_reached,
        "max_nodes_visited": max_visited,
        "attempts": attempts,
    }
    return [(r[0], r[1], r[2], r[3]) for r in rows], stats


def write_outputs(out: Path, g: Graph, checks: list[tuple[str, str, str, bool]],
                  meta: dict[str, object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dumps = orjson.dumps
    with open(out / "tuples.jsonl", "wb") as fh:
        chunk: list[bytes] = []
        for o, r, u in zip(g.objects, g.relations, g.users, strict=True):
            chunk.append(dumps({"object": o, "relation": r, "user": u}))
            if len(chunk) >= 50_000:
                fh.write(b"\n".join(chunk) + b"\n")
                chunk.clear()
        if chunk:
            fh.write(b"\n".join(chunk) + b"\n")
    with open(out / "checks.jsonl", "wb") as fh:
        fh.write(b"".join(
            dumps({"object": o, "relation": r, "user": u, "allowed": a}) + b"\n"
            for o, r, u, a in checks
        ))
    (out / "meta.json").write_bytes(dumps(meta, option=orjson.OPT_INDENT_2) + b"\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default bench/data/<scale>)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checks", type=int, default=None,
                        help="number of checks (default depends on the scale)")
    args = parser.parse_args(argv)

    scale = SCALES[args.scale]
    if args.checks is not None:
        scale = Scale(scale.users, scale.groups, scale.folders, scale.documents, args.checks)
    out = args.out or Path(__file__).resolve().parent / "data" / args.scale

    t0 = time.perf_counter()
    g, counts = generate(scale, args.seed)
    t1 = time.perf_counter()
    checks, check_stats = make_checks(g, scale, args.seed)
    t2 = time.perf_counter()
    rel_counts: dict[str, int] = {}
    for o, r in zip(g.objects, g.relations, strict=True):
        key = f"{o.partition(':')[0]}#{r}"
        rel_counts[key] = rel_counts.get(key, 0) + 1
    userset_tuples = sum(len(v) for v in g.usersets.values())
    meta: dict[str, object] = {
        "scale": args.scale,
        "seed": args.seed,
        "tuples": len(g),
        "userset_tuples": userset_tuples,
        **counts,
        **check_stats,
        "max_group_nesting": GROUP_LEVELS,
        "evaluator_depth_cap": MAX_DEPTH,
        "tuples_by_type_relation": dict(sorted(rel_counts.items())),
    }
    write_outputs(out, g, checks, meta)
    t3 = time.perf_counter()
    print(
        f"{args.scale}: {len(g):,} tuples, {len(checks):,} checks "
        f"(allowed ratio {check_stats['allowed_ratio']}, max depth {check_stats['max_depth']}) "
        f"-> {out}\n"
        f"  generate {t1 - t0:.1f}s, checks {t2 - t1:.1f}s, write {t3 - t2:.1f}s, "
        f"total {t3 - t0:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
