#!/usr/bin/env python3
"""Checks that every file, module and type the design map names exists.

Usage: book/tools/check-design-map.py [PAGE.md ...]
(default: book/src/design.md and book/src/internals.md, from the repository
root).

What it checks, in each page's `inline code` and text-block code:
- repository paths (`engine/src/flush.rs`, `device/src/ring/`): exist;
- Rust paths that start with a crate folder (`engine::plug::Plug`,
  `device::ring::Ring::push_direct`, `executor::coop::poll_proceed`): the
  modules exist as files (`X/src/a.rs` or `X/src/a/mod.rs`); the first item
  after them is defined in that crate and named in the module's files (so
  a re-export counts); any further segment (a method, variant or field) is
  defined in that crate;
- `Type::member` and bare `Type` names (CamelCase): the type is defined in
  the workspace (struct, enum, trait, type alias or union; a bare name may
  be an enum variant), and the member is a `fn`, variant or field of the
  workspace; names from std, the io_uring
  vocabulary and the kernel are listed in ALLOWED.

It is a grep, not a resolver: it proves the names exist, not that each
sentence is true. Exits 1 listing what it did not find.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRATES = {
    "executor": ROOT / "executor/src",
    "device": ROOT / "device/src",
    "engine": ROOT / "engine/src",
    "plugio": ROOT / "src",
}
REPO_DIRS = ("executor/", "device/", "engine/", "src/", "book/", "benches/",
             "tests/", "examples/", "docs/", ".ci/")
# CamelCase names from outside the workspace that pages may mention.
ALLOWED = {
    "Poll", "Pending", "Ready", "Waker", "Context", "Future", "Arc", "Rc",
    "RefCell", "Cell", "Mutex", "Option", "Result", "Vec", "VecDeque", "Box",
    "Send", "Sync", "Drop", "Ok", "Err", "Some", "None", "AtomicU64",
    "AtomicUsize", "AtomicBool", "AtomicPtr", "UnsafeCell", "Instant",
    "Duration", "Wake", "JoinHandle", "SeqCst", "Acquire", "Release",
    "AcqRel", "Relaxed", "PREFLUSH", "FUA", "NOMERGE",
}


def rust_files(base):
    return sorted(p for p in base.rglob("*.rs") if "target" not in p.parts)


SOURCES = {name: [(p, p.read_text()) for p in rust_files(base)]
           for name, base in CRATES.items()}
ALL_SOURCES = [f for files in SOURCES.values() for f in files]


DEF_RE = re.compile(r"\b(struct|enum|trait|type|union|fn|const|static|mod)\s+(\w+)")
FIELD_RE = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?(\w+)\b\s*[:,({=]", re.M)


def index(files):
    """Names defined in `files`: every item, the type items, and members
    (fns, enum variants, struct fields)."""
    items, types, members = set(), set(), set()
    for _, text in files:
        for kind, name in DEF_RE.findall(text):
            items.add(name)
            if kind in ("struct", "enum", "trait", "type", "union"):
                types.add(name)
            if kind == "fn":
                members.add(name)
        members.update(FIELD_RE.findall(text))
    return items, types, members


INDEX = {name: index(files) for name, files in SOURCES.items()}
ALL_INDEX = index(ALL_SOURCES)


def defined(name, crate=None):
    return name in (INDEX[crate] if crate else ALL_INDEX)[0]


def defined_type(name):
    return name in ALL_INDEX[1]


def member(name, crate=None):
    """A fn, an enum variant or a struct field called `name`."""
    return name in (INDEX[crate] if crate else ALL_INDEX)[2]


def module_files(crate, segs):
    """The files of module `segs` of `crate` and the count of module
    segments consumed (the rest are items)."""
    base = CRATES[crate]
    cur_file = base / ("main.rs" if crate == "plugio" else "lib.rs")
    cur_dir = base
    used = 0
    for seg in segs:
        for cand in (cur_dir / f"{seg}.rs", cur_dir / seg / "mod.rs"):
            if cand.is_file():
                cur_file, cur_dir = cand, cur_dir / seg
                used += 1
                break
        else:
            break
    files = [cur_file]
    if used and cur_dir.is_dir():
        files += [p for p in rust_files(cur_dir) if p != cur_file]
    return [(p, p.read_text()) for p in files], used


def check_rust_path(path):
    crate, *segs = path.split("::")
    mod_files, used = module_files(crate, segs)
    items = segs[used:]
    if not items:
        return None
    first, rest = items[0], items[1:]
    if not defined(first, crate):
        return f"`{first}` is defined nowhere in {crate}"
    named = re.compile(r"\b" + re.escape(first) + r"\b")
    if not any(named.search(text) for _, text in mod_files):
        return f"`{first}` is not in module {'::'.join([crate] + segs[:used])}"
    for seg in rest:
        if not member(seg, crate):
            return f"`{seg}` is no fn, variant or field in {crate}"
    return None


def check_type_path(path):
    ty, *rest = path.split("::")
    if ty in ALLOWED:
        return None
    # A bare name may also be an enum variant (`InFlight`).
    if not defined_type(ty) and (rest or not member(ty)):
        return f"type `{ty}` is defined nowhere in the workspace"
    for seg in rest:
        if not member(seg):
            return f"`{seg}` is no fn, variant or field in the workspace"
    return None


def code_spans(text):
    """Inline code spans, and every token of text/plain code blocks."""
    spans = []
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            spans += line.split()
        else:
            spans += re.findall(r"`([^`]+)`", line)
    return spans


def check_page(page):
    errors = []
    for span in code_spans(page.read_text()):
        for tok in re.split(r"[\s(),;]+", span):
            tok = tok.strip(".:")
            if not tok:
                continue
            err = None
            if tok.startswith(REPO_DIRS) and re.fullmatch(r"[\w./-]+", tok):
                if not (ROOT / tok).exists():
                    err = f"path `{tok}` does not exist"
            elif re.fullmatch(r"(executor|device|engine|plugio)(::\w+)+", tok):
                err = check_rust_path(tok)
            elif re.fullmatch(r"[A-Z][a-z]\w*(::\w+)*", tok):
                err = check_type_path(tok)
            if err:
                name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
                errors.append(f"{name}: {err}")
    return errors


def main():
    pages = [pathlib.Path(a).resolve() for a in sys.argv[1:]] or [
        ROOT / "book/src/design.md", ROOT / "book/src/internals.md"]
    errors = [e for p in pages for e in check_page(p)]
    for e in dict.fromkeys(errors):
        print(e)
    if errors:
        print(f"check-design-map: {len(set(errors))} name(s) not found", file=sys.stderr)
        return 1
    print(f"check-design-map: every name in {len(pages)} page(s) exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
