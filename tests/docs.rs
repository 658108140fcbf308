//! The documentation holds together: every relative link and `#anchor` in
//! `README.md`, `docs/*.md` and `events/README.md` names a file that exists
//! and, for an anchor into Markdown, a heading of that file (by the slug
//! GitHub derives from it); the layer diagram in `docs/architecture.md`
//! is the module map at the top of `src/lib.rs`; and `docs/testing.md`
//! lists every file under `tests/`. (The contract's own checks are in
//! `tests/openapi.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files whose links are checked.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 5, "docs/ holds the documentation: {docs:?}");
    docs.push(root().join("README.md"));
    docs.push(root().join("events/README.md"));
    docs
}

/// The text outside fenced code blocks, line for line (a fenced line is
/// left empty), with the inside of every code span replaced by `x`, so
/// neither is read as a heading or a link.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match fence {
            Some(marker) => {
                if trimmed.starts_with(marker) {
                    fence = None;
                }
            }
            None if trimmed.starts_with("```") => fence = Some("```"),
            None if trimmed.starts_with("~~~") => fence = Some("~~~"),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    blank_code_spans(&out)
}

/// Replaces what stands between a run of backticks and the next run of the
/// same length with `x` (an unclosed run is left as it is).
fn blank_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        let body = i + run;
        let close = (body..chars.len()).find(|&j| {
            chars[j..].iter().take_while(|c| **c == '`').count() == run
                && (j == 0 || chars[j - 1] != '`')
        });
        match close {
            Some(j) => {
                out.extend(std::iter::repeat_n('`', run));
                out.extend(
                    chars[body..j]
                        .iter()
                        .map(|c| if *c == '\n' { '\n' } else { 'x' }),
                );
                out.extend(std::iter::repeat_n('`', run));
                i = j + run;
            }
            None => {
                out.extend(std::iter::repeat_n('`', run));
                i = body;
            }
        }
    }
    out
}

/// The anchor GitHub gives a heading: its rendered text (code spans,
/// emphasis and link targets dropped) lowercased, letters, digits, `_` and
/// `-` kept, each space a `-`, everything else dropped.
fn slug(heading: &str) -> String {
    let mut rendered = String::new();
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        let end = rest[at..].find(')').map_or(rest.len(), |e| at + e + 1);
        rendered.push_str(&rest[..at]);
        rest = &rest[end..];
    }
    rendered.push_str(rest);
    rendered
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file: the slug of each ATX heading outside
/// code, a repeated slug numbered `-1`, `-2`, ... as GitHub does.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = !fence;
            continue;
        }
        let level = trimmed.chars().take_while(|c| *c == '#').count();
        if fence || level == 0 || level > 6 || !trimmed[level..].starts_with(' ') {
            continue;
        }
        let base = slug(&trimmed[level..].replace('`', ""));
        let mut candidate = base.clone();
        let mut n = 0;
        while seen.contains(&candidate) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        seen.insert(candidate);
    }
    seen
}

/// Link targets in a document's prose: inline links and images
/// (`[text](target)`), and reference definitions (`[label]: target`).
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut targets = Vec::new();
    for (at, _) in prose.match_indices("](") {
        let rest = &prose[at + 2..];
        let end = rest
            .find(|c: char| c == ')' || c.is_whitespace())
            .unwrap_or(rest.len());
        targets.push(rest[..end].trim_matches(['<', '>']).to_owned());
    }
    for line in prose.lines() {
        let line = line.trim_start();
        if line.starts_with('[')
            && let Some(close) = line.find("]:")
            && !line[..close].contains("](")
        {
            let target = line[close + 2..].split_whitespace().next().unwrap_or("");
            targets.push(target.to_owned());
        }
    }
    targets
}

/// `path`, with `.` and `..` folded, if it stays inside the repository.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out.starts_with(root()).then_some(out)
}

