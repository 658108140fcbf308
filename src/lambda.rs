//! The Lambda function: one binary answers API Gateway HTTP events (through
//! [`crate::distribution::handle`]) and the EventBridge scheduled health check
//! (through [`crate::scheduled`]). Any other event is refused with an error
//! log line and an error result, never guessed at.

use std::convert::Infallible;
use std::sync::Arc;

use lambda_http::request::LambdaRequest;
use lambda_http::{Adapter, Request, Service, service_fn};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use serde::Deserialize;
use serde_json::Value;

use crate::aggregates::Aggregates;
use crate::distribution::{App, handle};
use crate::pool::{PoolError, RedisPool};
use crate::scheduled;

/// `source` of an EventBridge scheduled event.
const SCHEDULE_SOURCE: &str = "aws.events";
/// `detail-type` of an EventBridge scheduled event.
const SCHEDULE_DETAIL_TYPE: &str = "Scheduled Event";
/// Top-level field names of an unknown event quoted in its log line.
const LOGGED_FIELDS: usize = 12;

/// What an invocation's payload is.
#[derive(Debug)]
pub enum Event {
    /// An EventBridge scheduled event: run the health check.
    Scheduled,
    /// An API Gateway (REST or HTTP API), ALB or Function URL request.
    Http(Box<LambdaRequest>),
    /// Anything else, with a description safe to log (field names only).
    Unknown(String),
}

impl Event {
    /// Sorts a payload. The scheduled event is recognised by its `source`
    /// and `detail-type`; an HTTP event by deserializing as lambda_http does.
    pub fn classify(payload: &Value) -> Self {
        if payload.get("source").and_then(Value::as_str) == Some(SCHEDULE_SOURCE)
            && payload.get("detail-type").and_then(Value::as_str) == Some(SCHEDULE_DETAIL_TYPE)
        {
            return Self::Scheduled;
        }
        match LambdaRequest::deserialize(payload) {
            Ok(request) => Self::Http(Box::new(request)),
            Err(_) => Self::Unknown(describe(payload)),
        }
    }
}

