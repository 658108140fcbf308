//! The documentation holds together: every relative link and `#anchor` in
//! `README.md`, `docs/*.md` and `events/README.md` names a file that exists
//! and, for an anchor into Markdown, a heading of that file (by the slug
//! GitHub derives from it); the layer diagram in `docs/architecture.md`
//! is the module map at the top of `src/lib.rs`; and the contract
//! (`api/openapi/proxy-pool.yaml`) and `docs/errors.md` document exactly
//! the problem codes the service can answer; and `docs/testing.md` lists
//! every file under `tests/`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use proxy_pool::httpapi::Code;
use serde_json::Value;

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

/// The contract, as JSON.
fn contract() -> Value {
    let yaml = std::fs::read_to_string(root().join("api/openapi/proxy-pool.yaml")).unwrap();
    serde_yaml::from_str(&yaml).unwrap()
}

/// `value`'s strings (an array of strings), as a set.
fn strings(value: &Value) -> BTreeSet<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// The code named `text`.
fn code_named(text: &str) -> Code {
    *Code::ALL
        .iter()
        .find(|c| c.as_str() == text)
        .unwrap_or_else(|| panic!("the service never answers the code {text}"))
}

/// `r`, or what its `$ref` points to in `doc`.
fn resolve<'a>(doc: &'a Value, r: &'a Value) -> &'a Value {
    match r["$ref"].as_str() {
        Some(to) => doc.pointer(to.trim_start_matches('#')).unwrap(),
        None => r,
    }
}

/// Every problem response of the contract: where it is, the status it is
/// listed under (none for a response of `components` on its own), and the
/// response, `$ref`s resolved.
fn problem_responses(doc: &Value) -> Vec<(String, Option<u16>, &Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, r) in op["responses"].as_object().unwrap() {
                out.push((
                    format!("{method} {path} {status}"),
                    Some(status.parse().unwrap()),
                    resolve(doc, r),
                ));
            }
        }
    }
    for (name, r) in doc["components"]["responses"].as_object().unwrap() {
        out.push((format!("components/responses/{name}"), None, r));
    }
    out.retain(|(_, _, r)| !r["content"]["application/problem+json"].is_null());
    out
}

/// A problem response's status and codes (the `allOf` restricting the
/// `Problem` schema), checked against the service's, and its examples:
/// one per code, each with the code's status, `type` and `title`.
fn check_problem_response(at: &str, listed: Option<u16>, response: &Value) -> BTreeSet<String> {
    let media = &response["content"]["application/problem+json"];
    let all_of = &media["schema"]["allOf"];
    assert_eq!(all_of[0]["$ref"], "#/components/schemas/Problem", "{at}");
    let status = all_of[1]["properties"]["status"]["const"].as_u64().unwrap() as u16;
    if let Some(listed) = listed {
        assert_eq!(status, listed, "{at}: listed under another status");
    }
    let codes = strings(&all_of[1]["properties"]["code"]["enum"]);
    let examples = media["examples"].as_object().unwrap();
    let shown: BTreeSet<String> = examples.keys().cloned().collect();
    assert_eq!(shown, codes, "{at}: one example per code");
    for (name, example) in examples {
        let code = code_named(name);
        let v = &example["value"];
        assert_eq!(
            code.status().as_u16(),
            status,
            "{at}: {name} is answered with another status"
        );
        assert_eq!(v["code"], name.as_str(), "{at}");
        assert_eq!(v["status"], status, "{at}: {name}");
        assert_eq!(v["type"], code.type_uri().as_str(), "{at}: {name}");
        assert_eq!(v["title"], code.title(), "{at}: {name}");
        assert!(
            v["detail"].is_string() && v["requestId"].is_string(),
            "{at}: {name}"
        );
    }
    codes
}

/// The contract documents every code the service can answer and no other:
/// the `Problem` schema's `code` enum is [`Code::ALL`]; each problem
/// response restricts status and codes, each code under its own status,
/// with an example per code; every operation lists the statuses any
/// request can meet (400, 431, 500); and `docs/errors.md` names every code.
#[test]
fn the_contract_documents_every_problem_code() {
    let doc = contract();
    let service: BTreeSet<String> = Code::ALL.iter().map(|c| c.as_str().to_owned()).collect();
    assert_eq!(service.len(), Code::ALL.len(), "a code listed twice");
    assert_eq!(service.len(), 18, "{service:?}");
    let enumerated =
        strings(&doc["components"]["schemas"]["Problem"]["properties"]["code"]["enum"]);
    let missing: Vec<_> = service.difference(&enumerated).collect();
    let extra: Vec<_> = enumerated.difference(&service).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the Problem schema's code enum lacks {missing:?} and lists {extra:?}, which the service never answers"
    );
    let mut documented = BTreeSet::new();
    for (at, listed, response) in problem_responses(&doc) {
        documented.extend(check_problem_response(&at, listed, response));
    }
    assert_eq!(documented, service, "codes with a documented response");
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for status in ["400", "431", "500"] {
                assert!(
                    !op["responses"][status].is_null(),
                    "{method} {path} lists no {status}"
                );
            }
        }
    }
    let errors = std::fs::read_to_string(root().join("docs/errors.md")).unwrap();
    for code in &service {
        assert!(
            errors.contains(&format!("`{code}`")),
            "docs/errors.md does not name {code}"
        );
    }
}

