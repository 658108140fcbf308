//! `template.yaml`'s alarms and dashboard watch what the code emits: every
//! metric in the ProxyPool namespace is one the scheduled check's EMF lines
//! carry, with the same dimensions; every log metric filter matches the
//! access log line the handler really writes (and only the answers it
//! means); AWS metrics are the services' own. A renamed metric, field or
//! dimension fails here, not on the pager. The dashboard shows every
//! alarmed series.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lambda_http::Body;
use lambda_http::http::Request;
use proxy_pool::aggregates::FlushReport;
use proxy_pool::distribution::{EXTRACT_PATH, LIVE_PATH};
use proxy_pool::pool::{PruneReport, RedisPool};
use proxy_pool::scheduled::{self, HealthCheckReport, InventoryLine, METRICS_NAMESPACE};
use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

/// AWS's own metrics the template may use, with their dimensions.
const AWS_METRICS: [(&str, &str, &str); 6] = [
    ("AWS/Lambda", "Errors", "FunctionName"),
    ("AWS/Lambda", "Throttles", "FunctionName"),
    ("AWS/Lambda", "Duration", "FunctionName"),
    ("AWS/Lambda", "Invocations", "FunctionName"),
    ("AWS/ApiGateway", "5xx", "ApiId"),
    ("AWS/ApiGateway", "Count", "ApiId"),
];

/// One metric as the template names it: namespace, name, dimensions
/// (name -> value, intrinsic functions written as the names they refer to).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Series {
    namespace: String,
    name: String,
    dimensions: BTreeMap<String, String>,
}

