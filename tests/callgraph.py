#!/usr/bin/python3
# callgraph.py: the object files of a build call no one another in a loop.
#
# doc/design.md says a module of the engine calls only those below it and
# that the daemon's files form no loop either. This reads what the linker
# reads: for each object file, the global symbols it defines and those it
# needs (nm), and draws an edge a.o -> b.o when a.o needs a symbol b.o
# defines (a call, or the address of a function or datum taken: a callback
# handed over counts as a call where its address is taken). A cycle is a
# strongly connected set of two or more files; each is printed with one edge
# path around it, so the message names the calls to cut.
#
#   tests/callgraph.py --list                  the test names
#   tests/callgraph.py [--print] BUILD [NAME...]
#       runs the tests (the verdict lines of tests/run.sh); --print writes
#       every cycle of every group, and each group's edges with -v
import os
import subprocess
import sys

GROUPS = [
    # (test name, description, directory under the build, recursive)
    ("callgraph_engine_no_cycle", "build/src/*.o", "src", False),
    ("callgraph_daemon_no_cycle", "build/daemon/**/*.o", "daemon", True),
]


def objects(build, sub, recursive):
    """The group's object files whose source is in the tree (KVC_SRCDIR, or
    here): a stale object of a file moved or removed is not counted."""
    root = os.path.join(build, sub)
    srcdir = os.environ.get("KVC_SRCDIR", ".")
    out = []
    if not os.path.isdir(root):
        return out
    if recursive:
        for d, _, files in os.walk(root):
            out += [os.path.join(d, f) for f in files if f.endswith(".o")]
    else:
        out = [os.path.join(root, f) for f in os.listdir(root) if f.endswith(".o")]
    out = [o for o in out
           if os.path.exists(os.path.join(srcdir, sub, os.path.relpath(o, root)[:-2] + ".c"))]
    return sorted(out)


def nm(path, flag):
    r = subprocess.run(["nm", "-P", flag, path], capture_output=True, text=True, check=True)
    syms = set()
    for line in r.stdout.splitlines():
        w = line.split()
        if len(w) >= 2:
            syms.add(w[0])
    return syms


def graph(build, sub, recursive):
    objs = objects(build, sub, recursive)
    root = os.path.join(build, sub)
    name = {o: os.path.relpath(o, root) for o in objs}
    owner = {}
    for o in objs:
        for s in nm(o, "--defined-only"):
            owner.setdefault(s, o)
    edges = {name[o]: {} for o in objs}
    for o in objs:
        for s in nm(o, "--undefined-only"):
            t = owner.get(s)
            if t is not None and t != o:
                edges[name[o]].setdefault(name[t], []).append(s)
    return edges


def sccs(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def loop_path(edges, comp):
    """One cycle through the component's first file, as edges with a symbol each."""
    members = set(comp)
    start = comp[0]
    # breadth-first from start back to start, inside the component
    prev = {}
    frontier = [start]
    seen = set()
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [(v, w)]
                    while v != start:
                        path.append((prev[v], v)); v = prev[v]
                    return list(reversed(path))
                if w not in seen:
                    seen.add(w); prev[w] = v; nxt.append(w)
        frontier = nxt
    return []


def describe(edges, comp):
    lines = ["cycle of %d: %s" % (len(comp), " ".join(comp))]
    for a, b in loop_path(edges, comp):
        lines.append("  %s -> %s (%s)" % (a, b, ", ".join(sorted(edges[a][b])[:3])))
    return lines


def main(argv):
    if argv and argv[0] == "--list":
        for g in GROUPS:
            print(g[0])
        return 0
    show = False
    verbose = False
    while argv and argv[0] in ("--print", "-v"):
        if argv[0] == "--print":
            show = True
        else:
            verbose = True
        argv = argv[1:]
    if not argv:
        print("usage: tests/callgraph.py [--print] BUILD [NAME...]", file=sys.stderr)
        return 2
    build, names = argv[0], argv[1:]
    known = [g[0] for g in GROUPS]
    for n in names:
        if n not in known:
            print("no test named %s" % n, file=sys.stderr)
            return 1
    rc = 0
    for test, what, sub, rec in GROUPS:
        if names and test not in names:
            continue
        edges = graph(build, sub, rec)
        if not edges:
            print("FAIL %s no object files in %s" % (test, os.path.join(build, sub)))
            rc = 1
            continue
        comps = sccs(edges)
        if show:
            print("%s: %d files, %d edges, %d cycles" %
                  (what, len(edges), sum(len(e) for e in edges.values()), len(comps)))
            for c in comps:
                for line in describe(edges, c):
                    print("  " + line)
            if verbose:
                for a in sorted(edges):
                    for b in sorted(edges[a]):
                        print("    %s -> %s" % (a, b))
            continue
        if comps:
            for c in comps:
                for line in describe(edges, c):
                    print(line, file=sys.stderr)
            print("FAIL %s %d call cycles among %s (first: %s)" %
                  (test, len(comps), what, " ".join(comps[0])))
            rc = 1
        else:
            print("PASS %s" % test)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
