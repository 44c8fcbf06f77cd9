#!/usr/bin/env python3
"""Lists the files of daemon/ that call each other, from a build's object files.

A file A calls B when A's object uses a symbol B's object defines (nm). A pair that calls both ways
is a circle (docs/architecture.md: calls go one way); larger circles are printed as the groups of
files that reach each other. Reads objects only: build first.

usage: scripts/call-circles.py BUILD_DIR [FOLDER ...]   (folders of BUILD_DIR; default: daemon)
"""
import glob
import os
import subprocess
import sys


def objects(build, folders):
    for folder in folders:
        yield from glob.glob(os.path.join(build, folder, "**", "*.c.o"), recursive=True)


def source_name(obj):
    # .../CMakeFiles/servd_http.dir/api/api.c.o -> api/api.c
    return "/".join(obj[: -len(".o")].split("/")[-2:])


def graph(objs):
    defs, uses = {}, {}
    for o in objs:
        name = source_name(o)
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBR":
                defs[f[2]] = name
            elif len(f) == 2 and f[0] == "U":
                uses.setdefault(name, set()).add(f[1])
    edges = {}
    for a, syms in uses.items():
        for sym in syms:
            b = defs.get(sym)
            if b and b != a:
                edges.setdefault(a, {}).setdefault(b, set()).add(sym)
    return edges


def groups(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    objs = list(objects(sys.argv[1], sys.argv[2:] or ["daemon"]))
    if not objs:
        sys.exit(f"no object files under {sys.argv[1]}: build first")
    edges = graph(objs)
    pairs = sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, {}))
    for a, b in pairs:
        print(f"{a} <-> {b}: {', '.join(sorted(edges[a][b]))} | {', '.join(sorted(edges[b][a]))}")
    for g in groups(edges):
        print("files that reach each other: " + ", ".join(g))
    print(f"{len(pairs)} pairs calling each other among {len(objs)} files")


if __name__ == "__main__":
    main()
