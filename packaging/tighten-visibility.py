#!/usr/bin/env python3
"""Makes the library's items `pub(crate)` unless something outside needs them.

Every `pub` and `pub(crate)` visibility in the library's files under `src/`
(not `src/main.rs`, not `lib.rs`'s `pub mod` lines, never `pub(super)` or
`pub(in ...)`) is first written as `pub(crate)`. Then `cargo check
--all-targets --message-format=json` tells which of them the code outside
the library (the binary, `tests/`, `benches/`) names: each privacy error
(E0603, E0624, E0616, E0451, E0364, E0365, E0423, E0446) points at a definition
or names a field, and exactly those get `pub` back. The checks repeat until
the tree compiles. Then the warnings that `pub(crate)` reveals are handled
the same way, never by deleting code:

- `dead_code`: an item nothing uses (or only the unit tests use) gets `pub`
  back, and if it still warns, so does what makes it reachable (its struct,
  its impl's type, its module, a re-export of it), so that the rounds reach
  their fixed point; each is listed. At the end an item that nothing uses,
  not even a unit test, fails the run (exit 4, the files put back): dead
  code is to be deleted, not published.
- `private_interfaces`/`private_bounds`: a type a `pub` item names gets `pub`.
- `unused_imports`: an unused `pub(crate) use` was a re-export; it gets `pub`.
- clippy lints that only fire on items outside the exported API (clippy's
  `avoid-breaking-exported-api`) get their item's `pub` back, so
  `cargo clippy --all-targets -- -D warnings` stays clean.

The fuzz targets under `tests/fuzz/` are not built by `cargo check
--all-targets` (they are their own workspace): every item their files name
through a `tinylet::` path is resolved (through modules and re-exports) and
kept `pub` from the start, with the fields and associated items of the types
so named whose names appear in those files.

At the end it runs `cargo fmt`, as `pub(crate)` makes some lines too long.
The script never makes anything private, only `pub` to `pub(crate)` and back.
It is idempotent: run on its own result it writes the same files. On a
later tree (new code, new tests) run it again. On an error it cannot fix,
or dead code, it puts the files back as they were and exits non-zero.

Usage (from anywhere; honours CARGO_TARGET_DIR):

    python3 packaging/tighten-visibility.py [--no-clippy] [--dry-run] [--verbose]
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
FUZZ = ROOT / "tests" / "fuzz"

# Errors that say an item is not visible where it is named.
PRIVACY_ERRORS = {"E0603", "E0624", "E0616", "E0451", "E0364", "E0365", "E0423", "E0446"}
ITEM_KEYWORDS = {"fn", "struct", "enum", "union", "trait", "type", "const",
                 "static", "mod", "use", "impl", "extern", "macro_rules"}


# ---------------------------------------------------------------- lexing

class Tok:
    __slots__ = ("kind", "text", "start", "end")

    def __init__(self, kind, text, start, end):
        self.kind, self.text, self.start, self.end = kind, text, start, end

    def __repr__(self):
        return f"{self.kind}:{self.text}@{self.start}"


IDENT_START = re.compile(r"[A-Za-z_]")
IDENT = re.compile(r"[A-Za-z0-9_]*")
NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*")
RAW_STR = re.compile(r'b?r(#*)"')


def lex(text):
    """Rust tokens with byte offsets (the text is the file read as latin-1,
    so an index is a byte offset); comments dropped, literals kept whole."""
    toks = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif text.startswith("//", i):
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
        elif RAW_STR.match(text, i):
            m = RAW_STR.match(text, i)
            close = '"' + m.group(1)
            j = text.find(close, m.end())
            j = n if j < 0 else j + len(close)
            toks.append(Tok("lit", text[i:j], i, j))
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            toks.append(Tok("lit", text[i:j + 1], i, j + 1))
            i = j + 1
        elif c == "'" or (c == "b" and text.startswith("b'", i)):
            k = i + (2 if c == "b" else 1)
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if k < n and (text[k] == "\\" or ord(text[k]) > 127):
                j = text.find("'", k + 1)
                toks.append(Tok("lit", text[i:j + 1], i, j + 1))
                i = j + 1
            elif k + 1 < n and text[k + 1] == "'":
                toks.append(Tok("lit", text[i:k + 2], i, k + 2))
                i = k + 2
            else:
                m = IDENT.match(text, k)
                toks.append(Tok("life", text[i:m.end()], i, m.end()))
                i = max(m.end(), i + 1)
        elif IDENT_START.match(c) or ord(c) > 127:
            m = re.compile(r"[A-Za-z0-9_\x80-\xff]*").match(text, i)
            j = m.end()
            if text.startswith("r#", i):
                j = IDENT.match(text, i + 2).end()
            toks.append(Tok("ident", text[i:j], i, j))
            i = j
        elif c.isdigit():
            m = NUMBER.match(text, i)
            toks.append(Tok("lit", m.group(0), i, m.end()))
            i = m.end()
        else:
            two = text[i:i + 2]
            if two in ("->", "=>", "::"):
                toks.append(Tok("punct", two, i, i + 2))
                i += 2
            else:
                toks.append(Tok("punct", c, i, i + 1))
                i += 1
    return toks


# ---------------------------------------------------------------- items

class Marker:
    """One visibility (`pub` or `pub(crate)`) the script may rewrite."""

    def __init__(self, src, start, end, tok_index):
        self.src = src            # the SourceFile
        self.start = start        # byte range of the visibility in the original text
        self.end = end
        self.tok = tok_index      # index of the `pub` token
        self.pub = False          # the state being tried
        self.kind = None          # fn, struct, field, use, mod, ...
        self.name = None          # the item's (or field's) name
        self.extent = (start, end)  # byte range of the whole item
        self.why = set()          # why it is kept `pub`

    def where(self):
        line = self.src.text.count("\n", 0, self.start) + 1
        return f"{self.src.rel}:{line}"

    def __repr__(self):
        return f"{self.kind} {self.name} ({self.where()})"


class SourceFile:
    def __init__(self, path):
        self.path = path
        self.rel = str(path.relative_to(ROOT))
        self.text = path.read_bytes().decode("latin-1")
        self.toks = lex(self.text)
        self.markers = []
        self.is_lib_root = path == SRC / "lib.rs"

    def render(self):
        out, pos = [], 0
        for m in self.markers:
            out.append(self.text[pos:m.start])
            out.append("pub" if m.pub else "pub(crate)")
            pos = m.end
        out.append(self.text[pos:])
        return "".join(out)

    def offset_map(self):
        """Maps a byte offset of the rendered text to the original text."""
        shifts, delta = [], 0
        for m in self.markers:
            new_len = 3 if m.pub else 10
            shifts.append((m.start + delta, m.end - m.start - new_len))
            delta += new_len - (m.end - m.start)

        def to_orig(off):
            d = 0
            for at, s in shifts:
                if off > at:
                    d += s
                else:
                    break
            return off + d
        return to_orig


def skip_to_item_end(toks, i, kind):
    """Index just past the end of the item whose body starts at token i."""
    depth = 0
    angle = 0
    field = kind == "field"
    n = len(toks)
    while i < n:
        t = toks[i].text if toks[i].kind == "punct" else None
        if t in ("(", "[", "{"):
            depth += 1
            if t == "{" and depth == 1 and not field and kind not in ("use", "const", "static", "type"):
                # The body of a fn, struct, enum, trait, impl or mod.
                j = match_close(toks, i)
                # `struct X {..}` and `fn f() {..}` end at the brace.
                return j + 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth < 0:
                return i
        elif t == ";" and depth == 0:
            return i + 1
        elif field and depth == 0:
            if t == "<":
                angle += 1
            elif t == ">":
                angle -= 1
            elif t == "," and angle <= 0:
                return i
        i += 1
    return n


def match_close(toks, i):
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text if toks[j].kind == "punct" else None
        if t in ("(", "[", "{"):
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def find_markers(src):
    toks = src.toks
    for i, t in enumerate(toks):
        if t.kind != "ident" or t.text != "pub":
            continue
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if nxt is None:
            continue
        if nxt.text == "(":
            if i + 3 < len(toks) and toks[i + 2].text == "crate" and toks[i + 3].text == ")":
                end_tok = i + 3
            else:
                continue  # pub(super), pub(self), pub(in ...): left alone
        else:
            end_tok = i
        body = end_tok + 1
        if body >= len(toks):
            continue
        if src.is_lib_root and toks[body].text == "mod":
            continue
        m = Marker(src, t.start, toks[end_tok].end, i)
        # What kind of item follows.
        j = body
        while j < len(toks) and toks[j].text in ("unsafe", "async", "default", "extern") or (
                j < len(toks) and toks[j].kind == "lit" and toks[j].text.startswith('"')):
            j += 1
        word = toks[j].text if j < len(toks) else ""
        if word == "const" and j + 1 < len(toks) and toks[j + 1].text in ("fn", "unsafe", "async", "extern"):
            j += 1
            while toks[j].text != "fn":
                j += 1
            word = "fn"
        m.name_pos = toks[j].start
        if word in ITEM_KEYWORDS:
            m.kind = word
            if word == "use":
                m.name = None
            elif j + 1 < len(toks) and toks[j + 1].kind == "ident":
                m.name = toks[j + 1].text
                m.name_pos = toks[j + 1].start
        elif toks[j].kind == "ident" and j + 1 < len(toks) and toks[j + 1].text == ":":
            m.kind, m.name = "field", toks[j].text
        else:
            m.kind, m.name = "field", None  # a tuple field
        end = skip_to_item_end(toks, body, m.kind)
        last = toks[min(end, len(toks)) - 1]
        m.extent = (m.start, max(last.end, m.end))
        m.body_tok = body
        m.end_tok = end
        src.markers.append(m)


# ---------------------------------------------------------------- modules

class Module:
    def __init__(self, name, parent, src, tok_range, decl):
        self.name = name
        self.parent = parent
        self.src = src
        self.tok_range = tok_range  # top-level tokens of this module in src
        self.decl = decl            # the Marker of its `mod` line, if any
        self.children = {}
        self.items = {}             # name -> [Marker or None, kind, tok index]
        self.uses = []              # (leaf name, path, marker, tok index of leaf)


class Crate:
    def __init__(self):
        self.files = {}
        for p in sorted(SRC.rglob("*.rs")):
            if p == SRC / "main.rs":
                continue
            src = SourceFile(p)
            find_markers(src)
            self.files[p] = src
        self.by_start = {}
        for src in self.files.values():
            for m in src.markers:
                self.by_start[(src.path, m.tok)] = m
        self.root = self.load_module("crate", None, self.files[SRC / "lib.rs"], None, SRC)
        self.impls = []  # (self type name, src, token range)
        for src in self.files.values():
            self.find_impls(src)

    def markers(self):
        for src in self.files.values():
            yield from src.markers

    def marker_at(self, src, tok):
        return self.by_start.get((src.path, tok))

    def load_module(self, name, parent, src, decl, dir_, tok_range=None):
        mod = Module(name, parent, src, tok_range or (0, len(src.toks)), decl)
        toks = src.toks
        i, end = mod.tok_range
        while i < end:
            t = toks[i]
            if t.kind == "punct" and t.text in ("{", "(", "["):
                i = match_close(toks, i) + 1
                continue
            if t.kind == "punct" and t.text == "#":
                # An attribute: skip `#[...]` or `#![...]`.
                k = i + 1
                if k < end and toks[k].text == "!":
                    k += 1
                if k < end and toks[k].text == "[":
                    i = match_close(toks, k) + 1
                    continue
            if t.kind == "ident" and t.text in ITEM_KEYWORDS and t.text != "impl":
                marker = self.vis_marker(src, i)
                kw = t.text
                if kw == "use":
                    stop = i
                    while stop < end and toks[stop].text != ";":
                        stop += 1
                    for leaf, path, leaf_tok in parse_use_tree(toks, i + 1, stop):
                        mod.uses.append((leaf, path, marker, leaf_tok))
                    i = stop + 1
                    continue
                if kw == "extern" or kw == "fn" and i + 1 < end and toks[i + 1].kind != "ident":
                    i += 1
                    continue
                if i + 1 < end and toks[i + 1].kind == "ident":
                    name_ = toks[i + 1].text
                    if kw == "mod":
                        if i + 2 < end and toks[i + 2].text == ";":
                            sub_dir = dir_ if src.path.name in ("mod.rs", "lib.rs") else dir_ / src.path.stem
                            cand = [sub_dir / f"{name_}.rs", sub_dir / name_ / "mod.rs"]
                            for c in cand:
                                if c in self.files:
                                    child = self.load_module(name_, mod, self.files[c], marker, c.parent)
                                    mod.children[name_] = child
                                    break
                            i += 3
                            continue
                        if i + 2 < end and toks[i + 2].text == "{":
                            close = match_close(toks, i + 2)
                            child = self.load_module(name_, mod, src, marker, dir_ / name_, (i + 3, close))
                            mod.children[name_] = child
                            i = close + 1
                            continue
                    mod.items.setdefault(name_, []).append((marker, kw, i))
            i += 1
        return mod

    def vis_marker(self, src, kw_tok):
        """The marker of the visibility before the keyword at kw_tok."""
        toks = src.toks
        j = kw_tok - 1
        while j >= 0 and (toks[j].text in ("unsafe", "async", "const", "extern", "default")
                          or toks[j].kind == "lit" and toks[j].text.startswith('"')):
            j -= 1
        if j >= 0 and toks[j].text == ")" and j >= 3 and toks[j - 3].text == "pub":
            return self.marker_at(src, j - 3)
        if j >= 0 and toks[j].text == "pub":
            return self.marker_at(src, j)
        return None

    def find_impls(self, src):
        toks = src.toks
        for i, t in enumerate(toks):
            if t.kind != "ident" or t.text != "impl":
                continue
            if i > 0 and toks[i - 1].text in ("->", "(", ",", ":", "<", "&", "=", "dyn"):
                continue  # `impl Trait` in a type
            j, depth, names, trait = i + 1, 0, [], False
            while j < len(toks):
                x = toks[j].text
                if x == "<":
                    depth += 1
                elif x == ">":
                    depth -= 1
                elif depth == 0 and x in ("{", "where", ";"):
                    break
                elif depth == 0 and x == "for":
                    trait = True
                    names = []
                elif depth == 0 and toks[j].kind == "ident":
                    names.append(x)
                j += 1
            if j < len(toks) and toks[j].text == "{" and names and not trait:
                close = match_close(toks, j)
                self.impls.append((names[-1], src, (j + 1, close)))

    # Resolution of paths, for the fuzz targets and for re-exports.

    def lookup(self, mod, name):
        """What `name` means in module `mod`: a list of (marker, kind, thing)."""
        found = []
        if name in mod.children:
            found.append((mod.children[name].decl, "mod", mod.children[name]))
        for marker, kind, tok in mod.items.get(name, []):
            found.append((marker, kind, (mod, tok)))
        for leaf, path, marker, _ in mod.uses:
            if leaf == name:
                found.append((marker, "use", (mod, path)))
        return found

    def resolve(self, mod, segments, keep_path, keep_final=None, seen=None):
        """Calls keep_path on every visibility on the way to the item
        `segments` names and keep_final on the item's own (and on the
        re-exports that name it). Returns the final (kind, thing) list."""
        keep_final = keep_final or keep_path
        seen = seen or set()
        cur = [("mod", mod)]
        for idx, seg in enumerate(segments):
            last = idx == len(segments) - 1
            keep = keep_final if last else keep_path
            nxt = []
            for kind, thing in cur:
                if kind == "mod":
                    m = thing
                    if seg == "crate":
                        nxt.append(("mod", self.root))
                        continue
                    if seg == "self":
                        nxt.append(("mod", m))
                        continue
                    if seg == "super":
                        nxt.append(("mod", m.parent or m))
                        continue
                    for marker, k, what in self.lookup(m, seg):
                        if marker:
                            keep(marker)
                        if k == "mod":
                            nxt.append(("mod", what))
                        elif k == "use":
                            umod, path = what
                            key = (id(umod), tuple(path))
                            if key in seen:
                                continue
                            seen.add(key)
                            start = umod if path[0] in ("crate", "self", "super") or path[0] in umod.children \
                                or path[0] in umod.items or any(u[0] == path[0] for u in umod.uses) else None
                            if start is not None:
                                nxt.extend(self.resolve(umod, path, keep_path, keep, seen))
                        else:
                            nxt.append((k, (what, seg)))
                elif kind in ("struct", "enum", "type", "trait", "union"):
                    _, type_name = thing
                    for marker in self.associated(type_name, seg):
                        keep(marker)
            cur = nxt
        return cur

    def associated(self, type_name, name):
        """Markers of inherent items and fields called `name` of types called
        `type_name`."""
        out = []
        for tname, src, (a, b) in self.impls:
            if tname != type_name:
                continue
            for m in src.markers:
                if a <= m.tok < b and m.name == name and self.top_level(src, m.tok, a):
                    out.append(m)
        for src in self.files.values():
            for m in src.markers:
                if m.kind in ("struct", "union") and m.name == type_name:
                    for f in self.fields(m):
                        if f.name == name:
                            out.append(f)
        return out

    def top_level(self, src, tok, start):
        depth = 0
        for t in src.toks[start:tok]:
            if t.kind == "punct" and t.text in ("(", "[", "{"):
                depth += 1
            elif t.kind == "punct" and t.text in (")", "]", "}"):
                depth -= 1
        return depth == 0

    def fields(self, struct_marker):
        src = struct_marker.src
        a, b = struct_marker.body_tok, struct_marker.end_tok
        # The first bracket after the name opens the fields.
        k = a
        while k < b and src.toks[k].text not in ("{", "(", ";"):
            k += 1
        if k >= b or src.toks[k].text == ";":
            return []
        close = match_close(src.toks, k)
        return [m for m in src.markers if k < m.tok < close and m.kind == "field"
                and self.top_level(src, m.tok, k + 1)]


def parse_use_tree(toks, i, stop, prefix=()):
    """Leaves of a use tree as (name it binds, full path, leaf token)."""
    out = []
    path = list(prefix)
    while i < stop:
        t = toks[i]
        if t.text == "{":
            close = match_close(toks, i)
            # Split the group on top-level commas.
            j = i + 1
            while j < close:
                k, depth = j, 0
                while k < close:
                    x = toks[k].text
                    if x in ("{", "("):
                        depth += 1
                    elif x in ("}", ")"):
                        depth -= 1
                    elif x == "," and depth == 0:
                        break
                    k += 1
                out.extend(parse_use_tree(toks, j, k, tuple(path)))
                j = k + 1
            return out
        if t.text == "::":
            i += 1
            continue
        if t.text == "*":
            return out
        if t.kind == "ident":
            if t.text == "as" and i + 1 < stop:
                alias = toks[i + 1].text
                if path and alias != "_":
                    out.append((alias, path, i + 1))
                return out
            path.append(t.text)
            if i + 1 >= stop or toks[i + 1].text not in ("::", "as"):
                leaf = t.text if t.text != "self" else (path[-2] if len(path) > 1 else "self")
                if t.text == "self":
                    path = path[:-1]
                out.append((leaf, path, i))
                return out
        i += 1
    return out


# ---------------------------------------------------------------- fuzz paths

def fuzz_keep(crate, keep):
    files = sorted(FUZZ.rglob("*.rs")) if FUZZ.is_dir() else []
    files = [f for f in files if "target" not in f.parts]
    words = set()
    type_names = set()
    count = 0
    for f in files:
        toks = lex(f.read_bytes().decode("latin-1"))
        words.update(t.text for t in toks if t.kind == "ident")
        i = 0
        while i < len(toks):
            t = toks[i]
            if t.kind == "ident" and t.text == "tinylet" and i + 1 < len(toks) and toks[i + 1].text == "::":
                is_use = i > 0 and toks[i - 1].text == "use"
                if is_use:
                    stop = i
                    while toks[stop].text != ";":
                        stop += 1
                    paths = [p for _, p, _ in parse_use_tree(toks, i + 2, stop)]
                    i = stop
                else:
                    seg, j = [], i + 2
                    while j < len(toks) and toks[j].kind == "ident":
                        seg.append(toks[j].text)
                        if j + 1 < len(toks) and toks[j + 1].text == "::":
                            j += 2
                        else:
                            break
                    paths = [seg]
                    i = j
                for p in paths:
                    count += 1
                    for kind, thing in crate.resolve(crate.root, p, lambda m: keep(m, "named by tests/fuzz")):
                        if kind in ("struct", "enum", "type", "union", "trait"):
                            type_names.add(thing[1])
            i += 1
    # Fields and methods of the named types used by name in those files.
    for tname in type_names:
        for w in words:
            for m in crate.associated(tname, w):
                keep(m, "used by tests/fuzz")
    return count


# ---------------------------------------------------------------- cargo

def all_spans(diag):
    for s in diag.get("spans", []):
        yield s, diag.get("message", "")
    for c in diag.get("children", []):
        yield from all_spans(c)


class Fixer:
    def __init__(self, crate):
        self.crate = crate
        self.by_rel = {src.rel: src for src in crate.files.values()}
        self.changed = False
        self.dead = {}       # marker -> message, for the report
        self.test_only = set()

    def keep(self, m, why):
        if m is None:
            return False
        m.why.add(why)
        if not m.pub:
            m.pub = True
            self.changed = True
            return True
        return False

    def span_markers(self, span):
        """The markers a diagnostic span points at: those starting inside
        it, else the innermost one around it."""
        src = self.by_rel.get(span["file_name"])
        if src is None:
            return src, []
        to_orig = self.maps[src.rel]
        a, b = to_orig(span["byte_start"]), to_orig(span["byte_end"])
        around = [m for m in src.markers if m.extent[0] <= a < m.extent[1]]
        around.sort(key=lambda m: m.extent[1] - m.extent[0])
        if around and a <= around[0].name_pos:
            return src, around[:1]
        inside = [m for m in src.markers if a <= m.start < max(b, a + 1)]
        if inside:
            return src, inside[:1]
        return src, around[:1]

    def structs_named(self, name):
        return [m for m in self.crate.markers() if m.kind in ("struct", "union") and m.name == name]

    def field_error(self, diag, why):
        """`field(s) `a`, `b` of struct `S` are private`: keep those fields."""
        m = re.search(r"fields? (.*) of (?:struct|union) `([^`<]+)", diag["message"])
        if not m:
            return
        fields = set(re.findall(r"`([^`]+)`", m.group(1)))
        path = m.group(2).split("::")
        structs = []
        if len(path) > 1 and path[0] == "tinylet":
            found = []
            self.crate.resolve(self.crate.root, path[1:], lambda x: None, found.append)
            structs = [s for s in found if s is not None and s.kind in ("struct", "union")]
        for s in structs or self.structs_named(path[-1]):
            for f in self.crate.fields(s):
                if f.name in fields or f.name is None:
                    self.keep(f, why)

    def reexport_error(self, diag, why):
        """`pub use` of an item that is only `pub(crate)`: keep the item."""
        for span, _ in all_spans(diag):
            src = self.by_rel.get(span["file_name"])
            if src is None:
                continue
            a = self.maps[src.rel](span["byte_start"])
            for mod in self.modules_of(src):
                for leaf, path, marker, tok in mod.uses:
                    if src.toks[tok].start <= a < src.toks[tok].end + 1 or (
                            marker and marker.extent[0] <= a < marker.extent[1]
                            and src.toks[tok].start >= a):
                        self.crate.resolve(mod, path, lambda x: None, lambda x: self.keep(x, why))

    def modules_of(self, src):
        out = []
        stack = [self.crate.root]
        while stack:
            m = stack.pop()
            if m.src is src:
                out.append(m)
            stack.extend(m.children.values())
        return out

    def containers(self, m):
        """What makes marker m reachable from outside: its struct, its impl's
        type, its module's declaration, re-exports of it."""
        out = []
        src = m.src
        for s in src.markers:
            if s is not m and s.extent[0] < m.start and m.extent[1] <= s.extent[1] and s.kind != "use":
                out.append(s)
        for tname, isrc, (a, b) in self.crate.impls:
            if isrc is src and a <= m.tok < b:
                out.extend(x for x in self.structs_named(tname))
                out.extend(x for x in self.crate.markers() if x.kind in ("enum", "type", "trait") and x.name == tname)
        for mod in self.modules_of(src):
            if mod.tok_range[0] <= m.tok < mod.tok_range[1]:
                chain = mod
                while chain is not None:
                    if chain.decl is not None:
                        out.append(chain.decl)
                    if m.name:
                        for leaf, path, marker, _ in (chain.parent.uses if chain.parent else []):
                            if path and path[-1] == m.name and marker is not None:
                                out.append(marker)
                    chain = chain.parent
        return out

    def handle(self, msgs, errors_only):
        """One round of diagnostics; returns the ones it could not place.
        While the tree does not compile only the privacy errors count: the
        dead code it shows then is mostly what the outside uses."""
        unplaced = []
        dead_lib = {}
        self.maps = {src.rel: src.offset_map() for src in self.crate.files.values()}
        for d in msgs:
            code = (d.get("code") or {}).get("code")
            level = d.get("level")
            if level not in ("error", "warning"):
                continue
            if errors_only and level != "error" and code not in ("private_interfaces", "private_bounds"):
                continue
            if code in PRIVACY_ERRORS:
                why = "used outside the library"
                before = self.changed
                self.changed = False
                if code in ("E0616", "E0451"):
                    self.field_error(d, why)
                elif code in ("E0364", "E0365"):
                    self.reexport_error(d, why)
                for span, _ in all_spans(d):
                    _, ms = self.span_markers(span)
                    for m in ms:
                        self.keep(m, why)
                placed = self.changed
                self.changed = before or placed
                if not placed:
                    unplaced.append(d)
            elif code in ("private_interfaces", "private_bounds"):
                placed = False
                for c in d.get("children", []):
                    for span in c.get("spans", []):
                        for m in self.span_markers(span)[1]:
                            placed |= self.keep(m, "named by a pub item") or m.pub
                if not placed:
                    unplaced.append(d)
            elif code == "unused_imports":
                placed = False
                for span in d.get("spans", []):
                    for m in self.span_markers(span)[1]:
                        if m.kind == "use":
                            self.dead.setdefault(m, d["message"])
                            placed |= self.keep(m, "a re-export nothing inside uses")
                if not placed:
                    unplaced.append(d)
            elif code == "dead_code":
                tgt = d["_target"]
                key = d["message"]
                placed = False
                for span in d.get("spans", []):
                    if not span.get("is_primary"):
                        continue
                    src, ms = self.span_markers(span)
                    if src is None:
                        continue
                    line = (span.get("text") or [{}])[0]
                    name = line.get("text", "")[line.get("highlight_start", 1) - 1:line.get("highlight_end", 1) - 1]
                    for m in ms:
                        if m.name and name and m.name != name and m.kind not in ("enum", "struct", "union", "trait"):
                            continue
                        placed = True
                        dead_lib.setdefault(m, [key, 0])[1] += 1
                if not placed and tgt.get("kind") == ["lib"]:
                    unplaced.append(d)
            elif code and code.startswith("clippy::"):
                placed = False
                for span in d.get("spans", []):
                    src, ms = self.span_markers(span)
                    if src is None:
                        continue
                    for m in ms:
                        placed |= self.keep(m, f"else {code} fires") or m.pub
                if not placed and any(s["file_name"] in self.by_rel for s in d.get("spans", [])):
                    unplaced.append(d)
            elif level == "error" or (level == "warning" and any(
                    s["file_name"] in self.by_rel for s in d.get("spans", []))):
                unplaced.append(d)
        for m, (msg, count) in dead_lib.items():
            # The library is checked twice, as itself and with its unit
            # tests: warned once means only the unit tests use it.
            self.dead[m] = msg
            if count == 1:
                self.test_only.add(m)
            if not self.keep(m, "nothing in the crate uses it"):
                for c in self.containers(m):
                    self.keep(c, "makes an unused item reachable")
        return unplaced


