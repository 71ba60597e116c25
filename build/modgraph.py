#!/usr/bin/env python3
# The import graph of a Rust source tree (default src/), by file, from
# `crate::` and `super::` paths outside tests and comments: prints the import
# cycles and the imports of items defined in lib.rs (docs/architecture.md).
#
#   python3 build/modgraph.py [src]
import glob
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else 'src'
files = [f for f in glob.glob(root + '/**/*.rs', recursive=True) if not f.endswith('main.rs')]
def modpath(f):
    p = os.path.relpath(f, root)[:-3].split('/')
    if p[-1] == 'mod': p = p[:-1]
    if p == ['lib']: p = []
    return tuple(p)
mods = {modpath(f): f for f in files}
def resolve(path):
    # longest prefix that is a module
    for i in range(len(path), -1, -1):
        if tuple(path[:i]) in mods: return tuple(path[:i])
    return ()
edges = {m: set() for m in mods}
upward = []
for m, f in mods.items():
    src = open(f).read()
    # strip tests module
    cut = src.find('#[cfg(test)]\nmod tests')
    if cut >= 0: src = src[:cut]
    src = '\n'.join(l for l in src.split('\n') if not l.strip().startswith('//'))
    for mt in re.finditer(r'\bcrate::((?:\w+::)*\w+)', src):
        t = resolve(mt.group(1).split('::'))
        if t == () and m != ():
            upward.append((f, mt.group(0)))
        elif t != m and not (len(t) < len(m) and m[:len(t)] == t and False):
            edges[m].add(t)
    base = m if f.endswith('mod.rs') or f.endswith('lib.rs') else m[:-1]
    for mt in re.finditer(r'\bsuper::((?:\w+::)*\w+)', src):
        parts = mt.group(1).split('::')
        t = resolve(list(m[:-1]) + parts)
        if t == () and m[:-1] == ():
            upward.append((f, mt.group(0)))
        elif t and t != m: edges[m].add(t)
    for mt in re.finditer(r'\bsuper::\{([^}]*)\}', src):
        for item in mt.group(1).split(','):
            item = item.strip().split('::')
            t = resolve(list(m[:-1]) + item)
            if t and t != m: edges[m].add(t)
    if f.endswith('mod.rs') or f.endswith('lib.rs'):
        for mt in re.finditer(r'(?<![\w:])(\w+)::', src):
            t = m + (mt.group(1),)
            if t in mods: edges[m].add(t)
# parent->child edges are fine; child->parent edges (mod.rs items) count
# Tarjan SCC
index = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in index: strong(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
for v in mods:
    if v not in index: strong(v)
cycles = [s for s in sccs if len(s) > 1]
print('cycles:', len(cycles))
for s in cycles: print('  ', sorted('::'.join(x) or 'lib' for x in s))
print('upward imports to lib.rs:', len(upward))
for f, u in upward: print('  ', f, u)
# The cache's two sides import its core, not each other
# (docs/architecture.md), but for the one exception named there: serving
# calls the reflector's upstream reads that prove a consistent read.
allowed = {(('cache', 'serve'), ('cache', 'ingest', 'reflector'))}
sides = [('cache', 'ingest'), ('cache', 'serve')]
across = []
for m in sorted(edges):
    for t in sorted(edges[m]):
        for a in sides:
            for b in sides:
                if a != b and m[:2] == a and t[:2] == b and (m, t) not in allowed:
                    across.append((m, t))
print('cache imports across sides:', len(across))
for m, t in across: print('  ', '::'.join(m), '->', '::'.join(t))
