//! The key layout has one description, and it is the code's: the table
//! under "The keys" in `docs/data-model.md` names exactly the keys
//! `PoolKeys` builds; every `{pp}:` name written in `src/`, `lua/`,
//! `scripts/` or the documentation is one of them; the scripts bind the
//! seven pool keys in the table's order (and `docs/pool-contract.md` and
//! the programs that pass them list them so); the record's grammar in the
//! page is the one `lua/prelude/record.lua` parses; and every key a
//! pool's life writes in Redis has the type and TTL the table gives. A key
//! renamed, added or retyped on one side only fails here.
//!
//! Over 500 lines on purpose: one description checked from both ends (the
//! page's table against the code, and against what Redis holds), every test
//! reading the table through the one parser at the top.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Harness, close_hours, proxies};
use proxy_pool::aggregates::{Aggregates, AggregatesOptions, DatabaseSource, DatabaseUrl};
use proxy_pool::pool::PoolKeys;
use proxy_pool::pool::keys;
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{Rate, RedisRegistry};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One row of the key table: the key's name (a placeholder such as
/// `<hour>` standing for a value), its Redis type and its TTL (`none`, or
/// when it expires).
#[derive(Debug)]
struct Row {
    key: String,
    kind: String,
    ttl: String,
}

impl Row {
    /// Whether the row's key carries a Redis TTL.
    fn expires(&self) -> bool {
        self.ttl != "none"
    }
}

/// The code spans of `text` (what stands between single backticks).
fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The cells of a Markdown table row, split on `|` but not on `\|`.
fn cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut chars = line.trim().trim_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells.iter().map(|c| c.trim().to_owned()).collect()
}

/// The rows of the first table under the heading `heading` of `text`.
fn table_under(text: &str, heading: &str) -> Vec<Vec<String>> {
    let lines = text
        .lines()
        .skip_while(|l| l.trim() != heading)
        .skip(1)
        .skip_while(|l| !l.starts_with('|'));
    let rows: Vec<Vec<String>> = lines
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its separator
        .map(cells)
        .collect();
    assert!(!rows.is_empty(), "no table under {heading:?}");
    rows
}

/// The key table of `docs/data-model.md`: one row per key, in its order.
fn documented() -> Vec<Row> {
    let page = read("docs/data-model.md");
    let mut rows = Vec::new();
    for row in table_under(&page, "## The keys") {
        let [key, kind, _, ttl] = &row[..] else {
            panic!("a key row has four cells: {row:?}");
        };
        let names = code_spans(key);
        assert_eq!(names.len(), 1, "one key a row: {key}");
        rows.push(Row {
            key: names[0].clone(),
            kind: kind.to_ascii_lowercase(),
            ttl: ttl.clone(),
        });
    }
    rows
}

/// Whether `key` is an instance of `pattern`: literal text, with each
/// `<placeholder>` standing for a run of digits and lowercase hex (an
/// hour, a sha256).
fn instance_of(key: &str, pattern: &str) -> bool {
    let Some((literal, rest)) = pattern.split_once('<') else {
        return key == pattern;
    };
    let Some(key) = key.strip_prefix(literal) else {
        return false;
    };
    let rest = rest.split_once('>').map_or("", |(_, after)| after);
    let value = key
        .find(|c: char| !(c.is_ascii_digit() || ('a'..='f').contains(&c)))
        .unwrap_or(key.len());
    value > 0 && instance_of(&key[value..], rest)
}

/// `name` with every `<placeholder>` written `<>`, so that two spellings
/// of one placeholder (`<hour>`, `<hour A>`) compare equal.
fn shape(name: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for c in name.chars() {
        match c {
            '<' => {
                inside = true;
                out.push('<');
            }
            '>' => {
                inside = false;
                out.push('>');
            }
            c if !inside => out.push(c),
            _ => {}
        }
    }
    out
}

/// The rows `key` (a concrete key name) is an instance of.
fn rows_of<'a>(rows: &'a [Row], key: &str) -> Vec<&'a Row> {
    rows.iter().filter(|r| instance_of(key, &r.key)).collect()
}

