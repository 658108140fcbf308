//! The contract (`api/openapi/proxy-pool.yaml`) and `docs/errors.md`
//! document exactly the problem codes the service can answer, each under
//! its status with an example, also any code text written in `src/`; and
//! every example in the contract (the seed's among them) is valid against
//! the schema it stands under.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use proxy_pool::httpapi::Code;
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
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

/// The seed contract's examples (the seed's `proxy-pool.openapi.yaml`,
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