def cargo_msgs(tool):
    cmd = ["cargo", tool, "--all-targets", "--message-format=json"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    msgs = []
    for line in proc.stdout.decode("utf-8", "replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-message":
            continue
        d = msg["message"]
        d["_target"] = msg.get("target", {})
        msgs.append(d)
    return proc.returncode, msgs, proc.stderr.decode("utf-8", "replace")


def write(crate):
    for src in crate.files.values():
        text = src.render()
        if text != src.path.read_bytes().decode("latin-1"):
            src.path.write_bytes(text.encode("latin-1"))


def show(d):
    r = d.get("rendered") or d.get("message", "")
    return r if len(r) < 4000 else r[:4000] + "..."


def main():
    args = set(sys.argv[1:])
    t0 = time.time()
    crate = Crate()
    originals = {src.path: src.text for src in crate.files.values()}
    markers = list(crate.markers())
    before_pub = sum(1 for m in markers if src_text(m) == "pub")
    before_crate = len(markers) - before_pub
    fixer = Fixer(crate)
    n_fuzz = fuzz_keep(crate, fixer.keep)
    print(f"tighten-visibility: {len(markers)} visibilities in src/ (lib.rs's `pub mod` lines aside): "
          f"{before_pub} pub, {before_crate} pub(crate); {n_fuzz} tinylet:: paths in tests/fuzz")
    if "--dry-run" in args:
        return 0

    def restore(code, why):
        for path, text in originals.items():
            path.write_bytes(text.encode("latin-1"))
        print(f"tighten-visibility: {why}; the files are as they were", file=sys.stderr)
        return code

    tools = ["check"] + ([] if "--no-clippy" in args else ["clippy"])
    rounds = 0
    try:
        for tool in tools:
            while True:
                rounds += 1
                write(crate)
                fixer.changed = False
                rc, msgs, stderr = cargo_msgs(tool)
                errors = any(d.get("level") == "error" for d in msgs) or rc != 0
                unplaced = fixer.handle(msgs, errors)
                pub_now = sum(1 for m in crate.markers() if m.pub)
                if "--verbose" in args:
                    codes = {}
                    for d in msgs:
                        k = (d.get("code") or {}).get("code") or d.get("level")
                        codes[k] = codes.get(k, 0) + 1
                    print(f"    {codes}")
                print(f"  round {rounds} (cargo {tool}): {len(msgs)} diagnostics, "
                      f"{pub_now} pub so far, {time.time() - t0:.0f} s", flush=True)
                if fixer.changed:
                    if rounds > 40:
                        return restore(2, "no fixed point after 40 rounds")
                    continue
                if unplaced or rc != 0:
                    for d in unplaced[:20]:
                        print(show(d), file=sys.stderr)
                    if rc != 0 and not unplaced:
                        print(stderr[-4000:], file=sys.stderr)
                    return restore(1, f"cargo {tool} has diagnostics this script cannot place")
                break
    except BaseException:
        restore(3, "interrupted")
        raise
    # `pub(crate)` is longer than `pub`: let rustfmt rewrap what grew.
    subprocess.run(["cargo", "fmt"], cwd=ROOT, check=False)
    after_pub = sum(1 for m in crate.markers() if m.pub)
    print(f"tighten-visibility: before {before_pub} pub, {before_crate} pub(crate); "
          f"after {after_pub} pub, {len(markers) - after_pub} pub(crate) "
          f"({rounds} cargo runs, {time.time() - t0:.0f} s)")
    unused = [m for m in fixer.dead if m not in fixer.test_only]
    if fixer.dead:
        print("kept pub though nothing in the crate uses them (dead code; * = only unit tests use it):")
        for m in sorted(fixer.dead, key=lambda m: m.where()):
            star = "*" if m in fixer.test_only else " "
            what = f"{m.kind} {m.name}" if m.name else m.src.text[m.end:m.extent[1]].strip()
            what = " ".join(what.split())
            print(f"  {star} {m.where()}: {what[:100]}")
    reasons = {}
    for m in crate.markers():
        if m.pub:
            for w in m.why:
                reasons[w] = reasons.get(w, 0) + 1
    print("kept pub, by reason (an item may have several):")
    for w, n in sorted(reasons.items(), key=lambda x: -x[1]):
        print(f"  {n:5} {w}")
    if unused:
        # Dead code is deleted, not published: an item nothing calls (not
        # even a unit test) fails the run, with the files as they were.
        return restore(4, f"{len(unused)} items nothing uses (listed above without *): delete them")
    return 0


def src_text(m):
    return "pub" if m.src.text[m.start:m.end] == "pub" else "pub(crate)"


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