/// Every key name the code builds for the default pool: `PoolKeys`'s
/// methods and the module's constants and functions.
fn code_keys() -> Vec<String> {
    let k = PoolKeys::default();
    let mut names: Vec<String> = k.pool().iter().map(|s| s.to_string()).collect();
    names.extend(
        [
            k.records(),
            k.due(),
            k.index(),
            k.counts(),
            k.usage_unflushed(),
            k.client_credentials(),
            k.client_entries(),
            k.rate_global(),
        ]
        .map(str::to_owned),
    );
    names.push(k.usage_hour(1_785_232_800));
    names.push(k.rate_client("c1"));
    names.extend(keys::POOL.map(str::to_owned));
    names.extend(
        [
            keys::RECORDS,
            keys::DUE,
            keys::INDEX,
            keys::HEADS,
            keys::COUNTS,
            keys::IDEMPOTENCY,
            keys::IDEMPOTENCY_DUE,
            keys::USAGE_UNFLUSHED,
            keys::CLIENT_CREDENTIALS,
            keys::CLIENT_ENTRIES,
            keys::RATE_GLOBAL,
        ]
        .map(str::to_owned),
    );
    names.push(keys::usage_hour(0));
    names.push(keys::rate_client("anonymous"));
    names
}

/// The table names exactly the keys the code builds: each key `PoolKeys`
/// (or a constant of `keys`) makes is an instance of one row, and each row
/// has such a key. The seven pool keys come first, in `keys::POOL`'s order.
#[test]
fn the_key_table_names_the_keys_the_code_builds() {
    let rows = documented();
    let built = code_keys();
    for key in &built {
        let matched = rows_of(&rows, key);
        assert_eq!(
            matched.len(),
            1,
            "{key} is built by src/pool/keys.rs; docs/data-model.md's key table has {} rows for it",
            matched.len()
        );
    }
    for row in &rows {
        assert!(
            built.iter().any(|k| instance_of(k, &row.key)),
            "docs/data-model.md documents {}, which src/pool/keys.rs never builds",
            row.key
        );
    }
    let first: Vec<&str> = rows.iter().take(7).map(|r| r.key.as_str()).collect();
    assert_eq!(first, keys::POOL, "the pool keys first, in KEYS[] order");
    assert!(instance_of(
        "{pp}:rl:client:0a9f",
        "{pp}:rl:client:<sha256>"
    ));
    assert!(!instance_of("{pp}:usage:unflushed", "{pp}:usage:<hour>"));
    assert!(!instance_of("{pp}:usage:", "{pp}:usage:<hour>"));
}

/// The scripts bind `KEYS[1..7]` to the pool keys in `keys::POOL`'s order
/// (`POOL_KEYS` in `lua/prelude/base.lua`), use no other pool key name
/// (`K.<name>`), and `docs/pool-contract.md` lists them in that order for
/// other programs, as the Python client of the contract and
/// `scripts/count-instructions.py` pass them.
#[test]
fn the_scripts_and_the_contract_take_the_pool_keys_in_order() {
    let base = read("lua/prelude/base.lua");
    let list = base
        .lines()
        .find_map(|l| l.strip_prefix("local POOL_KEYS = {"))
        .expect("lua/prelude/base.lua names its POOL_KEYS");
    let names: Vec<&str> = list
        .trim_end_matches('}')
        .split(',')
        .map(|n| n.trim().trim_matches('\''))
        .collect();
    let bound: Vec<String> = names.iter().map(|n| format!("{{pp}}:v4:{n}")).collect();
    assert_eq!(bound, keys::POOL, "POOL_KEYS in lua/prelude/base.lua");
    for file in files(&root().join("lua"), "lua") {
        let source = std::fs::read_to_string(&file).unwrap();
        for (i, _) in source.match_indices("K.") {
            let before = source[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
                continue;
            }
            let name: String = source[i + 2..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                names.contains(&name.as_str()),
                "{} uses K.{name}, not a pool key",
                file.display()
            );
        }
    }

    let contract = read("docs/pool-contract.md");
    let order = table_under(&contract, "### KEYS: the seven pool keys");
    let listed: Vec<String> = order[0].iter().flat_map(|c| code_spans(c)).collect();
    assert_eq!(listed, keys::POOL, "docs/pool-contract.md's KEYS[] order");

    // The programs beside the code that pass the keys themselves.
    let client = read("tests/python/contract_client.py");
    let passed: Vec<String> = mentions(&client).into_iter().map(|(_, k)| k).collect();
    assert_eq!(passed, keys::POOL, "tests/python/contract_client.py's KEYS");
    let counter = read("scripts/count-instructions.py");
    let list = counter
        .lines()
        .find_map(|l| l.strip_prefix("POOL_KEYS = ["))
        .expect("scripts/count-instructions.py names its POOL_KEYS");
    let counted: Vec<&str> = list
        .trim_end_matches(']')
        .split(',')
        .map(|n| n.trim().trim_matches('"'))
        .collect();
    assert_eq!(counted, names, "POOL_KEYS in scripts/count-instructions.py");
}