fn template() -> Yaml {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// A scalar of the template as text: `!Ref X` is `X`, `!Sub "a${X}"` is
/// `aX` (as [`substitute`] writes it).
fn text(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Tagged(t) if t.tag == "Ref" => text(&t.value),
        Yaml::Tagged(t) if t.tag == "Sub" => substitute(&text(&t.value), &BTreeSet::new()),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// `${Name}` replaced by `Name`, or by `1` for the numeric parameters in
/// `numbers` (so a dashboard body parses as JSON).
fn substitute(s: &str, numbers: &BTreeSet<String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let end = rest[at..].find('}').unwrap() + at;
        let name = &rest[at + 2..end];
        out.push_str(if numbers.contains(name) { "1" } else { name });
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn dimensions(v: Option<&Yaml>) -> BTreeMap<String, String> {
    v.and_then(Yaml::as_sequence)
        .map(|dims| {
            dims.iter()
                .map(|d| (text(&d["Name"]), text(&d["Value"])))
                .collect()
        })
        .unwrap_or_default()
}

fn resources(t: &Yaml, kind: &str) -> Vec<(String, Yaml)> {
    t["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some(kind))
        .map(|(name, r)| (name.as_str().unwrap().to_owned(), r.clone()))
        .collect()
}

/// Every series an alarm reads, with the alarm's name.
fn alarmed(t: &Yaml) -> Vec<(String, Series)> {
    let mut out = Vec::new();
    for (alarm, r) in resources(t, "AWS::CloudWatch::Alarm") {
        let p = &r["Properties"];
        if let Some(metrics) = p["Metrics"].as_sequence() {
            for m in metrics.iter().filter_map(|m| m.get("MetricStat")) {
                let metric = &m["Metric"];
                out.push((
                    alarm.clone(),
                    Series {
                        namespace: text(&metric["Namespace"]),
                        name: text(&metric["MetricName"]),
                        dimensions: dimensions(metric.get("Dimensions")),
                    },
                ));
            }
        } else {
            out.push((
                alarm,
                Series {
                    namespace: text(&p["Namespace"]),
                    name: text(&p["MetricName"]),
                    dimensions: dimensions(p.get("Dimensions")),
                },
            ));
        }
    }
    out
}

/// Every series a dashboard widget plots.
fn plotted(t: &Yaml) -> BTreeSet<Series> {
    let numbers: BTreeSet<String> = t["Parameters"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, p)| p["Type"].as_str() == Some("Number"))
        .map(|(name, _)| name.as_str().unwrap().to_owned())
        .collect();
    let mut out = BTreeSet::new();
    for (_, r) in resources(t, "AWS::CloudWatch::Dashboard") {
        let Yaml::Tagged(body) = &r["Properties"]["DashboardBody"] else {
            panic!("the dashboard body is a !Sub");
        };
        let body: Json = serde_json::from_str(&substitute(&text(&body.value), &numbers)).unwrap();
        for widget in body["widgets"].as_array().unwrap() {
            for row in widget["properties"]["metrics"].as_array().unwrap() {
                let parts: Vec<&str> = row
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(Json::as_str)
                    .collect();
                if parts.is_empty() {
                    continue; // a metric math expression
                }
                assert!(
                    parts.len().is_multiple_of(2),
                    "namespace, name, then dimension pairs: {row}"
                );
                out.insert(Series {
                    namespace: parts[0].to_owned(),
                    name: parts[1].to_owned(),
                    dimensions: parts[2..]
                        .chunks(2)
                        .map(|p| (p[0].to_owned(), p[1].to_owned()))
                        .collect(),
                });
            }
        }
    }
    out
}

/// What the scheduled check emits: metric name -> its dimension names, from
/// the EMF lines of a check (with or without aggregates) and of a failure.
fn emitted(with_aggregates: bool) -> BTreeMap<String, BTreeSet<String>> {
    let report = HealthCheckReport {
        ready: true,
        checked_at: 0,
        pruned: PruneReport::default(),
        eligible_total: 1,
        held_by_workers: 0,
        records: 1,
        tombstones: 0,
        inventory: vec![InventoryLine {
            upstream: "provider-a".into(),
            protocol: "http".into(),
            region: "shanghai".into(),
            eligible: 1,
        }],
        aggregates: with_aggregates.then(FlushReport::default),
        duration_ms: 1,
    };
    let mut lines = scheduled::metric_lines(&report, "fn", 0);
    lines.push(scheduled::failure_metric_line("fn", 0));
    let mut out = BTreeMap::new();
    for line in lines {
        let doc: Json = serde_json::from_str(&line).unwrap();
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], METRICS_NAMESPACE);
        let dims: BTreeSet<String> = directive["Dimensions"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_owned())
            .collect();
        for metric in directive["Metrics"].as_array().unwrap() {
            out.insert(metric["Name"].as_str().unwrap().to_owned(), dims.clone());
        }
    }
    out
}

/// The access log lines the handler writes, in the Lambda log format: one
/// for a 503 (Redis unreachable) and one for a 200 (liveness).
async fn access_lines() -> (Json, Json) {
    let captured = common::Captured::default();
    let sink = captured.clone();
    let _logging = tracing::subscriber::set_default(proxy_pool::telemetry::lambda_subscriber(
        "info".parse().unwrap(),
        move || sink.clone(),
    ));
    let pool = RedisPool::new("redis://127.0.0.1:1/", Duration::from_millis(200)).unwrap();
    let app = common::app_over(&common::test_config(), pool);
    let unavailable = common::extract_request(r#"{"count":1}"#, &[]);
    assert_eq!(common::send(&app, unavailable).await.status, 503);
    let live = Request::get(LIVE_PATH).body(Body::Empty).unwrap();
    assert_eq!(common::send(&app, live).await.status, 200);
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let requests: Vec<Json> = text
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap())
        .filter(|l| l["message"] == "request")
        .collect();
    let by_path = |path: &str| {
        requests
            .iter()
            .find(|l| l["path"] == path)
            .unwrap_or_else(|| panic!("no access log line for {path}: {text}"))
            .clone()
    };
    (by_path(EXTRACT_PATH), by_path(LIVE_PATH))
}

/// Whether a CloudWatch Logs JSON filter pattern of the form
/// `{ $.a = "x" && $.b >= 500 }` matches `line`; any other syntax fails
/// the test (this is not a full implementation), as does a field the line
/// does not have.
fn matches(pattern: &str, line: &Json) -> bool {
    let inner = pattern
        .trim()
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not a JSON filter pattern: {pattern}"));
    inner.split("&&").all(|term| {
        let term = term.trim();
        let op = ["!=", ">=", "<=", "=", ">", "<"]
            .into_iter()
            .find(|op| term.contains(op))
            .unwrap_or_else(|| panic!("no operator in {term}"));
        let (field, value) = term.split_once(op).unwrap();
        let field = field
            .trim()
            .strip_prefix("$.")
            .unwrap_or_else(|| panic!("{term}"));
        let actual = line
            .get(field)
            .unwrap_or_else(|| panic!("the access log has no `{field}`: {line}"));
        let value = value.trim();
        if let Some(s) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            let actual = actual
                .as_str()
                .unwrap_or_else(|| panic!("`{field}` is not text"));
            match op {
                "=" => actual == s,
                "!=" => actual != s,
                _ => panic!("{op} on text in {term}"),
            }
        } else {
            let want: f64 = value.parse().unwrap_or_else(|_| panic!("{term}"));
            let actual = actual
                .as_f64()
                .unwrap_or_else(|| panic!("`{field}` is not a number"));
            match op {
                "=" => actual == want,
                "!=" => actual != want,
                ">=" => actual >= want,
                "<=" => actual <= want,
                ">" => actual > want,
                _ => actual < want,
            }
        }
    })
}

