#!/usr/bin/env python3
"""The import rules of docs/layout.md ("Where a type lives"), checked over src/.

    scripts/check-imports.py [--verbose] [--src DIR]
    scripts/check-imports.py --self-test      the rules on a small made-up tree that breaks each of them once

Reads every `use` tree and every inline path of src/**/*.rs (comments and string literals removed) that starts
with `crate::`, `super::`, `self::` or the name of a child module the file declares, and resolves it to the file
that defines the item: a path through a `mod.rs`/`lib.rs` re-export (`pub use child::Item`) is followed to the
child that defines `Item`. Test code (`#[cfg(test)] mod` blocks and files) is left out: a test may reach across
siblings to cross-check them. Three rules:

  1. No circle between sibling files: in each folder, the files and sub-folders are the nodes, and X -> Y when
     anything in X imports anything in Y (re-exports followed to the defining file). Every strongly connected
     component must be a single node.
  2. No large circle through re-exports: the same graph over files, but an import through a `mod.rs` is an edge to
     that `mod.rs`, and a `mod.rs` imports every child it re-exports or names. Every strongly connected component
     has at most MAX_REEXPORT_CIRCLE files.
  3. The runtime carries no loader types and knows no architecture: nothing under src/runtime/ imports src/io/,
     src/load/, src/model/ or src/arch/.

Prints each violation and exits 1; exits 0 with a one-line summary when all hold.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
MAX_REEXPORT_CIRCLE = 10
RUNTIME_MUST_NOT_IMPORT = ("io", "load", "model", "arch")


def strip(text):
    """Comments, string and char literals removed (replaced by spaces so that offsets stay comparable)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or c == "'" and re.match(r"'\\(x..|u\{[0-9a-fA-F]+\})'", text[i:i + 12]):
            m = re.match(r"'(\\(x..|u\{[0-9a-fA-F]+\})|\\.|[^\\'])'", text[i:])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of module names from the crate root
        self.file = file  # path relative to src/
        self.is_dir = os.path.basename(file) in ("mod.rs", "lib.rs", "main.rs")
        self.text = ""
        self.children = set()  # child modules declared with `mod x;`
        self.reexports = {}  # item name -> list of full paths it re-exports (`pub use a::B` gives B -> [a::B])
        self.glob_reexports = []  # `pub use a::*`
        self.imports = []  # (full path tuple, via-reexport) of everything used


def without_tests(text):
    """`text` without its `#[cfg(test)] mod NAME { ... }` blocks: a test may reach across siblings to cross-check
    them, and is no part of the structure the rules describe."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
        if not m:
            return text
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[:m.start()] + text[i:]


def test_only_files():
    """Files declared `#[cfg(test)] mod NAME;` (test helpers and goldens), relative to src/."""
    found = set()
    for root, _, files in os.walk(SRC):
        for f in files:
            if f.endswith(".rs"):
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    text = fh.read()
                here = os.path.relpath(root, SRC) if f in ("mod.rs", "lib.rs") else os.path.relpath(
                    os.path.join(root, f[:-3]), SRC)
                for name in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
                    base = os.path.normpath(os.path.join(here, name))
                    found |= {base + ".rs", os.path.join(base, "mod.rs")}
    return found


def load_modules():
    mods = {}
    tests_only = test_only_files()
    for root, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(root, f)
            rel = os.path.relpath(full, SRC)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if rel == "main.rs" or rel in tests_only:
                continue  # the binary is its own crate: it imports `squeeze::`
            m = Module(tuple(parts), rel)
            with open(full, encoding="utf-8") as fh:
                m.text = without_tests(strip(fh.read()))
            mods[m.path] = m
    for m in mods.values():
        for name in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", m.text, re.M):
            m.children.add(name)
    return mods


def parse_use_tree(s):
    """`a::{b::C, d}` -> [["a","b","C"], ["a","d"]] (aliases dropped, `self` inside braces resolved)."""
    pos = 0

    def tree(prefix):
        nonlocal pos
        out = []
        segs = list(prefix)
        while True:
            skip_ws()
            if s.startswith("{", pos):
                pos += 1
                while True:
                    skip_ws()
                    if s.startswith("}", pos):
                        pos += 1
                        break
                    out.extend(tree(segs))
                    skip_ws()
                    if s.startswith(",", pos):
                        pos += 1
                return out
            if s.startswith("*", pos):
                pos += 1
                out.append(segs + ["*"])
                return out
            m = re.compile(r"\w+").match(s, pos)
            if not m:
                return out
            pos = m.end()
            word = m.group(0)
            if word == "self" and segs and segs != list(prefix) or (word == "self" and prefix):
                pass  # `a::{self}` names `a`
            else:
                segs.append(word)
            skip_ws()
            if s.startswith("::", pos):
                pos += 2
                continue
            am = re.compile(r"\s+as\s+\w+").match(s, pos)
            if am:
                pos = am.end()
            out.append(segs)
            return out

    def skip_ws():
        nonlocal pos
        while pos < len(s) and s[pos].isspace():
            pos += 1

    return tree([])


def absolute(m, segs, offset):
    """A path as written in module m -> a full path from the crate root, or None when it is not the crate's."""
    if not segs:
        return None
    base = m.path
    if segs[0] == "crate":
        return tuple(segs[1:])
    if segs[0] in ("self", "super"):
        # Inside an inline `mod tests {` block, `super` is the file's own module.
        inline = re.search(r"\bmod\s+\w+\s*\{", m.text[:offset]) is not None
        cur = list(base)
        if inline:
            cur.append("<inline>")
        rest = list(segs)
        if rest[0] == "self":
            rest = rest[1:]
        while rest and rest[0] == "super":
            rest = rest[1:]
            cur = cur[:-1]
        cur = [c for c in cur if c != "<inline>"]
        return tuple(cur + rest)
    if segs[0] in m.children:
        return tuple(list(base) + segs)
    return None