/// Why an invocation failed; becomes the Lambda error result.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    /// Neither an HTTP event nor the scheduled event.
    #[error(
        "unrecognised event ({0}): expected an API Gateway HTTP event or an EventBridge scheduled event"
    )]
    UnrecognisedEvent(String),
    /// The scheduled health check could not finish.
    #[error("health check failed: {0}")]
    HealthCheck(#[source] PoolError),
    /// A response could not be encoded (a bug).
    #[error("response could not be encoded")]
    Encoding(#[source] serde_json::Error),
}

impl From<FunctionError> for Diagnostic {
    fn from(e: FunctionError) -> Self {
        let error_type = match e {
            FunctionError::UnrecognisedEvent(_) => "UnrecognisedEvent",
            FunctionError::HealthCheck(_) => "HealthCheckFailed",
            FunctionError::Encoding(_) => "InternalError",
        };
        Diagnostic {
            error_type: error_type.into(),
            error_message: e.to_string(),
        }
    }
}

/// The function's shared state, built once per cold start.
pub struct Function {
    app: Arc<App>,
    pool: RedisPool,
    aggregates: Option<Aggregates>,
}

impl Function {
    /// Wraps the HTTP app and the pool it uses.
    pub fn new(app: Arc<App>, pool: RedisPool) -> Self {
        Self {
            app,
            pool,
            aggregates: None,
        }
    }

    /// The scheduled health check also flushes the usage aggregates here.
    pub fn with_aggregates(mut self, aggregates: Option<Aggregates>) -> Self {
        self.aggregates = aggregates;
        self
    }

    /// Handles one invocation: an HTTP response in the shape its origin
    /// expects, the health check's JSON summary, or an error.
    pub async fn invoke(&self, event: LambdaEvent<Value>) -> Result<Value, FunctionError> {
        let LambdaEvent { payload, context } = event;
        match Event::classify(&payload) {
            Event::Http(request) => self.http(*request, context).await,
            Event::Scheduled => self.health_check(&context).await,
            Event::Unknown(description) => {
                tracing::error!(
                    lambda_request_id = %context.request_id,
                    event = %description,
                    "unrecognised event: expected an API Gateway HTTP event or an EventBridge scheduled event"
                );
                Err(FunctionError::UnrecognisedEvent(description))
            }
        }
    }

    /// Runs the request through lambda_http's own adapter (the code behind
    /// `lambda_http::run`), so the request conversion, the Lambda context
    /// and the response shape per origin are exactly lambda_http's.
    async fn http(&self, request: LambdaRequest, context: Context) -> Result<Value, FunctionError> {
        let app = &self.app;
        let mut adapter = Adapter::from(service_fn(move |request: Request| async move {
            Ok::<_, Infallible>(handle(app, request).await)
        }));
        let response = match adapter.call(LambdaEvent::new(request, context)).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        serde_json::to_value(response).map_err(FunctionError::Encoding)
    }

    async fn health_check(&self, context: &Context) -> Result<Value, FunctionError> {
        let function = context.env_config.function_name.as_str();
        match scheduled::run(&self.pool, self.aggregates.as_ref()).await {
            Ok(report) => {
                scheduled::emit(&scheduled::metric_lines(
                    &report,
                    function,
                    crate::clock::now_ms(),
                ));
                tracing::info!(
                    lambda_request_id = %context.request_id,
                    eligible_total = report.eligible_total,
                    pruned_records = report.pruned.records,
                    pruned_index_entries = report.pruned.index_entries,
                    prune_complete = report.pruned.complete,
                    duration_ms = report.duration_ms,
                    "scheduled health check"
                );
                if let Some(flush) = &report.aggregates {
                    log_flush(&context.request_id, flush);
                }
                serde_json::to_value(&report).map_err(FunctionError::Encoding)
            }
            Err(e) => {
                scheduled::emit(&[scheduled::failure_metric_line(
                    function,
                    crate::clock::now_ms(),
                )]);
                tracing::error!(
                    lambda_request_id = %context.request_id,
                    error = %e,
                    "scheduled health check failed"
                );
                Err(FunctionError::HealthCheck(e))
            }
        }
    }
}

/// One line per flush: a warning when it stopped early or found hours lost.
fn log_flush(lambda_request_id: &str, flush: &crate::aggregates::FlushReport) {
    if flush.error.is_some() || flush.hours_dropped > 0 {
        tracing::warn!(
            lambda_request_id,
            hours_flushed = flush.hours_flushed,
            hours_pending = flush.hours_pending,
            hours_dropped = flush.hours_dropped,
            calls_dropped = flush.calls_dropped,
            error = flush.error.as_deref(),
            "usage aggregates flush incomplete"
        );
    } else {
        tracing::info!(
            lambda_request_id,
            hours_flushed = flush.hours_flushed,
            hours_already_flushed = flush.hours_already_flushed,
            hours_open = flush.hours_open,
            "usage aggregates flush"
        );
    }
}

/// Names an unknown payload by its shape, never its values: the JSON type,
/// up to [`LOGGED_FIELDS`] top-level field names, and `source` / `detail-type`
/// when they are short strings.
fn describe(payload: &Value) -> String {
    let Some(object) = payload.as_object() else {
        let kind = match payload {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        };
        return format!("payload is {kind}");
    };
    let mut fields: Vec<String> = object
        .keys()
        .take(LOGGED_FIELDS)
        .map(|k| k.chars().take(40).collect())
        .collect();
    if object.len() > LOGGED_FIELDS {
        fields.push("...".into());
    }
    let mut out = format!("fields: {}", fields.join(","));
    for name in ["source", "detail-type"] {
        if let Some(v) = object.get(name).and_then(Value::as_str)
            && v.len() <= 64
            && v.chars().all(|c| c.is_ascii_graphic() || c == ' ')
        {
            out.push_str(&format!("; {name}: {v}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The scheduled event is told apart by source and detail-type only.
    #[test]
    fn classifies_scheduled_events() {
        let scheduled =
            json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}});
        assert!(matches!(Event::classify(&scheduled), Event::Scheduled));
        let other = json!({"source": "aws.s3", "detail-type": "Object Created", "detail": {}});
        assert!(matches!(Event::classify(&other), Event::Unknown(_)));
    }

    /// An unknown payload is described by field names, never by values.
    #[test]
    fn describes_unknown_events_without_values() {
        let Event::Unknown(d) = Event::classify(&json!({"Records": [{"secret": "s3cr3t"}]})) else {
            panic!("an S3 notification is not an HTTP event");
        };
        assert_eq!(d, "fields: Records");
        let Event::Unknown(d) = Event::classify(&json!("hello")) else {
            panic!("a string is not an event");
        };
        assert_eq!(d, "payload is a string");
        let Event::Unknown(d) = Event::classify(&json!({})) else {
            panic!("an empty object is not an event");
        };
        assert_eq!(d, "fields: ");
    }

    /// Error results carry a stable type for alarms and a safe message.
    #[test]
    fn diagnostics_name_the_failure() {
        let d: Diagnostic = FunctionError::UnrecognisedEvent("fields: a".into()).into();
        assert_eq!(d.error_type, "UnrecognisedEvent");
        assert!(d.error_message.contains("fields: a"));
        let d: Diagnostic = FunctionError::HealthCheck(PoolError::unavailable(
            crate::pool::OutageClass::Timeout,
            "timed out",
        ))
        .into();
        assert_eq!(d.error_type, "HealthCheckFailed");
    }
}
