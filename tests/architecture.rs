//! The module graph points inward: every `crate::` path in the library's
//! sources names a layer its module may use, as `src/lib.rs` states; and no
//! file reaches itself through the files it names.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each layer and the layers it may import (the rule of `src/lib.rs`).
const RULE: [(&str, &[&str]); 15] = [
    (
        "lambda",
        &[
            "distribution",
            "scheduled",
            "aggregates",
            "pool",
            "config",
            "clock",
        ],
    ),
    ("server", &["distribution", "security"]),
    (
        "startup",
        &["config", "secrets", "security", "pool", "aggregates"],
    ),
    (
        "config",
        &[
            "pool",
            "security",
            "extraction",
            "distribution",
            "aggregates",
        ],
    ),
    ("scheduled", &["aggregates", "pool", "clock"]),
    ("aggregates", &["secrets", "pool", "clock"]),
    ("secrets", &["security"]),
    (
        "distribution",
        &["extraction", "security", "httpapi", "pool"],
    ),
    ("extraction", &["security", "pool", "httpapi", "clock"]),
    ("security", &["pool", "httpapi"]),
    ("local", &["pool"]),
    ("httpapi", &[]),
    ("pool", &["clock"]),
    ("clock", &[]),
    ("telemetry", &[]),
];

/// The library's source files (not `src/bin/`), as paths relative to
/// `src/`.
fn library_files() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                if rel != "bin" {
                    stack.push(path);
                }
            } else if rel.ends_with(".rs") {
                files.push(rel);
            }
        }
    }
    files
}

/// `crate::<layer>` edges of every library source file, by the file's layer.
fn edges() -> BTreeMap<String, BTreeSet<(String, String)>> {
    let mut out: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for rel in library_files() {
        if rel == "lib.rs" || rel == "main.rs" {
            continue;
        }
        let layer = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        let text = std::fs::read_to_string(src.join(&rel)).unwrap();
        for (at, _) in text.match_indices("crate::") {
            let name: String = text[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != layer {
                out.entry(layer.clone())
                    .or_default()
                    .insert((name, rel.clone()));
            }
        }
    }
    out
}

/// Every edge is allowed by the rule, every layer has a rule, and the rule
/// itself is acyclic.
#[test]
fn imports_point_inward() {
    let rule: BTreeMap<&str, &[&str]> = RULE.into_iter().collect();
    let mut forbidden = Vec::new();
    for (layer, deps) in edges() {
        let allowed = rule
            .get(layer.as_str())
            .unwrap_or_else(|| panic!("layer `{layer}` has no rule in src/lib.rs and this test"));
        for (dep, file) in deps {
            if !allowed.contains(&dep.as_str()) {
                forbidden.push(format!("src/{file}: {layer} -> {dep}"));
            }
        }
    }
    assert!(
        forbidden.is_empty(),
        "edges the rule forbids:\n{}",
        forbidden.join("\n")
    );

    // Acyclic: layers can be removed in an order where each has no
    // remaining dependency.
    let mut left: BTreeMap<&str, BTreeSet<&str>> = rule
        .iter()
        .map(|(l, d)| (*l, d.iter().copied().collect()))
        .collect();
    while !left.is_empty() {
        let free: Vec<&str> = left
            .iter()
            .filter(|(_, d)| d.is_empty())
            .map(|(l, _)| *l)
            .collect();
        assert!(
            !free.is_empty(),
            "the rule has a cycle among {:?}",
            left.keys()
        );
        for l in free {
            left.remove(l);
            for d in left.values_mut() {
                d.remove(l);
            }
        }
    }
}

/// The test sees the edges it is about (it would pass vacuously otherwise).
#[test]
fn the_edges_are_found() {
    let edges = edges();
    assert!(edges["distribution"].iter().any(|(d, _)| d == "pool"));
    assert!(edges["extraction"].iter().any(|(d, _)| d == "httpapi"));
    assert!(edges["pool"].iter().all(|(d, _)| d == "clock"));
}

/// The sibling files each library file refers to (`super::<file>` and
/// `crate::<layer>::<file>` outside comments), by file: `pool/usage.rs`
/// -> `pool/query.rs`. A layer's `mod.rs` is its front door, not a node.
fn file_edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files: BTreeSet<String> = library_files()
        .into_iter()
        .filter(|rel| !rel.ends_with("mod.rs") && rel != "lib.rs")
        .collect();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut targets = BTreeSet::new();
        for (at, _) in code.match_indices("super::") {
            let name = ident(&code[at + "super::".len()..]);
            if !dir.is_empty() {
                targets.insert(format!("{dir}/{name}.rs"));
            }
        }
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let layer = ident(rest);
            if let Some(after) = rest[layer.len()..].strip_prefix("::") {
                targets.insert(format!("{layer}/{}.rs", ident(after)));
            }
        }
        targets.retain(|t| files.contains(t) && t != file);
        out.insert(file.clone(), targets);
    }
    out
}

/// No import circle between files either: `redis_pool -> query -> usage ->
/// redis_pool` was one (a type in the wrong file), and a circle makes every
/// file on it part of every other.
#[test]
fn no_file_imports_itself_through_others() {
    let edges = file_edges();
    assert!(
        edges["pool/usage.rs"].contains("pool/query.rs"),
        "the edges are found"
    );
    // Kahn: files drop out once nothing they name is left.
    let mut left = edges.clone();
    loop {
        let free: Vec<String> = left
            .iter()
            .filter(|(_, d)| d.is_empty())
            .map(|(f, _)| f.clone())
            .collect();
        if free.is_empty() {
            break;
        }
        for f in free {
            left.remove(&f);
            for d in left.values_mut() {
                d.remove(&f);
            }
        }
    }
    assert!(left.is_empty(), "files on an import circle: {left:#?}");
}

/// A problem is made in one place: outside `src/httpapi/` (which defines
/// it) only `src/distribution/problems.rs` names a `Problem` constructor;
/// every other layer answers with its own error value.
#[test]
fn problems_are_made_in_one_place() {
    let mut makers = Vec::new();
    for rel in library_files() {
        if rel.starts_with("httpapi/") || rel == "distribution/problems.rs" {
            continue;
        }
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(&rel))
                .unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("Problem::") || line.contains("Problem {") {
                makers.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        makers.is_empty(),
        "problems made outside src/distribution/problems.rs:\n{}",
        makers.join("\n")
    );
}