/// The links of `text` (as if it were the file `doc`) that do not resolve,
/// each with the reason.
fn broken_links(doc: &Path, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for target in link_targets(text) {
        if target.is_empty() {
            broken.push("an empty link target".to_owned());
            continue;
        }
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let file = if path.is_empty() {
            doc.to_path_buf()
        } else if path.starts_with('/') {
            broken.push(format!(
                "{target}: absolute links break outside GitHub's tree view"
            ));
            continue;
        } else {
            match normalise(&doc.parent().unwrap().join(path)) {
                Some(file) => file,
                None => {
                    broken.push(format!("{target}: outside the repository"));
                    continue;
                }
            }
        };
        if !path.is_empty() && !file.exists() {
            broken.push(format!("{target}: no such file"));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if file.extension().is_some_and(|e| e == "md") {
            let heading_text = if file == doc {
                text.to_owned()
            } else {
                std::fs::read_to_string(&file).unwrap()
            };
            if !anchors(&heading_text).contains(anchor) {
                broken.push(format!("{target}: no heading with that anchor"));
            }
        } else {
            let line_anchor = anchor.split('-').all(|part| {
                part.len() > 1
                    && part.starts_with('L')
                    && part[1..].bytes().all(|b| b.is_ascii_digit())
            });
            if !line_anchor {
                broken.push(format!(
                    "{target}: an anchor into a file that is not Markdown"
                ));
            }
        }
    }
    broken
}

/// Every relative link and anchor of the documentation resolves.
#[test]
fn every_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        checked += link_targets(&text).len();
        let rel = doc.strip_prefix(root()).unwrap().display().to_string();
        broken.extend(
            broken_links(&doc, &text)
                .into_iter()
                .map(|b| format!("{rel}: {b}")),
        );
    }
    assert!(
        checked > 30,
        "only {checked} links found: the parser is blind"
    );
    assert!(
        broken.is_empty(),
        "links that do not resolve:\n{}",
        broken.join("\n")
    );
}

/// The checker itself tells a good link from each kind of bad one.
#[test]
fn the_checker_finds_each_kind_of_broken_link() {
    let doc = root().join("docs/example.md");
    let text = "# Here\n\
        [ok](guarantees.md#replication-what-a-missing-acknowledgement-gets) [ok](#here)\n\
        [ok](../lua/extract.lua) [ok](../README.md#configuration)\n\
        [missing file](nowhere.md) [missing anchor](guarantees.md#nowhere)\n\
        [missing here](#there) [code anchor](../lua/extract.lua#keys)\n\
        [outside](../../etc/passwd) [across\nlines](operations.md#no-such-section)\n\
        [ref]: deploy.md#nor-this\n\
        `[in code](nowhere.md)`\n\
        ```\n[in a fence](nowhere.md)\n# not a heading\n```\n";
    let broken = broken_links(&doc, text);
    assert_eq!(broken.len(), 7, "{broken:#?}");
    for (bad, why) in [
        ("nowhere.md", "no such file"),
        ("guarantees.md#nowhere", "no heading"),
        ("#there", "no heading"),
        ("../lua/extract.lua#keys", "not Markdown"),
        ("../../etc/passwd", "outside"),
        ("operations.md#no-such-section", "no heading"),
        ("deploy.md#nor-this", "no heading"),
    ] {
        assert!(
            broken
                .iter()
                .any(|b| b.starts_with(&format!("{bad}:")) && b.contains(why)),
            "{bad} ({why}) not reported: {broken:#?}"
        );
    }
}

/// Slugs as GitHub makes them, repeats numbered.
#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Replication: what a missing acknowledgement gets"),
        "replication-what-a-missing-acknowledgement-gets"
    );
    assert_eq!(
        slug("Status codes, in the order the checks run"),
        "status-codes-in-the-order-the-checks-run"
    );
    assert_eq!(
        slug("`proxy-pool bench` and its_cells"),
        "proxy-pool-bench-and-its_cells"
    );
    assert_eq!(slug("See [the tests](testing.md)"), "see-the-tests");
    let found = anchors("# A\n## A\n### A b\n```\n# A\n```\n");
    let expected: BTreeSet<String> = ["a", "a-1", "a-b"].map(String::from).into();
    assert_eq!(found, expected);
}