/// `segment` as one JSON-pointer segment (RFC 6901).
fn pointer_segment(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// One example of the contract: where it is, the JSON pointer of the
/// schema it must satisfy, and its value.
struct Example {
    at: String,
    schema: String,
    value: Value,
}

/// Every example under `value` (at JSON pointer `at` of the contract): a
/// media type's, parameter's or header's `example` and `examples` (each
/// `value`) against its `schema`; a schema's own `example` and `examples`
/// (an array, JSON Schema's) against that schema.
fn examples_under(value: &Value, at: &str, out: &mut Vec<Example>) {
    let Some(object) = value.as_object() else {
        if let Some(items) = value.as_array() {
            for (i, item) in items.iter().enumerate() {
                examples_under(item, &format!("{at}/{i}"), out);
            }
        }
        return;
    };
    let schema = if object.contains_key("schema") {
        format!("{at}/schema")
    } else {
        at.to_owned()
    };
    if let Some(example) = object.get("example") {
        out.push(Example {
            at: format!("{at}/example"),
            schema: schema.clone(),
            value: example.clone(),
        });
    }
    match object.get("examples") {
        Some(Value::Object(named)) => {
            for (name, example) in named {
                let value = example
                    .get("value")
                    .unwrap_or_else(|| panic!("{at}/examples/{name} has no value"));
                out.push(Example {
                    at: format!("{at}/examples/{}", pointer_segment(name)),
                    schema: schema.clone(),
                    value: value.clone(),
                });
            }
        }
        Some(Value::Array(values)) => {
            for (i, value) in values.iter().enumerate() {
                out.push(Example {
                    at: format!("{at}/examples/{i}"),
                    schema: schema.clone(),
                    value: value.clone(),
                });
            }
        }
        _ => {}
    }
    for (key, child) in object {
        if key != "example" && key != "examples" {
            examples_under(child, &format!("{at}/{}", pointer_segment(key)), out);
        }
    }
}

/// The errors of `instance` against the schema at `pointer` of `doc`
/// (JSON Schema 2020-12, as OpenAPI 3.1 reads it; formats checked).
fn schema_errors(doc: &Value, pointer: &str, instance: &Value) -> Vec<String> {
    let mut root = doc.clone();
    root["$ref"] = Value::String(format!("#{pointer}"));
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&root)
        .unwrap_or_else(|e| panic!("the schema at {pointer} does not build: {e}"));
    validator
        .iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// The seed contract's examples (`/work/shared/seeds/proxy-pool.openapi.yaml`,
/// which the contract started as), each with the schema it stands under.
fn seed_examples() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/paths/~1api~1v1~1proxies~1extract/post/requestBody/content/application~1json/schema",
            serde_json::json!({"count": 5, "fulfillment": "partial",
                "filters": {"protocols": ["http"], "regions": ["shanghai"]}}),
        ),
        (
            "/paths/~1api~1v1~1proxies~1extract/post/requestBody/content/application~1json/schema",
            serde_json::json!({"count": 10, "fulfillment": "allOrNothing",
                "filters": {"allowedUpstreams": ["provider-a", "provider-b"]}}),
        ),
        (
            "/components/schemas/Problem",
            serde_json::json!({
                "type": "https://proxy-pool.local/problems/insufficient-proxies",
                "title": "Insufficient proxies", "status": 409, "code": "INSUFFICIENT_PROXIES",
                "detail": "requested 10 proxies but only 6 are currently eligible",
                "requestId": "req_01J4EXAMPLE"}),
        ),
        (
            // The 409 the seed's example was given for.
            "/paths/~1api~1v1~1proxies~1extract/post/responses/409/content/application~1problem+json/schema",
            serde_json::json!({
                "type": "https://proxy-pool.local/problems/insufficient-proxies",
                "title": "Insufficient proxies", "status": 409, "code": "INSUFFICIENT_PROXIES",
                "detail": "requested 10 proxies but only 6 are currently eligible",
                "requestId": "req_01J4EXAMPLE"}),
        ),
        (
            "/components/schemas/ExtractedProxy/properties/id",
            serde_json::json!("px_01J4EXAMPLE"),
        ),
        (
            "/components/schemas/ExtractedProxy/properties/host",
            serde_json::json!("192.0.2.10"),
        ),
        (
            "/components/schemas/ExtractedProxy/properties/url",
            serde_json::json!("http://USER:PASSWORD@192.0.2.10:8080"),
        ),
    ]
}

