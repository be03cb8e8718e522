//! The engine's layers (docs/ENGINE.md, "The engine's shape"), checked: every source file
//! of `crates/sbod-core/src` is a module in [`LAYERS`], and a module imports (`crate::...`,
//! `super::...`, in `use` items or in paths) only modules of its own layer or of layers
//! below it. A file missing from the table, a path to a module the table does not know,
//! or an import from a higher layer fails the test, naming both modules.
//!
//! The table mirrors docs/ENGINE.md's: change both together.
//!
//! Hand-written (a few lines of path scanning, no parser crate): the engine's code is
//! rustfmt-formatted, and a path that would hide from this scan (a macro building one)
//! does not exist in it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Layer of every module, from the bottom: a module may use its own layer and those with
/// a smaller number. Module paths as `crate::` spells them ("" is the crate root).
const LAYERS: &[(u32, &str, &[&str])] = &[
    (0, "foundation", &["error", "tuning"]),
    (1, "geometry and map", &["layout", "placement"]),
    (
        2,
        "on-disk records",
        &[
            "superblock",
            "freshness",
            "bitmap",
            "signature",
            "reason",
            "log::format",
        ],
    ),
    (
        3,
        "members",
        &[
            "buf",
            "dev",
            "dev::file",
            "dev::mem",
            "dev::uring",
            "locks",
            "member",
            "integrity",
            "integrity::tests",
            "log",
            "log::slot",
            "owner",
            "sync",
            "fault",
        ],
    ),
    (
        4,
        "data path",
        &["datapath", "datapath::intent", "datapath::tags"],
    ),
    (
        5,
        "RAID families",
        &[
            "family",
            "family::plain",
            "family::mirror",
            "family::parity",
            "family::parity::coalesce",
            "family::plan",
        ],
    ),
    (
        6,
        "the array",
        &[
            "array",
            "array::create",
            "array::assemble",
            "array::membership",
            "array::grow",
            "array::ownership",
            "array::log",
            "array::persist",
            "array::io",
            "array::status",
            "array::sync",
            "array::process",
            "array::process::rebuild",
            "array::process::reshape",
            "array::process::scrub",
            "array::process::spare",
            "array::process::verify",
        ],
    ),
];

/// Upward imports allowed by name: none. (Issue 30's second phase moved the `impl Array`
/// blocks of `sync.rs` and `log/attach.rs` under `array/` and the checksum record into
/// `superblock.rs`, which ended the two circles phase 1 listed here.) The checker still
/// takes a list, so that a circle can only come back by being named here.
const KNOWN_CIRCLES: &[(&str, &str)] = &[];

fn layer_of() -> BTreeMap<&'static str, u32> {
    let mut m = BTreeMap::new();
    for (n, _, mods) in LAYERS {
        for x in *mods {
            assert!(m.insert(*x, *n).is_none(), "{x} is listed twice");
        }
    }
    m
}

/// The module a source file is: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] {
        parts.clear();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code without comments (line comments, doc comments and block comments): a doc
