#!/usr/bin/env python3
"""Checks the crate's import graph: every arrow points down the layers, and no cycle.

usage: hack/layers.py [--graph] [SRC_DIR]

Reads every `.rs` file under `src/` (code only: comments and string literals are dropped, so
intra-doc links and messages do not count; `#[cfg(test)]` modules do count) and collects each
reference to another module of the crate: `use crate::x::...`, `crate::x::...` paths anywhere
in the code, `crate::{x, y}` groups and `super::...` paths. A binary's files (`src/bin/`) are
the top layer and their `crate::`/`super::` paths name the binary's own items: skipped.

Two graphs are checked:

1. Top-level modules (`src/x.rs` or `src/x/`): each edge must go to a strictly lower layer of
   LAYERS below (so there is no cycle either). A module missing from LAYERS is an error.
2. Inside each directory module (`src/lifecycle/`, `src/store/`, ...): the files (submodules)
   must not form a cycle. `mod.rs` is a node (`mod`) for the items it defines itself; its
   `pub use` re-exports are no dependency, and a reference to a re-exported name counts as one
   to the submodule that defines it.

Exit status 0 when both hold; otherwise every offending edge and cycle is printed and the
status is 1. `--graph` also prints both graphs.
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

# Lowest first. A module may use only modules of lower layers.
LAYERS = [
    # The API types (the CRD's spec, status, states, schema and validation) and leaf
    # utilities: no import of the crate.
    ["api", "process", "telemetry"],
    # Every default.
    ["defaults"],
    # What a job needs, where it may run, what a queue may use (pure, over the API's types).
    ["resources"],
    # Pure rules (the job record and every decision over it; the caps' formula) and the state
    # dir's paths.
    ["lifecycle", "capacity", "queues", "state_dir"],
    # Who a scheduling pass preempts, over the queues' policies, and how a burst of arriving
    # jobs is paced (pure decisions; the pacer's lock and token bucket beside them).
    ["preemption", "pacing", "admission"],
    # Persistence only (SQL); wake-ups between processes.
    ["store", "wake"],
    # What runs workloads; what is derived from the store for the outside world.
    ["executor", "scheduler", "status", "events", "metrics"],
    # The processes that carry decisions out.
    ["engine", "job_controller"],
    # What users see of the engine's store: the visibility API and dashboard.
    ["visibility"],
    # The Kubernetes side; the chart's smoke test.
    ["operator", "smoke_test"],
    # The command line.
    ["cli"],
    # The binaries.
    ["main", "bin"],
]

LAYER = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def strip(code: str) -> str:
    """Drops comments, string and char literals (keeps line structure roughly)."""
    out = []
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if code.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif code.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', code[i:i + 10]) and not (
            i > 0 and (code[i - 1].isalnum() or code[i - 1] == "_")
        ):
            hashes = re.match(r'r(#*)"', code[i:]).group(1)
            end = code.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and code[i] != '"':
                i += 2 if code[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", code[i:i + 4]):
            m = re.match(r"'(\\[^']*|[^\\'])'", code[i:])
            i += len(m.group(0)) if m else 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_path(src: Path, f: Path) -> list:
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts == ["lib"]:
        return []
    if parts[0] == "bin":
        return ["bin"]
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


PATH = re.compile(r"\b(crate|super)((?:::\w+)+|::\{)")
GROUP = re.compile(r"\b(crate|(?:super::)*super)::\{([^}]*)\}")


INLINE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{", re.M)


def references(code: str, here: list):
    """Absolute module paths (lists) referenced by `code` of module `here`. Code after an
    inline module (`mod tests {`, at the end of a file) is one level deeper, for `super`."""
    inline = INLINE.search(code)
    if inline:
        return references(code[: inline.start()], here) + references(
            code[inline.end():], here + [inline.group(1)]
        )
    refs = []
    for m in GROUP.finditer(code):
        if m.group(1) == "crate":
            base = []
        else:
            base = here[: len(here) - m.group(1).count("super")]
        for item in m.group(2).split(","):
            parts = [p.split(" ")[0] for p in item.strip().split("::") if p]
            if parts and parts[0] != "self":
                refs.append(base + parts)
    for m in PATH.finditer(code):
        if m.group(2) == "::{":
            continue
        parts = [p for p in m.group(2).split("::") if p]
        if m.group(1) == "crate":
            refs.append(parts)
        else:
            base = here[:-1]
            while parts and parts[0] == "super":
                base, parts = base[:-1], parts[1:]
            refs.append(base + parts)
    return refs


def reexports(mod_rs: str) -> dict:
    """Names a directory module's mod.rs re-exports, by the submodule that defines them."""
    names = {}
    for m in re.finditer(r"pub use (\w+)::(\{[^}]*\}|\w+)\s*;", mod_rs):
        sub, items = m.group(1), m.group(2).strip("{}")
        for item in items.split(","):
            item = item.strip()
            if not item:
                continue
            if " as " in item:
                item = item.split(" as ")[1]
            names[item.split("::")[-1]] = sub
    return names


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show = "--graph" in sys.argv
    src = Path(args[0] if args else Path(__file__).resolve().parent.parent / "src")
    files = sorted(src.rglob("*.rs"))
    top = defaultdict(set)  # module -> modules it uses
    inner = defaultdict(lambda: defaultdict(set))  # dir module -> sub -> subs
    problems = []
    texts = {f: strip(f.read_text()) for f in files}
    dirs = {f.parent.name: f for f in files if f.name == "mod.rs" and f.parent.parent == src}
    exported = {name: reexports(texts[f]) for name, f in dirs.items()}
    submodules = defaultdict(set)
    for f in files:
        path = module_path(src, f)
        if len(path) >= 2 and path[0] in dirs:
            submodules[path[0]].add(path[1])
    for f in files:
        path = module_path(src, f)
        if not path:
            continue
        me = path[0]
        if me == "bin":
            # A binary's `crate::` and `super::` paths name its own items (its modules, such
            # as src/bin/bench/*.rs); it reaches the library as `managed_jobs::`.
            continue
        refs = references(texts[f], path)
        if f.name == "mod.rs" and len(path) == 1 and me in dirs:
            # Code of mod.rs itself: bare paths into its submodules (declarations and
            # re-exports are no dependency).
            code = re.sub(r"\bpub(\([^)]*\))? use [^;]*;|\b(pub(\([^)]*\))? )?mod \w+\s*;", "", texts[f])
            for sub in submodules[me]:
                if re.search(rf"(?<![\w:]){sub}::", code):
                    inner[me]["mod"].add(sub)
        for ref in references(texts[f], path):
            if not ref:
                continue
            target = ref[0]
            if target != me:
                top[me].add(target)
                continue
            # Inside a directory module: which of its submodules?
            if me not in dirs or len(path) < 2:
                continue
            sub = path[1]
            if len(ref) < 2:
                continue
            name = ref[1]
            if name in submodules[me]:
                dest = name
            elif name in exported[me]:
                dest = exported[me][name]
            else:
                dest = "mod"
            if dest != sub:
                inner[me][sub].add(dest)
    # 1. Layers.
    for a, bs in sorted(top.items()):
        if a not in LAYER:
            problems.append(f"module {a} is in no layer (hack/layers.py LAYERS)")
            continue
        for b in sorted(bs):
            if b not in LAYER:
                problems.append(f"module {b} (used by {a}) is in no layer")
            elif LAYER[b] >= LAYER[a]:
                problems.append(
                    f"{a} (layer {LAYER[a]}) uses {b} (layer {LAYER[b]}): an arrow that does not point down"
                )
    # 2. No cycle inside a directory module.
    for me, graph in sorted(inner.items()):
        for cycle in cycles(graph):
            problems.append(f"cycle inside {me}: {' -> '.join(cycle)}")
    if show:
        print("modules (layer: module -> what it uses):")
        for layer, mods in enumerate(LAYERS):
            for m in mods:
                print(f"  {layer}: {m} -> {', '.join(sorted(top.get(m, ()))) or '-'}")
        for me, graph in sorted(inner.items()):
            print(f"inside {me}:")
            for s in sorted(submodules[me] | {"mod"}):
                print(f"  {s} -> {', '.join(sorted(graph.get(s, ()))) or '-'}")
    for p in problems:
        print(p)
    if not problems:
        edges = sum(len(v) for v in top.values())
        modules = set(top) | {b for bs in top.values() for b in bs}
        inner_edges = sum(len(d) for g in inner.values() for d in g.values())
        print(
            f"ok: {edges} edges between {len(modules)} modules all point down {len(LAYERS)} layers; "
            f"no cycle among the files of {', '.join(sorted(dirs))} ({inner_edges} edges)"
        )
    return 1 if problems else 0


def cycles(graph):
    """The cycles of `graph` (one per strongly connected component of 2+ nodes or a self loop)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(comp) + [sorted(comp)[0]])

    nodes = set(graph) | {w for ws in graph.values() for w in ws}
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    sys.exit(main())
