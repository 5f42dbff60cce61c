#!/usr/bin/env python3
"""Fails when the files of a crate import each other in a cycle (issue 16).

Usage: .ci/check-import-cycles.py CRATE [CRATE ...]
       CRATE: a library's source folder (its root is `lib.rs`), or a crate
       root file (a binary's `main.rs`)
       (for example `.ci/check-import-cycles.py device/src cli/src/main.rs`)
       .ci/check-import-cycles.py --self-test
       (checks the checker on small crates written to a temporary folder:
       a cycle through `use crate::`, one through an inline `super::` path,
       a re-export through `lib.rs` that is no cycle, a cycle only in
       test code that does not count, `super::` inside an inline module
       (the file's own module, no cycle), a parent's bare path into its
       child with the child's `super::` (a cycle), a cycle through a
       `#[path]` module,
       a declared module without a file (an error), and a cycle in a
       binary crate checked from its `main.rs`)

A module declared with `mod x;` whose file cannot be found is an error:
its imports would go unchecked.

A file depends on another when it names an item of it: a `use crate::...`,
`use super::...` or `use self::...` tree, an inline `crate::a::b` /
`super::a` path in its code, or a bare path through one of its own child
modules (`report::Printer::new(..)` in the parent). Paths inside an inline
`mod x { ... }` block are relative to `x` (its `super::` is the file's own
module). A path is mapped to the deepest module file it
walks through (`crate::ring::cmd::CmdRing` -> `ring/cmd.rs`); when the item
it then names is a re-export of that module (`pub use cmd::CmdRing;` in
`ring/mod.rs`, or the crate root's `pub use`s in `lib.rs`), the re-export is
followed to the file that defines the item, so using the crate's facade is
not a dependency on every file behind it. A `mod x;` declaration is not a
dependency (a parent names its children; that is the tree's shape), but a
re-export is (the parent then depends on the child, never the reverse).

Test code is left out: files of modules declared under `#[cfg(test)]` and
inline `#[cfg(test)] mod ... { ... }` blocks (also `cfg(all(test, ...))`
and `cfg(loom)`). Comments (`//`, `//!`, `///`)
and string literals are ignored.

Prints every cycle found (as a chain of files) and exits 1; exits 0 with a
one-line summary when the files form a DAG.
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# `#[cfg(test)]`, `#[cfg(all(test, loom))]`, `#[cfg(loom)]`...: test-only code.
TEST_CFG = r"#\[cfg\((?:all\()?(?:test|loom)\b[^\]]*\)\]"


def strip_comments_and_strings(text):
    """Blanks out comments, string and char literals (keeps line breaks)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not re.match(r"\w", text[i - 1:i] or " "):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = '"' + hashes
            j = text.find(end, i + 2 + len(hashes))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or (
                c == "'" and re.match(r"'\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\})'", text[i:i + 12])):
            m = re.match(r"'(\\x[0-9a-fA-F]{2}|\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def remove_test_blocks(text):
    """Drops `#[cfg(test)] mod name { ... }` blocks (brace-matched)."""
    pattern = re.compile(TEST_CFG + r"\s*(pub(\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{")
    while True:
        m = pattern.search(text)
        if not m:
            return text
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        text = text[:m.start()] + "\n" * text.count("\n", m.start(), j) + text[j:]


def inline_modules(text):
    """`(start, end, name)` of each inline `mod name { ... }` block
    (brace-matched; nested blocks are listed too)."""
    spans = []
    for m in re.finditer(r"(?<![\w:])mod\s+(" + IDENT + r")\s*\{", text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        spans.append((m.end(), j, m.group(1)))
    return spans


def scope_at(spans, pos):
    """The inline modules (outermost first) that enclose `pos`."""
    return tuple(name for start, end, name in sorted(spans) if start <= pos < end)


class Crate:
    def __init__(self, src):
        # A folder is a library's `src/` (its root is `lib.rs`); a `.rs`
        # file is a crate root itself (a binary's `main.rs`).
        root = None
        if src.endswith(".rs"):
            root = os.path.normpath(src)
            src = os.path.dirname(src)
        self.src = os.path.normpath(src)
        self.files = {}  # module path tuple -> file path
        self.test_modules = set()
        self.texts = {}
        self.missing = []  # (declaring file, module name): no file found
        self._collect(("crate",), root or os.path.join(self.src, "lib.rs"), test=False)
        self.reexports = {mod: self._reexports(mod) for mod in self.files}

    def _collect(self, mod, path, test):
        if not os.path.exists(path):
            self.missing.append((path, "the crate root"))
            return
        self.files[mod] = path
        if test:
            self.test_modules.add(mod)
        raw = open(path, encoding="utf-8").read()
        # `#[path = "..."]` before a `mod x;`, read before the strings are
        # blanked out.
        path_attrs = {
            m.group(2): m.group(1)
            for m in re.finditer(
                r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+('
                + IDENT + r")\s*;", raw)
        }
        text = strip_comments_and_strings(raw)
        self.texts[mod] = text
        here = os.path.dirname(path)
        base = os.path.basename(path)
        is_root = mod == ("crate",)
        child_dir = here if is_root or base == "mod.rs" else os.path.join(here, base[:-3])
        for m in re.finditer(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
            attrs, name = m.group(1), m.group(2)
            candidates = [os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")]
            if "#[path" in attrs.replace(" ", "") and name in path_attrs:
                candidates = [os.path.join(here, path_attrs[name])]
            is_test = test or re.search(TEST_CFG, attrs) is not None
            if not any(os.path.exists(c) for c in candidates):
                self.missing.append((path, name))
            for cand in candidates:
                if os.path.exists(cand):
                    self._collect(mod + (name,), cand, is_test)
                    break

    def code(self, mod):
        return remove_test_blocks(self.texts[mod])

    def _reexports(self, mod):
        """name -> absolute path (tuple) of each `pub use` / `pub(crate) use`."""
        out = {}
        text = self.code(mod)
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
            for path, alias in expand_use_tree(m.group(1)):
                if path and path[-1] not in ("*", "self"):
                    absolute = self.absolute(mod, path)
                    if absolute:
                        out[alias or path[-1]] = absolute
        return out

    def absolute(self, mod, path):
        """A use path (tuple) made absolute from inside module `mod`."""
        path = list(path)
        if path[0] == "crate":
            return tuple(path)
        if path[0] in ("super", "self"):
            base = list(mod)
            while path and path[0] in ("super", "self"):
                if path.pop(0) == "super":
                    base.pop()
            return tuple(base + path)
        # A bare path: a child module (`use cmd::X` in 2018 edition uses
        # names in scope, which for a mod.rs are its children).
        if tuple(mod) + (path[0],) in self.files:
            return tuple(mod) + tuple(path)
        return None  # an external crate or std

    def resolve(self, path, depth=0):
        """The module file (module path tuple) that defines what `path` names."""
        best, i = ("crate",), 1
        while i < len(path) and best + (path[i],) in self.files:
            best = best + (path[i],)
            i += 1
        if i < len(path) and depth < 16:
            target = self.reexports.get(best, {}).get(path[i])
            if target is not None:
                return self.resolve(target + tuple(path[i + 1:]), depth + 1)
        return best

    def edges(self, mod):
        text = self.code(mod)
        # A path inside an inline `mod x { ... }` is relative to `x` (its
        # `super::` is this file's module); what it names is still looked
        # up among the files.
        spans = inline_modules(text)
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            scope = scope_at(spans, m.start())
            paths += [(scope, p) for p, _ in expand_use_tree(m.group(1))]
        # Inline paths; `use` lines were matched above, the regex finds them
        # again, which is harmless.
        for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::" + IDENT + r")+)", text):
            paths.append((scope_at(spans, m.start()), tuple(m.group(1).split("::"))))
        # A bare path through a child module (`report::Printer::new(..)`
        # in the parent's code) uses that child.
        children = [k[-1] for k in self.files if k[:-1] == mod]
        if children:
            alt = "|".join(re.escape(c) for c in children)
            for m in re.finditer(r"(?<![\w:])((?:" + alt + r")(?:::" + IDENT + r")+)", text):
                if not scope_at(spans, m.start()):
                    paths.append(((), tuple(m.group(1).split("::"))))
        deps = set()
        for scope, p in paths:
            if p[-1] == "*":
                p = p[:-1]
            if p and p[-1] == "self":
                p = p[:-1]
            absolute = self.absolute(mod + scope, p) if p else None
            if absolute is None:
                continue
            target = self.resolve(absolute)
            if target != mod and target not in self.test_modules:
                deps.add(target)
        return deps


def expand_use_tree(tree):
    """`a::{b, c::{d as e}}` -> [(('a','b'), None), (('a','c','d'), 'e')]."""
    tree = re.sub(r"\s+as\s+", " as ", tree.strip())
    tree = re.sub(r"\s*(::|,|\{|\})\s*", r"\1", tree)
    out = []

    def walk(prefix, s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        parts.append(cur)
        for part in filter(None, parts):
            brace = part.find("{")
            if brace >= 0:
                head = [x for x in part[:brace].split("::") if x]
                walk(prefix + head, part[brace + 1:part.rfind("}")])
            else:
                part, _, alias = part.partition(" as ")
                segs = [x for x in part.split("::") if x]
                out.append((tuple(prefix + segs), alias or None))

    walk([], tree.lstrip(":"))
    return out


def find_cycles(graph):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

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
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sccs


def a_cycle(graph, scc):
    """One concrete cycle through the component's first file (BFS)."""
    members = set(scc)
    start = scc[0]
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                chain = [v]
                while prev[chain[-1]] is not None:
                    chain.append(prev[chain[-1]])
                return [start] + chain[::-1][1:] + [start] if len(chain) > 1 else [start, v, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return scc


def check(src):
    """Prints the crate's cycles and its declared modules without a file;
    returns how many strongly connected components with more than one
    file it has, and how many module files are missing."""
    crate = Crate(src)
    for where, name in crate.missing:
        print(f"{src}: no file found for module `{name}` declared in {where} (not checked)")
    mods = [m for m in crate.files if m not in crate.test_modules]
    graph = {m: crate.edges(m) for m in mods}
    name = lambda m: os.path.relpath(crate.files[m], os.path.dirname(crate.src))
    sccs = find_cycles(graph)
    if not sccs:
        n_edges = sum(len(d) for d in graph.values())
        print(f"{src}: no import cycle ({len(mods)} files, {n_edges} dependencies)")
    for scc in sccs:
        print(f"{src}: import cycle between {len(scc)} files: {', '.join(name(m) for m in scc)}")
        print("  for example: " + " -> ".join(name(m) for m in a_cycle(graph, scc)))
        for m in scc:
            inside = sorted(name(d) for d in graph[m] if d in scc)
            print(f"    {name(m)} uses {', '.join(inside)}")
    return len(sccs), len(crate.missing)


SELF_TESTS = [
    # (name, files, (cycles, missing module files) expected)
    ("use crate:: cycle", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::b::B;\npub struct A(B);\n",
        "b.rs": "use crate::a::A;\npub struct B(Option<Box<A>>);\n",
    }, (1, 0)),
    ("child uses its parent inline", {
        "lib.rs": "mod ring;\n",
        "ring/mod.rs": "mod cmd;\npub use cmd::Cmd;\npub struct Ring;\n",
        "ring/cmd.rs": "pub struct Cmd(super::Ring);\n",
    }, (1, 0)),
    ("re-exports are followed, no cycle", {
        "lib.rs": "mod a;\nmod b;\npub use a::A;\npub use b::B;\n",
        "a.rs": "// use crate::B; (a comment)\npub struct A;\nconst S: &str = \"crate::B\";\n",
        "b.rs": "use crate::A;\npub struct B(A);\n",
    }, (0, 0)),
    ("a cycle in test code only", {
        "lib.rs": "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\n",
        "a.rs": "pub struct A;\n#[cfg(all(test, not(loom)))]\nmod t {\n    use crate::b::B;\n}\n",
        "b.rs": "use crate::a::A;\npub struct B(A);\n",
        "tests.rs": "use crate::a::A;\nuse crate::b::B;\n",
    }, (0, 0)),
    ("a parent's bare path into its child, and the child's super::", {
        "lib.rs": "mod bench;\n",
        "bench/mod.rs": "mod report;\npub struct Job;\npub fn run() { report::print(&Job); }\n",
        "bench/report.rs": "pub fn print(_: &super::Job) {}\n",
    }, (1, 0)),
    ("a #[path] module is followed", {
        "lib.rs": "#[path = \"support.rs\"]\npub mod __support;\npub struct A;\npub use __support::B;\n",
        "support.rs": "pub struct B(Option<Box<crate::A>>);\npub fn a() -> crate::A { crate::A }\n",
    }, (1, 0)),
    ("super:: inside an inline module is the file's own module", {
        "lib.rs": "mod bench;\n",
        "bench/mod.rs": "mod peers;\nmod stats;\npub use peers::Peer;\npub struct Job;\n",
        # Old reading: `super::Buf` (peers.rs's own) named bench/mod.rs,
        # which re-exports peers: a cycle that is not there.
        "bench/peers.rs": "pub struct Peer;\npub struct Buf;\nmod imp {\n    use super::Buf;\n"
                          "    use super::super::stats::Stats;\n    pub fn f(_: Buf, _: Stats) {}\n}\n",
        "bench/stats.rs": "pub struct Stats;\n",
    }, (0, 0)),
    ("a declared module without a file", {
        "lib.rs": "mod gone;\n",
    }, (0, 1)),
    ("a binary crate (main.rs) with a cycle", {
        "main.rs": "mod bench;\nfn main() {}\n",
        "bench/mod.rs": "mod stats;\nuse self::stats::Stats;\npub struct Job(Stats);\n",
        "bench/stats.rs": "pub struct Stats(Option<Box<super::Job>>);\n",
    }, (1, 0)),
]


def self_test():
    import tempfile
    failed = 0
    for name, files, want in SELF_TESTS:
        with tempfile.TemporaryDirectory() as root:
            for path, text in files.items():
                full = os.path.join(root, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w", encoding="utf-8") as f:
                    f.write(text)
            # A crate without lib.rs is checked from its main.rs.
            is_bin = "lib.rs" not in files
            got = check(os.path.join(root, "main.rs") if is_bin else root)
        ok = got == want
        failed += not ok
        print(f"self-test {'ok' if ok else 'FAILED'}: {name} "
              f"({got[0]} cycle(s) and {got[1]} missing file(s), expected {want[0]} and {want[1]})")
    return 1 if failed else 0


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    if argv[1] == "--self-test":
        return self_test()
    failed = False
    for src in argv[1:]:
        failed |= sum(check(src)) > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