/// link to another module is no import.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let (mut i, mut in_str) = (0, false);
    while i < b.len() {
        if in_str {
            if b[i] == b'\\' {
                out.push_str(&text[i..i + 2]);
                i += 2;
                continue;
            }
            if b[i] == b'"' {
                in_str = false;
            }
            out.push(b[i] as char);
            i += 1;
        } else if b[i] == b'\'' {
            // A char literal ('"', '\'', '\n') is kept whole, so its quote opens no
            // string; a lifetime ('a) is just copied.
            let lit = if b.get(i + 1) == Some(&b'\\') {
                text[i + 3..].find('\'').map(|e| i + 3 + e + 1)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 3)
            } else {
                None
            };
            let end = lit.unwrap_or(i + 1);
            out.push_str(&text[i..end]);
            i = end;
        } else if b[i] == b'"' {
            in_str = true;
            out.push('"');
            i += 1;
        } else if text[i..].starts_with("//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if text[i..].starts_with("/*") {
            let end = text[i..].find("*/").map_or(b.len(), |e| i + e + 2);
            i = end;
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Inline modules (`mod tests { ... }`) in `code`: (name, byte range of the body).
fn inline_modules(code: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("mod ") {
        let i = from + at;
        from = i + 4;
        if i > 0 && {
            let p = code.as_bytes()[i - 1];
            p.is_ascii_alphanumeric() || p == b'_'
        } {
            continue;
        }
        let name = ident_at(&code[i + 4..]);
        let after = code[i + 4 + name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue; // `mod x;`: a file of its own
        }
        let open = code.len() - after.len();
        let mut depth = 0;
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((name.to_string(), open..open + k));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Every path a `crate::`/`super::` prefix leads to in `code`, as module-relative segments
/// (with `super` resolved against `module` and the inline modules around it), a `use`
/// group (`{a::B, c}`) expanded.
fn paths_in(code: &str, module: &str) -> Vec<Vec<String>> {
    let inline = inline_modules(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let prev_ident = i > 0 && {
            let p = code.as_bytes()[i - 1];
            p.is_ascii_alphanumeric() || p == b'_' || p == b':'
        };
        let base: Option<(Vec<String>, usize)> = if prev_ident {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("super::") {
            let mut segs: Vec<String> = module
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            segs.extend(
                inline
                    .iter()
                    .filter(|(_, r)| r.contains(&i))
                    .map(|(n, _)| n.clone()),
            );
            let mut at = 0;
            while rest[at..].starts_with("super::") {
                segs.pop();
                at += "super::".len();
            }
            Some((segs, at))
        } else {
            None
        };
        match base {
            Some((segs, at)) => {
                let used = expand(&rest[at..], segs, &mut out);
                i += at + used.max(1);
            }
            None => i += rest.chars().next().unwrap().len_utf8(),
        }
    }
    out
}

/// Read a path (or a `{...}` group) at the start of `s` after the prefix `segs`; push each
/// full path to `out`; return the bytes read.
fn expand(s: &str, mut segs: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut i = 0;
    loop {
        let rest = &s[i..];
        if rest.starts_with('{') {
            // A group: its items split at its own commas, each a path after `segs`.
            let (mut depth, mut start) = (0, 1);
            for (k, c) in rest.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        let item = rest[start..k].trim();
                        if !item.is_empty() {
                            expand(item, segs.clone(), out);
                        }
                        start = k + 1;
                        if c == '}' {
                            return i + k + 1;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return s.len();
        }
        let id = ident_at(rest);
        if id.is_empty() || id == "self" {
            // `a::*`, `a::{self}`: the module itself.
            if !segs.is_empty() {
                out.push(segs);
            }
            return i + id.len();
        }
        segs.push(id.to_string());
        i += id.len();
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            out.push(segs);
            return i;
        }
    }
}

/// The module a path names: its longest prefix that is a module of the table.
fn target<'a>(path: &[String], table: &BTreeMap<&'a str, u32>) -> Option<&'a str> {
    (1..=path.len())
        .rev()
        .find_map(|n| table.get_key_value(path[..n].join("::").as_str()))
        .map(|(k, _)| *k)
}

struct Finding {
    upward: Vec<String>,
    unknown: Vec<String>,
}

fn check(src: &Path, allowed: &[(&str, &str)]) -> Finding {
    let table = layer_of();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut f = Finding {
        upward: Vec::new(),
        unknown: Vec::new(),
    };
    let mut used_allowances = std::collections::BTreeSet::new();
    for file in &files {
        let module = module_of(src, file);
        if module.is_empty() {
            continue; // lib.rs declares the modules and re-exports; it is no layer.
        }
        let Some(&mine) = table.get(module.as_str()) else {
            f.unknown.push(format!(
                "{} (module {module}) is in no layer of the table",
                file.display()
            ));
            continue;
        };
        let code = strip_comments(&std::fs::read_to_string(file).unwrap());
        let mut seen = std::collections::BTreeSet::new();
        for p in paths_in(&code, &module) {
            if p.is_empty() {
                continue;
            }
            let Some(to) = target(&p, &table) else {
                f.unknown.push(format!(
                    "{module} names crate::{}, in no layer of the table",
                    p.join("::")
                ));
                continue;
            };
            let theirs = table[to];
            if theirs > mine && seen.insert(to) {
                if allowed.contains(&(module.as_str(), to)) {
                    used_allowances.insert((module.clone(), to));
                    continue;
                }
                f.upward.push(format!(
                    "{module} (layer {mine}) imports {to} (layer {theirs} > {mine})"
                ));
            }
        }
    }
    for (a, b) in allowed {
        if !used_allowances.contains(&(a.to_string(), *b)) {
            f.upward.push(format!(
                "{a} -> {b} is allowed as a known circle but no longer exists: take it off KNOWN_CIRCLES"
            ));
        }
    }
    f
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_module_imports_only_from_its_layer_or_below() {
    let f = check(&src(), KNOWN_CIRCLES);
    assert!(
        f.unknown.is_empty() && f.upward.is_empty(),
        "the engine's layers (docs/ENGINE.md) are broken:\n{}\n{}",
        f.unknown.join("\n"),
        f.upward.join("\n")
    );
}

/// Negative control: the checker sees an upward import, in every form the engine writes
/// one (a `use` path, a `use` group, a path in code, `super::`), and ignores comments.
#[test]
fn the_checker_finds_upward_imports() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let table = layer_of();
    for m in table.keys() {
        let parts: Vec<&str> = m.split("::").collect();
        let file = src.join(parts.join("/")).with_extension("rs");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "").unwrap();
    }
    let put = |m: &str, text: &str| {
        let file = src.join(m.replace("::", "/")).with_extension("rs");
        std::fs::write(file, text).unwrap();
    };
    // Clean: downward imports and comments naming higher layers.
    put(
        "family::plan",
        "//! see [`crate::array`]\nuse crate::{error::Error, layout::Geometry};\n/* crate::sync */\n",
    );
    let f = check(src, &[]);
    assert!(
        f.upward.is_empty() && f.unknown.is_empty(),
        "{:?} {:?}",
        f.upward,
        f.unknown
    );
    // Each form of an upward import is found and named.
    put(
        "layout",
        "use crate::{error::Error, dev::{self, IoClass}};\n",
    );
    put("buf", "fn f() { crate::datapath::all_done(); }\n");
    put(
        "family::parity::coalesce",
        "use super::super::super::array::Array;\n",
    );
    put("placement", "use crate::nowhere::Thing;\n");
    let f = check(src, &[]);
    let all = f.upward.join("\n");
    assert!(
        all.contains("layout (layer 1) imports dev (layer 3 > 1)"),
        "{all}"
    );
    assert!(
        all.contains("buf (layer 3) imports datapath (layer 4 > 3)"),
        "{all}"
    );
    assert!(
        all.contains("family::parity::coalesce (layer 5) imports array (layer 6 > 5)"),
        "{all}"
    );
    assert_eq!(f.upward.len(), 3, "{all}");
    assert!(
        f.unknown
            .iter()
            .any(|u| u.contains("crate::nowhere::Thing")),
        "{:?}",
        f.unknown
    );
    // A known circle is let through only while it exists.
    let f = check(src, &[("layout", "dev"), ("sync", "array")]);
    assert!(
        !f.upward.iter().any(|u| u.contains("layout (layer 1)")),
        "{:?}",
        f.upward
    );
    assert!(
        f.upward
            .iter()
            .any(|u| u.contains("sync -> array is allowed")),
        "{:?}",
        f.upward
    );
    // A file in no layer is named.
    std::fs::write(src.join("stray.rs"), "").unwrap();
    let f = check(src, &[]);
    assert!(
        f.unknown.iter().any(|u| u.contains("module stray")),
        "{:?}",
        f.unknown
    );
}