/// The `[`layer`] → a, b, c:` lines of the module map in `src/lib.rs`.
fn module_map() -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let mut layers = BTreeSet::new();
    let mut edges = BTreeSet::new();
    for line in lib.lines() {
        let Some(item) = line.strip_prefix("//! * [`") else {
            continue;
        };
        let (layer, rest) = item.split_once("`]").unwrap();
        layers.insert(layer.to_owned());
        if let Some(deps) = rest.strip_prefix(" → ") {
            let deps = deps.split(':').next().unwrap();
            for dep in deps.split(',') {
                edges.insert((layer.to_owned(), dep.trim().to_owned()));
            }
        }
    }
    (layers, edges)
}

/// The nodes and `a --> b` edges of the first Mermaid block after the
/// heading `## The module layers` in `docs/architecture.md`.
fn drawn_layers() -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let section = doc
        .split_once("\n## The module layers\n")
        .expect("docs/architecture.md has a section `## The module layers`")
        .1;
    let block = section
        .split_once("```mermaid\n")
        .expect("that section has a Mermaid diagram")
        .1
        .split_once("```")
        .unwrap()
        .0;
    let mut nodes = BTreeSet::new();
    let mut edges = BTreeSet::new();
    for line in block
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        match line.split_once("-->") {
            Some((from, to)) => {
                let (from, to) = (from.trim().to_owned(), to.trim().to_owned());
                nodes.insert(from.clone());
                nodes.insert(to.clone());
                edges.insert((from, to));
            }
            None => {
                nodes.insert(line.to_owned());
            }
        }
    }
    (nodes, edges)
}

/// The layer diagram draws exactly the layers and imports `src/lib.rs`
/// allows (the rule `tests/architecture.rs` enforces on the code).
#[test]
fn the_layer_diagram_is_the_module_map() {
    let (layers, allowed) = module_map();
    assert!(
        layers.len() >= 10 && allowed.len() >= 20,
        "{layers:?} {allowed:?}"
    );
    let (nodes, drawn) = drawn_layers();
    assert_eq!(nodes, layers, "layers drawn vs layers in src/lib.rs");
    let missing: Vec<_> = allowed.difference(&drawn).collect();
    let extra: Vec<_> = drawn.difference(&allowed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/architecture.md's diagram differs from src/lib.rs: missing {missing:?}, not allowed {extra:?}"
    );
}

/// The files under `tests/` a newcomer should find in docs/testing.md: the
/// test files (`tests/*.rs`), the harness (`tests/common/*.rs`) and the
/// Python client (`tests/python/*.py`), as paths from the repository root.
fn test_files() -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    for (dir, ext) in [
        ("tests", "rs"),
        ("tests/common", "rs"),
        ("tests/python", "py"),
    ] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() && path.extension().is_some_and(|e| e == ext) {
                let name = path.file_name().unwrap().to_str().unwrap();
                files.insert(format!("{dir}/{name}"));
            }
        }
    }
    files
}

/// The files docs/testing.md gives a row of their own: the code span
/// opening a table row (`` | `tests/extract.rs` | ... ``).
fn listed_test_files(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |"))
        .map(|(path, _)| path.to_owned())
        .filter(|path| path.starts_with("tests/"))
        .collect()
}

/// docs/testing.md gives every file under `tests/` a row of its own, each
/// test file saying what it proves (and the harness and the Python client
/// what they are), and lists no file that is gone.
#[test]
fn the_testing_page_lists_every_test_file() {
    let page = std::fs::read_to_string(root().join("docs/testing.md")).unwrap();
    let listed = listed_test_files(&page);
    let present = test_files();
    assert!(present.len() > 30, "{present:?}");
    let missing: Vec<_> = present.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "docs/testing.md lists no row for {missing:?}"
    );
    let gone: Vec<_> = listed.difference(&present).collect();
    assert!(
        gone.is_empty(),
        "docs/testing.md lists {gone:?}, which are not under tests/"
    );
    assert_eq!(
        listed_test_files("| `tests/a.rs` | x |\nsee `tests/b.rs` |\n| `scripts/c.sh` | y |"),
        BTreeSet::from(["tests/a.rs".to_owned()])
    );
}
