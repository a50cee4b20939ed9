#!/usr/bin/env python3
"""callgraph.py — the file-level call graph of allocator/*.c, from the
objects of the core library: an object that leaves a symbol undefined calls
the object that defines it. Fails (exit 1) if the graph has a cycle, naming
it: no two files of allocator/ may call into each other, directly or around
a loop.

Usage: callgraph.py [--print] OBJDIR   (e.g. build/allocator/libvpmm_core.a.p)
"""
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(['nm', '-P', obj], check=True, capture_output=True,
                         text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, kind = f[0], f[1]
        if kind == 'U':
            undefined.add(name)
        elif kind.isupper():  # a global definition (T, D, B, R, W, V, C...)
            defined.add(name)
    return defined, undefined


def cycle(graph):
    """A cycle as a list of nodes, or None (iterative DFS, three colours)."""
    colour = {n: 0 for n in graph}
    for root in sorted(graph):
        if colour[root]:
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        colour[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[nxt] == 1:
                return path[path.index(nxt):] + [nxt]
            elif colour[nxt] == 0:
                colour[nxt] = 1
                stack.append((nxt, iter(sorted(graph[nxt]))))
                path.append(nxt)
    return None


def main(argv):
    show = '--print' in argv
    args = [a for a in argv if a != '--print']
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    objdir = args[0]
    objs = sorted(f for f in os.listdir(objdir) if f.endswith('.o'))
    if not objs:
        print(f'callgraph: no objects in {objdir}', file=sys.stderr)
        return 2
    name = {o: o[:-2] for o in objs}  # pool.c.o -> pool.c
    defs, undefs, owner = {}, {}, {}
    for o in objs:
        defs[o], undefs[o] = symbols(os.path.join(objdir, o))
        for s in defs[o]:
            owner[s] = o
    graph = {name[o]: set() for o in objs}
    for o in objs:
        for s in undefs[o]:
            d = owner.get(s)
            if d and d != o:
                graph[name[o]].add(name[d])
    if show:
        for n in sorted(graph):
            print(f'{n}: {" ".join(sorted(graph[n]))}')
    c = cycle(graph)
    if c:
        print('callgraph: cycle among allocator/ files: ' + ' -> '.join(c),
              file=sys.stderr)
        return 1
    print(f'callgraph: {len(graph)} files, no cycle')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
