//! The module graph points inward: every `crate::` path in the library's
//! sources names a layer its module may use, as `src/lib.rs` states; no
//! file reaches itself through the files it names; and the Lambda is built
//! without the `local` tools.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[path = "architecture/graph.rs"]
mod graph;
use graph::{circles, file_graph, sources};

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
    ("scheduled", &["aggregates", "pool", "clock"]),
    ("aggregates", &["secrets", "pool", "clock", "config"]),
    ("secrets", &["security"]),
    (
        "distribution",
        &["extraction", "security", "httpapi", "pool", "config"],
    ),
    (
        "extraction",
        &["security", "pool", "httpapi", "clock", "config"],
    ),
    ("security", &["pool", "httpapi", "config"]),
    ("local", &["pool"]),
    ("httpapi", &[]),
    ("pool", &["clock", "config"]),
    ("config", &[]),
    ("clock", &[]),
    ("telemetry", &[]),
];

/// The library's source files (not `src/bin/`), by their paths relative
/// to `src/`, with their text.
fn library_sources() -> impl Iterator<Item = (String, String)> {
    sources()
        .into_iter()
        .filter(|(rel, _)| !rel.starts_with("bin/"))
}

/// `crate::<layer>` edges of every library source file, by the file's layer.
fn edges() -> BTreeMap<String, BTreeSet<(String, String)>> {
    let mut out: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (rel, text) in library_sources() {
        if rel == "lib.rs" || rel == "main.rs" {
            continue;
        }
        let layer = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
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
    assert!(edges["pool"].iter().any(|(d, _)| d == "config"));
    assert!(!edges.contains_key("config"), "config is a leaf");
}

/// No file under `src/` reaches itself through the files it names (the
/// binaries included): a circle makes every file on it part of every other,
/// so none can be read, moved or tested alone. `redis_pool -> query ->
/// usage -> redis_pool` was one (a type in the wrong file); so was each
/// `mod.rs` that defined items its children used while it used theirs
/// (now the shared items have files of their own, and a `mod.rs` is its
/// module's map and re-exports). No circle is tolerated.
#[test]
fn no_file_reaches_itself() {
    let edges = file_graph(&sources());
    // The graph sees what it is about: `super::`, `crate::` in a binary,
    // a re-export followed to the defining file, a front door that only
    // re-exports depending on nothing.
    assert!(edges["bin/proxy-pool/stats.rs"].contains_key("bin/proxy-pool/inventory.rs"));
    assert!(edges["bin/proxy-pool/bench/cell.rs"].contains_key("bin/proxy-pool/bench/caller.rs"));
    assert!(edges["distribution/readiness.rs"].contains_key("distribution/app.rs"));
    assert!(edges["lambda.rs"].contains_key("distribution/app.rs"));
    assert!(edges["distribution/mod.rs"].is_empty());
    let found: Vec<String> = circles(&edges)
        .into_iter()
        .map(|(group, text)| format!("{text}\n  (the group: {})", group.join(", ")))
        .collect();
    assert!(
        found.is_empty(),
        "import circles (each file, then the name that leads to it):\n{}",
        found.join("\n")
    );
}

/// The circle check fails on a circle, through a re-export and through a
/// binary's `crate::`, and ignores comments, strings and a file's tests.
#[test]
fn a_circle_is_caught() {
    let sources: BTreeMap<String, String> = [
        (
            "lib.rs",
            "mod a;\nmod b;\npub use b::Shared;\n#[cfg(test)]\nmod checks;\n",
        ),
        ("checks.rs", "use crate::a::A;\n"),
        (
            "a.rs",
            "use crate::Shared;\npub struct A(Shared);\n#[cfg(test)]\nmod tests {\n    use crate::b::*;\n}\n",
        ),
        (
            "b.rs",
            "// crate::a::A\npub struct Shared;\npub fn f() -> crate::a::A { let _ = \"crate::a\"; todo!() }\n",
        ),
        ("bin/tool/main.rs", "mod run;\nmod words;\nfn main() { run::go() }\n"),
        ("bin/tool/run.rs", "use crate::words::Word;\npub fn go() {}\n"),
        ("bin/tool/words.rs", "pub struct Word;\n/// [`crate::run::go`]\nfn f() {}\n"),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_owned(), t.to_owned()))
    .collect();
    let edges = file_graph(&sources);
    let found: Vec<String> = circles(&edges).into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        found,
        ["a.rs -> b.rs (Shared) -> a.rs (A)"],
        "edges: {edges:#?}"
    );
    assert!(!edges["lib.rs"].contains_key("b.rs"), "a pure re-export");
    assert_eq!(
        edges["bin/tool/run.rs"].keys().collect::<Vec<_>>(),
        ["bin/tool/words.rs"]
    );
    assert!(edges["bin/tool/words.rs"].is_empty(), "a doc comment");
}

/// A problem is made in one place: outside `src/httpapi/` (which defines
/// it) only `src/distribution/problems.rs` names a `Problem` constructor;
/// every other layer answers with its own error value.
#[test]
fn problems_are_made_in_one_place() {
    let mut makers = Vec::new();
    for (rel, text) in library_sources() {
        if rel.starts_with("httpapi/") || rel == "distribution/problems.rs" {
            continue;
        }
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

/// The `key = value` lines of one `[table]` of `Cargo.toml`, by key.
fn manifest_table(name: &str) -> BTreeMap<String, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let manifest = std::fs::read_to_string(path).unwrap();
    let mut table = BTreeMap::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{name}]");
        } else if let (true, Some((key, value))) = (inside, line.split_once('=')) {
            table.insert(key.trim().to_owned(), value.trim().to_owned());
        }
    }
    table
}

/// The test tools of `src/local/` (the relay, the private `redis-server`,
/// the synthetic proxies) are behind the `local` feature: on by default,
/// required by the CLI, and off in the Lambda's build, which `sam build`
/// makes with `cargo lambda build` reading `[package.metadata.lambda.build]`
/// (the full test run's `sam build` proves the Lambda compiles without it).
#[test]
fn the_lambda_is_built_without_the_local_tools() {
    let features = manifest_table("features");
    assert_eq!(features["default"], r#"["local"]"#);
    assert_eq!(
        manifest_table("package.metadata.lambda.build")["no_default_features"],
        "true"
    );
    let read = |rel: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
    };
    assert!(read("src/lib.rs").contains("#[cfg(feature = \"local\")]\npub mod local;"));
    // No layer may name `local` (the rule above), nor the Lambda's entrypoint.
    let rule: BTreeMap<&str, &[&str]> = RULE.into_iter().collect();
    assert!(rule.values().all(|deps| !deps.contains(&"local")));
    assert!(!read("src/main.rs").contains("local::"));
}