/// Every alarmed and plotted series is one the code emits, a log metric
/// filter of the template defines, or AWS's own; the dashboard plots every
/// alarmed series; aggregates-only metrics are alarmed only with
/// aggregates on; every alarm notifies the optional topic.
#[tokio::test]
async fn alarms_and_dashboard_watch_what_the_code_emits() {
    let t = template();
    let with_aggregates = emitted(true);
    let always = emitted(false);
    let (unavailable, live) = access_lines().await;

    // Log metric filters: namespace and name -> pattern, checked against
    // the real access lines.
    let mut filtered = BTreeMap::new();
    for (name, r) in resources(&t, "AWS::Logs::MetricFilter") {
        let p = &r["Properties"];
        assert_eq!(text(&p["LogGroupName"]), "FunctionLogGroup", "{name}");
        let pattern = text(&p["FilterPattern"]);
        assert!(
            matches(&pattern, &unavailable),
            "{name} misses a 503 answer"
        );
        assert!(!matches(&pattern, &live), "{name} counts a 200 answer");
        for m in p["MetricTransformations"].as_sequence().unwrap() {
            let namespace = text(&m["MetricNamespace"]);
            assert_ne!(namespace, METRICS_NAMESPACE, "EMF owns that namespace");
            filtered.insert((namespace, text(&m["MetricName"])), pattern.clone());
        }
    }
    assert!(!filtered.is_empty());

    let check = |s: &Series, what: &str| {
        if s.namespace == METRICS_NAMESPACE {
            let dims = with_aggregates
                .get(&s.name)
                .unwrap_or_else(|| panic!("{what}: the code emits no {}", s.name));
            let named: BTreeSet<String> = s.dimensions.keys().cloned().collect();
            assert_eq!(&named, dims, "{what}: dimensions of {}", s.name);
            assert_eq!(
                s.dimensions.get("Function").map(String::as_str),
                Some("DistributionFunction"),
                "{what}: EMF's Function dimension is the function's name"
            );
        } else if s.namespace.starts_with("AWS/") {
            let known = AWS_METRICS.iter().any(|(ns, name, dim)| {
                *ns == s.namespace && *name == s.name && s.dimensions.keys().eq([dim].into_iter())
            });
            assert!(known, "{what}: not a known AWS metric: {s:?}");
        } else {
            assert!(
                filtered.contains_key(&(s.namespace.clone(), s.name.clone())),
                "{what}: no metric filter defines {s:?}"
            );
            assert!(
                s.dimensions.is_empty(),
                "{what}: metric filters set no dimensions"
            );
        }
    };
    let alarms = alarmed(&t);
    let dashboard = plotted(&t);
    assert!(alarms.len() >= 9, "{alarms:?}");
    for (alarm, series) in &alarms {
        check(series, alarm);
        assert!(
            dashboard.contains(series),
            "the dashboard does not plot {series:?} ({alarm})"
        );
    }
    for series in &dashboard {
        check(series, "dashboard");
    }

    let alarm_resources: BTreeMap<String, Yaml> = resources(&t, "AWS::CloudWatch::Alarm")
        .into_iter()
        .collect();
    for (alarm, series) in &alarms {
        let r = &alarm_resources[alarm];
        let aggregates_only =
            series.namespace == METRICS_NAMESPACE && !always.contains_key(&series.name);
        assert_eq!(
            r["Condition"].as_str() == Some("HasAggregatesSecret"),
            aggregates_only,
            "{alarm}: alarmed only when aggregates are configured, exactly when its metric needs them"
        );
        for actions in ["AlarmActions", "OKActions"] {
            let Yaml::Tagged(when) = &r["Properties"][actions] else {
                panic!("{alarm}: {actions} is !If [HasAlarmTopic, ...]");
            };
            assert_eq!(when.tag, "If");
            assert_eq!(when.value[0].as_str(), Some("HasAlarmTopic"), "{alarm}");
        }
    }
}