/// The record's grammar shown in `docs/data-model.md` ("The record") is,
/// line for line, the one in the header of `lua/prelude/record.lua`, the
/// code that parses it.
#[test]
fn the_record_grammar_is_the_scripts() {
    let page = read("docs/data-model.md");
    let block: Vec<&str> = page
        .lines()
        .skip_while(|l| l.trim() != "## The record")
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert_eq!(block.len(), 3, "live, tombstone and locator: {block:?}");
    let script = read("lua/prelude/record.lua");
    for line in block {
        assert!(
            script.lines().any(|l| l == format!("--   {line}")),
            "lua/prelude/record.lua's header lacks the grammar line {line:?}"
        );
    }
}

/// Every file under `dir` (recursively) whose name ends in `.ext`.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files(&path, ext));
        } else if path.extension().is_some_and(|e| e == ext) {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// The `{pp}:` key names `text` mentions, each with its line number: the
/// name runs over `A-Z a-z 0-9 _ : *` and whole `<placeholder>`s. (`{{pp}}`,
/// a Rust format string's escape, counts as `{pp}`.)
fn mentions(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.replace("{{pp}}", "{pp}");
        for (at, _) in line.match_indices("{pp}:") {
            let mut name = String::from("{pp}:");
            let mut rest = line[at + 5..].chars().peekable();
            while let Some(&c) = rest.peek() {
                if c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '*' {
                    name.push(c);
                    rest.next();
                } else if c == '<' {
                    let placeholder: String = rest.by_ref().take_while(|&c| c != '>').collect();
                    name.push_str(&placeholder);
                    name.push('>');
                } else {
                    break;
                }
            }
            found.push((n + 1, name));
        }
    }
    found
}

/// Whether the mention `name` refers to a documented key: a key of the
/// table (placeholders spelt any way) or an instance of one; ending in `*`
/// or `:`, the start of one (or, for `:`, a key followed by a colon of
/// the prose).
fn names_a_key(rows: &[Row], name: &str) -> bool {
    let is_key = |name: &str| {
        rows.iter()
            .any(|r| shape(name) == shape(&r.key) || instance_of(name, &r.key))
    };
    let starts_a_key = |prefix: &str| {
        rows.iter()
            .any(|r| shape(&r.key).starts_with(&shape(prefix)))
    };
    if let Some(prefix) = name.strip_suffix('*') {
        starts_a_key(prefix)
    } else if let Some(key) = name.strip_suffix(':') {
        starts_a_key(name) || is_key(key)
    } else {
        is_key(name)
    }
}

/// `text` less the section of `docs/deploy.md` that names the keys of the
/// layouts before on purpose (to move a pool off them).
fn without_earlier_layouts(text: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if line.starts_with("## ") {
            skipping = line == "## Moving a pool from an earlier layout";
        }
        out.push_str(if skipping { "" } else { line });
        out.push('\n');
    }
    out
}

/// Every `{pp}:` key name written in `src/`, `lua/`, `docs/`,
/// `README.md`, `scripts/` or `tests/python/` is a key of the table (only
/// the section of `docs/deploy.md` on moving off an earlier layout names
/// its keys).
#[test]
fn every_key_name_written_anywhere_is_documented() {
    let rows = documented();
    let mut sources: Vec<PathBuf> = files(&root().join("src"), "rs");
    sources.extend(files(&root().join("lua"), "lua"));
    sources.extend(files(&root().join("docs"), "md"));
    sources.push(root().join("README.md"));
    sources.extend(files(&root().join("scripts"), "py"));
    sources.extend(files(&root().join("scripts"), "sh"));
    sources.extend(files(&root().join("tests/python"), "py"));
    let mut unknown = Vec::new();
    let mut seen = 0;
    for file in &sources {
        let mut text = std::fs::read_to_string(file).unwrap();
        if file.ends_with("docs/deploy.md") {
            text = without_earlier_layouts(&text);
        }
        for (line, name) in mentions(&text) {
            seen += 1;
            if !names_a_key(&rows, &name) {
                let at = file.strip_prefix(root()).unwrap().display();
                unknown.push(format!("{at}:{line}: {name}"));
            }
        }
    }
    assert!(seen > 50, "only {seen} key names found");
    assert!(
        unknown.is_empty(),
        "key names docs/data-model.md does not document:\n{}",
        unknown.join("\n")
    );
    // The scan tells a documented name from an undocumented one.
    let sample = "`{pp}:v4:due`, `{{pp}}:ix:live`, {pp}:usage:<hour A>, {pp}:rl:*, {pp}:proxies.";
    let names: Vec<String> = mentions(sample).into_iter().map(|(_, n)| n).collect();
    assert_eq!(
        names,
        [
            "{pp}:v4:due",
            "{pp}:ix:live",
            "{pp}:usage:<hour A>",
            "{pp}:rl:*",
            "{pp}:proxies"
        ]
    );
    let known: Vec<bool> = names.iter().map(|n| names_a_key(&rows, n)).collect();
    assert_eq!(known, [true, false, true, true, false]);
}