def collect(mods):
    use_re = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
    path_re = re.compile(r"(?<![\w:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::\w+)+)")
    for m in mods.values():
        spans = []
        for u in use_re.finditer(m.text):
            spans.append((u.start(), u.end()))
            for segs in parse_use_tree(u.group(2)):
                full = absolute(m, segs, u.start())
                if full is None:
                    continue
                if u.group(1) and m.is_dir:
                    name = segs[-1]
                    if name == "*":
                        m.glob_reexports.append(full[:-1])
                    else:
                        m.reexports.setdefault(name, []).append(full)
                m.imports.append(full)
        for p in path_re.finditer(m.text):
            if any(a <= p.start() < b for a, b in spans):
                continue
            segs = p.group(1).split("::")
            full = absolute(m, segs, p.start())
            if full is not None:
                m.imports.append(full)


def resolve(mods, full, follow=True, seen=None):
    """The files a full path names: the longest module prefix, and with `follow` the re-export chain to the
    defining file. Returns a set of module paths."""
    seen = seen or set()
    for k in range(len(full), -1, -1):
        prefix = full[:k]
        if prefix in mods:
            m = mods[prefix]
            rest = full[k:]
            if not follow or not rest or not m.is_dir or (prefix, rest[0]) in seen:
                return {prefix}
            seen.add((prefix, rest[0]))
            targets = set()
            for r in m.reexports.get(rest[0], []):
                targets |= resolve(mods, r + tuple(rest[1:]), True, seen)
            for g in m.glob_reexports:
                if any(full2[:len(g)] == g for full2 in [g]):
                    sub = resolve(mods, g + tuple(rest), True, seen)
                    if sub != {g} and sub != set(g for _ in [0]):
                        targets |= {t for t in sub if t != prefix}
            return targets or {prefix}
    return set()


def sccs(nodes, edges):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
            out.append(comp)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def name(mods, p):
    return mods[p].file if p in mods else "::".join(p)


SELF_TEST_TREE = {
    "lib.rs": "pub mod a;\npub mod io;\npub mod runtime;\npub mod big;\n",
    # Rule 1: x.rs and y.rs import each other; z.rs only imports x.rs (no circle), its test module y.rs (left out).
    "a/mod.rs": "pub mod x;\npub mod y;\npub mod z;\n",
    "a/x.rs": "use super::y::Y;\npub struct X(Y);\n",
    "a/y.rs": "use crate::a::x::X;\npub struct Y;\npub fn f(_: &X) {}\n",
    "a/z.rs": "use super::x::X;\n#[cfg(test)]\nmod tests {\n    use super::super::y::Y;\n}\n",
    "io/mod.rs": "pub struct File;\n",
    # Rule 3: the runtime names an io type.
    "runtime/mod.rs": "pub mod m;\n",
    "runtime/m.rs": "pub fn g(_: &crate::io::File) {}\n",
}


def self_test():
    """The rules on SELF_TEST_TREE (plus a folder of 11 files that import a type of their mod.rs, which re-exports
    theirs), which breaks each rule once: the check must report each and nothing else."""
    import tempfile
    tree = dict(SELF_TEST_TREE)
    names = ["f%d" % i for i in range(11)]
    tree["big/mod.rs"] = "pub struct Shared;\n" + "".join("mod %s;\npub use %s::T%s;\n" % (n, n, n[1:]) for n in names)
    for i, n in enumerate(names):
        tree["big/%s.rs" % n] = "use super::Shared;\npub struct T%d(Shared);\n" % i
    with tempfile.TemporaryDirectory() as root:
        for rel, text in tree.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as fh:
                fh.write(text)
        failures, _ = check(root)
    expected = [
        ("circle between siblings in src/a: x, y", True),
        ("circle of 12 files through re-exports", True),
        ("runtime imports a loader type: runtime/m.rs imports io/mod.rs", True),
        ("src/a: x, y, z", False),
        ("src/big", False),
    ]
    wrong = [(text, want) for text, want in expected if any(text in line for line in failures) != want]
    for text, want in wrong:
        print("self-test: %s %r" % ("missing" if want else "unexpected", text))
    if wrong:
        print("\n".join(failures))
        return 1
    print("check-imports self-test: each rule broken once, each reported, nothing else")
    return 0