/// Every example in the contract is valid against the schema it stands
/// under, the seed's among them (each still in the contract, and valid
/// where the seed put it); and the check can fail: an example broken in
/// each way the schemas forbid is refused.
#[test]
fn every_example_in_the_contract_is_valid() {
    let doc = contract();
    let mut examples = Vec::new();
    examples_under(&doc, "", &mut examples);
    // One per problem code, the seed's two request bodies and three fields.
    assert!(
        examples.len() >= Code::ALL.len() + 5,
        "only {} examples found",
        examples.len()
    );
    for example in &examples {
        let errors = schema_errors(&doc, &example.schema, &example.value);
        assert!(
            errors.is_empty(),
            "the example at {} is invalid against {}: {errors:?}",
            example.at,
            example.schema
        );
    }
    for (schema, seed) in seed_examples() {
        assert!(
            examples.iter().any(|e| e.value == seed),
            "the seed's example {seed} is no longer in the contract"
        );
        let errors = schema_errors(&doc, schema, &seed);
        assert!(
            errors.is_empty(),
            "the seed's example {seed} is invalid against {schema}: {errors:?}"
        );
    }

    let problem_409 = "/paths/~1api~1v1~1proxies~1extract/post/responses/409/content/application~1problem+json/schema";
    let seed_409 = &seed_examples()[3].1;
    let request =
        "/paths/~1api~1v1~1proxies~1extract/post/requestBody/content/application~1json/schema";
    let seed_partial = &seed_examples()[0].1;
    let mut broken = Vec::new();
    for (field, value) in [
        ("status", serde_json::json!(422)),
        ("code", serde_json::json!("FILTERS_TOO_BROAD")),
        ("code", serde_json::json!("RATE_LIMITED")),
        ("title", serde_json::json!(409)),
    ] {
        let mut example = seed_409.clone();
        example[field] = value;
        broken.push((problem_409, example));
    }
    for (field, value) in [
        ("count", serde_json::json!("five")),
        ("fulfillment", serde_json::json!("some")),
        ("unknown", serde_json::json!(true)),
    ] {
        let mut example = seed_partial.clone();
        example[field] = value;
        broken.push((request, example));
    }
    for (schema, example) in broken {
        assert!(
            !schema_errors(&doc, schema, &example).is_empty(),
            "{example} passed {schema}"
        );
    }
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The string literals of `source` written in SCREAMING_SNAKE_CASE
/// (`"INSUFFICIENT_PROXIES"`, `"UNAUTHORIZED"`): a run of `A-Z`, `0-9` and
/// `_` with a `"` on each side.
fn screaming_literals(source: &str) -> BTreeSet<String> {
    let bytes = source.as_bytes();
    let mut found = BTreeSet::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            let start = i + 1;
            let mut end = start;
            while end < bytes.len()
                && (bytes[end].is_ascii_uppercase()
                    || bytes[end].is_ascii_digit()
                    || bytes[end] == b'_')
            {
                end += 1;
            }
            let word = &source[start..end];
            if end < bytes.len()
                && bytes[end] == b'"'
                && word.starts_with(|c: char| c.is_ascii_uppercase())
                && word.len() > 1
            {
                found.insert(word.to_owned());
            }
            i = end.max(start);
        } else {
            i += 1;
        }
    }
    found
}

/// Every problem `code` written in `src/` is in the contract: each
/// SCREAMING_SNAKE_CASE string literal of `src/httpapi/` (where problems
/// are made), and each one with a `_` anywhere in `src/` (elsewhere the
/// single words are Redis's commands and errors) that is not the name of
/// an environment variable (`PROXY_POOL_*`, `AWS_*`, `CARGO_*`), is a
/// [`Code`] and appears in `api/openapi/proxy-pool.yaml` (in the `Problem`
/// schema's enum and in an example). A problem cannot be built without a
/// [`Code`]; this holds the contract to code text written anywhere.
#[test]
fn every_code_written_in_src_is_in_the_contract() {
    let yaml = std::fs::read_to_string(root().join("api/openapi/proxy-pool.yaml")).unwrap();
    let httpapi = root().join("src/httpapi");
    let mut codes = BTreeSet::new();
    for file in rust_files(&root().join("src")) {
        let source = std::fs::read_to_string(&file).unwrap();
        codes.extend(screaming_literals(&source).into_iter().filter(|w| {
            (file.starts_with(&httpapi) || w.contains('_'))
                && !["PROXY_POOL_", "AWS_", "CARGO_"]
                    .iter()
                    .any(|p| w.starts_with(p))
        }));
    }
    assert_eq!(
        screaming_literals(r#"code("NOT_FOUND", 'x', "lower_case", "A_1") "HTTP" "B"#),
        BTreeSet::from(["A_1".to_owned(), "HTTP".to_owned(), "NOT_FOUND".to_owned()])
    );
    for code in Code::ALL {
        assert!(codes.contains(code.as_str()), "the scan missed {code:?}");
    }
    for code in &codes {
        code_named(code);
        assert!(
            yaml.contains(&format!("code: {code}\n")) && yaml.contains(&format!("- {code}\n")),
            "api/openapi/proxy-pool.yaml does not document {code}"
        );
    }
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