/// A database no one listens on: a flush fails at once and marks the
/// hours it could not move.
const UNUSED_DB: &str = "postgres://nobody@127.0.0.1:1/none";

/// A pool's life writes only documented keys, each with the type and TTL
/// the table gives, and every key of the table is written: proxies loaded
/// and extracted (with an `Idempotency-Key`), both rate limits, the usage
/// counters and a flush that could not reach its database, and the Redis
/// client registry.
#[tokio::test]
async fn every_key_a_pool_writes_has_its_documented_type_and_ttl() {
    // Slow enough that a limit's state outlives the run.
    let rate = Rate {
        per_second: 0.01,
        burst: 10,
    };
    let h = Harness::with_config(|c| {
        c.global_rate = Some(rate);
        c.client_rate = Some(rate);
        c.aggregates_database_url = Some(DatabaseUrl::parse(UNUSED_DB).unwrap());
    })
    .await;
    h.load(&proxies("layout", 5)).await;
    let r = h
        .extract(r#"{"count":2}"#, &[("idempotency-key", "layout-key-0001")])
        .await;
    assert_eq!(r.ids().len(), 2, "{}", r.body);
    close_hours(&h, 2).await;
    h.extract(r#"{"count":1}"#, &[]).await;
    let aggregates = Aggregates::new(
        DatabaseSource::Url(DatabaseUrl::parse(UNUSED_DB).unwrap()),
        AggregatesOptions {
            ca_file: None,
            retention: Duration::from_secs(168 * 3600),
            timeout: Duration::from_secs(5),
        },
    );
    assert!(aggregates.flush(&h.pool).await.error.is_some());
    let digest = CredentialHash::of(b"pp_layout_key").encode();
    let document = serde_json::json!({"clients": [{"id": "layout", "apiKeys": [digest]}]});
    RedisRegistry::new(h.pool.clone())
        .import(&document.to_string())
        .await
        .unwrap();

    let rows = documented();
    let mut conn = h.redis().await;
    let mut written: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    written.sort();
    let mut met = vec![false; rows.len()];
    for key in &written {
        let matched = rows_of(&rows, key);
        assert_eq!(matched.len(), 1, "{key}: written, not documented once");
        let row = matched[0];
        met[rows.iter().position(|r| std::ptr::eq(r, row)).unwrap()] = true;
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kind, row.kind, "{key}: documented as {}", row.kind);
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            ttl > 0,
            row.expires(),
            "{key}: PTTL {ttl}, documented TTL {:?}",
            row.ttl
        );
    }
    let unmet: Vec<&str> = rows
        .iter()
        .zip(&met)
        .filter(|(_, m)| !**m)
        .map(|(r, _)| r.key.as_str())
        .collect();
    assert!(
        unmet.is_empty(),
        "documented keys the run never wrote: {unmet:?} (written: {written:?})"
    );
}

/// The counters hash is a hash table from a pool's first write (its `enc`
/// field, written with `meta`), not a listpack searched field by field; a
/// pool written before `enc` existed gets it from its next write.
#[tokio::test]
async fn the_counters_are_a_hash_table_from_the_first_write() {
    let h = Harness::start().await;
    let pool = proxies("small", 4);
    h.load(&pool[..3]).await;
    let mut conn = h.redis().await;
    let encoding = || async {
        let mut conn = h.redis().await;
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(keys::COUNTS)
            .query_async(&mut conn)
            .await
            .unwrap();
        encoding
    };
    assert_eq!(encoding().await, "hashtable");
    // The same counters without `enc`, as an older build wrote them.
    let mut fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys::COUNTS)
        .query_async(&mut conn)
        .await
        .unwrap();
    fields.retain(|(field, _)| field != "enc");
    let _: () = redis::cmd("DEL")
        .arg(keys::COUNTS)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(keys::COUNTS)
        .arg(&fields)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(encoding().await, "listpack");
    h.load(&pool[3..]).await;
    assert_eq!(encoding().await, "hashtable");
    common::model::pool_state(&h.pool).await.unwrap();
}
