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
# A third test holds doc/design.md to it: its "Engine modules" and "Daemon
# modules" graphs put each file of src/ and daemon/ in a row, and a file may
# call only files of lower rows. It fails when a file is missing from its
# graph or named twice, when a named file does not exist, when a call of
# the build goes sideways or up (so a new cycle fails it too), and when a
# heading appears twice (the placeholder the map once had).
#
#   tests/callgraph.py --list                  the test names
#   tests/callgraph.py [--print] BUILD [NAME...]
#       runs the tests (the verdict lines of tests/run.sh); --print writes
#       every cycle of every group, and each group's edges with -v
import os
import subprocess
import sys

import re

DESIGN_TEST = "callgraph_design_md_module_graphs_are_the_builds"
DOC_GRAPHS = [
    # (heading, group directory, recursive)
    ("## Engine modules", "src", False),
    ("## Daemon modules", "daemon", True),
]

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


def doc_rows(text, heading):
    """The rows of the graph under heading: file (as in the build group,
    without .c) -> row number, and the problems found reading it."""
    problems = []
    n = text.count("\n" + heading + "\n")
    if n != 1:
        problems.append("%r is a heading %d times" % (heading, n))
        if n == 0:
            return {}, problems
    body = text.split("\n" + heading + "\n", 1)[1]
    m = re.search(r"^```\n(.*?)^```", body, re.S | re.M)
    if not m:
        return {}, problems + ["no graph under %r" % heading]
    rows, row = {}, None
    for line in m.group(1).splitlines():
        lm = re.match(r"^\s*(\d+)\s\s", line)
        if lm:
            row = int(lm.group(1))
            line = line[lm.end():]
        for f in re.findall(r"(?<![\w/.-])([a-z0-9_]+(?:/[a-z0-9_]+)*)\.c\b", line):
            if row is None:
                problems.append("%s.c before the first row" % f)
            elif f in rows:
                problems.append("%s.c is named twice" % f)
            else:
                rows[f] = row
    return rows, problems


def design_test(build):
    srcdir = os.environ.get("KVC_SRCDIR", ".")
    path = os.path.join(srcdir, "doc", "design.md")
    try:
        text = open(path).read()
    except OSError as e:
        print("FAIL %s %s" % (DESIGN_TEST, e))
        return 1
    problems = []
    for heading, sub, rec in DOC_GRAPHS:
        rows, p = doc_rows(text, heading)
        problems += p
        edges = graph(build, sub, rec)
        have = {e[:-2] for e in edges}
        for f in sorted(set(rows) - have):
            problems.append("%s names %s/%s.c, which the build has not" % (heading, sub, f))
        for f in sorted(have - set(rows)):
            problems.append("%s does not name %s/%s.c" % (heading, sub, f))
        for a in sorted(edges):
            for b in sorted(edges[a]):
                ra, rb = rows.get(a[:-2]), rows.get(b[:-2])
                if ra is not None and rb is not None and ra <= rb:
                    problems.append("%s/%s (row %d) calls %s/%s (row %d: not below it): %s" %
                                    (sub, a, ra, sub, b, rb, ", ".join(sorted(edges[a][b])[:3])))
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        print("FAIL %s %d problems (first: %s)" % (DESIGN_TEST, len(problems), problems[0]))
        return 1
    print("PASS %s" % DESIGN_TEST)
    return 0


def main(argv):
    if argv and argv[0] == "--list":
        for g in GROUPS:
            print(g[0])
        print(DESIGN_TEST)
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
    known = [g[0] for g in GROUPS] + [DESIGN_TEST]
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
    if not show and (not names or DESIGN_TEST in names):
        rc |= design_test(build)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
