//! Tracing set-up: one JSON object per line in Lambda (CloudWatch), readable
//! text locally. `RUST_LOG` filters, default `info`.

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber; `json` selects the Lambda format.
pub fn init(json: bool) {
    if json {
        let _ = lambda_subscriber(filter(), std::io::stderr).try_init();
    } else {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Installs a subscriber that formats every event as Lambda does (JSON, at
/// `RUST_LOG`, default `info`) and throws the line away: benchmarks pay for
/// the access log without flooding the terminal.
pub fn init_discarding() {
    let _ = lambda_subscriber(filter(), std::io::sink).try_init();
}

/// The Lambda log format: one flat JSON object per event (`timestamp`,
/// `level`, `message`, the event's fields, `target`), what the template's
/// log metric filters read.
pub fn lambda_subscriber<W>(filter: EnvFilter, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .json()
        .flatten_event(true)
        .finish()
}

/// `RUST_LOG`, default `info`.
fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Whether the Lambda binary should log JSON: as Lambda's own
/// `AWS_LAMBDA_LOG_FORMAT` says (`JSON` or `Text`, set by the function's
/// logging configuration), else JSON unless stderr is a terminal, so
/// CloudWatch gets JSON and a developer running `cargo lambda watch` reads text.
pub fn lambda_wants_json() -> bool {
    use std::io::IsTerminal;
    wants_json(
        std::env::var("AWS_LAMBDA_LOG_FORMAT").ok().as_deref(),
        std::io::stderr().is_terminal(),
    )
}

fn wants_json(log_format: Option<&str>, stderr_is_terminal: bool) -> bool {
    match log_format {
        Some(f) if f.eq_ignore_ascii_case("json") => true,
        Some(f) if f.eq_ignore_ascii_case("text") => false,
        _ => !stderr_is_terminal,
    }
}

#[cfg(test)]
mod tests {
    use super::wants_json;

    /// Lambda's log format setting wins; without it a terminal gets text.
    #[test]
    fn picks_the_log_format() {
        assert!(wants_json(Some("JSON"), true));
        assert!(!wants_json(Some("Text"), false));
        assert!(wants_json(None, false));
        assert!(!wants_json(None, true));
        assert!(wants_json(Some("other"), false));
    }
}