def main():
    if "--self-test" in sys.argv:
        return self_test()
    if "--src" in sys.argv:
        global SRC
        SRC = sys.argv[sys.argv.index("--src") + 1]
    verbose = "--verbose" in sys.argv
    failures, summary = check(SRC, verbose)
    if failures:
        print("\n".join(failures))
        print(summary)
        return 1
    print(summary)
    return 0


def check(src, verbose=False):
    """The three rules over the tree at `src`: (violation lines, one-line summary)."""
    global SRC
    SRC = src
    mods = load_modules()
    if not mods:
        return ["no .rs files under %s" % src], "check-imports: nothing to check"
    collect(mods)
    failures = []

    # Rule 1: sibling circles, re-exports followed.
    deps = {p: set() for p in mods}
    for p, m in mods.items():
        for full in m.imports:
            for t in resolve(mods, full):
                if t != p:
                    deps[p].add(t)
    edge_why = {}
    folders = {}
    for p in mods:
        if mods[p].is_dir:
            folders[p] = set()
    for p in mods:
        if p and p[:-1] in folders:
            folders[p[:-1]].add(p)
    circles = 0
    for folder, kids in sorted(folders.items()):
        edges = {}
        for a in mods:
            for b in deps[a]:
                if len(a) > len(folder) and len(b) > len(folder) and a[:len(folder)] == folder and b[:len(folder)] == folder:
                    x, y = a[:len(folder) + 1], b[:len(folder) + 1]
                    if x != y and a != folder and b != folder:
                        edges.setdefault(x, set()).add(y)
                        edge_why.setdefault((x, y), (a, b))
        for comp in sccs(sorted(edges), edges):
            if len(comp) > 1:
                circles += 1
                members = sorted(comp)
                failures.append("circle between siblings in src/%s: %s" % (
                    "/".join(folder) or "(crate root)", ", ".join(p[-1] for p in members)))
                for x in members:
                    for y in sorted(edges.get(x, ())):
                        if y in comp:
                            a, b = edge_why[(x, y)]
                            failures.append("    %s -> %s (%s imports %s)" % (x[-1], y[-1], name(mods, a), name(mods, b)))

    # Rule 2: circles through re-exports (not followed).
    deps2 = {p: set() for p in mods}
    for p, m in mods.items():
        for full in m.imports:
            for t in resolve(mods, full, follow=False):
                if t != p:
                    deps2[p].add(t)
        if m.is_dir:
            for targets in m.reexports.values():
                for full in targets:
                    for t in resolve(mods, full, follow=False):
                        if t != p:
                            deps2[p].add(t)
            for g in m.glob_reexports:
                for t in resolve(mods, g, follow=False):
                    if t != p:
                        deps2[p].add(t)
    largest = 0
    for comp in sccs(sorted(deps2), deps2):
        largest = max(largest, len(comp))
        if len(comp) > MAX_REEXPORT_CIRCLE:
            failures.append("circle of %d files through re-exports (at most %d): %s" % (
                len(comp), MAX_REEXPORT_CIRCLE, ", ".join(sorted(name(mods, p) for p in comp))))
        elif verbose and len(comp) > 1:
            print("re-export circle of %d: %s" % (len(comp), ", ".join(sorted(name(mods, p) for p in comp))))

    # Rule 3: the runtime imports no loader or IO type.
    for p, m in sorted(mods.items()):
        if p[:1] != ("runtime",):
            continue
        for t in sorted(deps[p]):
            if t[:1] and t[0] in RUNTIME_MUST_NOT_IMPORT:
                failures.append("runtime imports a loader type: %s imports %s" % (m.file, name(mods, t)))

    if failures:
        return failures, "check-imports: %d sibling circle(s); largest re-export circle %d files; %d violation line(s)" % (
            circles, largest, len(failures))
    return failures, ("check-imports: %d files, no circle between sibling files, largest circle through re-exports "
                      "%d files (at most %d), the runtime imports nothing of io/, load/, model/, arch/" % (
                          len(mods), largest, MAX_REEXPORT_CIRCLE))


if __name__ == "__main__":
    sys.exit(main())
