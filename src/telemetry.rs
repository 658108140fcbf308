//! Tracing set-up: one JSON object per line in Lambda (CloudWatch), readable
//! text locally. `RUST_LOG` filters, default `info`.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; `json` selects the Lambda format.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// Whether the Lambda binary should log JSON: as Lambda's own
/// `AWS_LAMBDA_LOG_FORMAT` says (`JSON` or `Text`, set by the function's
/// logging configuration), else JSON unless stderr is a terminal, so
/// CloudWatch gets JSON and a developer running `cargo lambda watch` reads text.
pub fn lambda_wants_json() -> bool {
    use std::io::IsTerminal;
    match std::env::var("AWS_LAMBDA_LOG_FORMAT") {
        Ok(format) if format.eq_ignore_ascii_case("json") => true,
        Ok(format) if format.eq_ignore_ascii_case("text") => false,
        _ => !std::io::stderr().is_terminal(),
    }
}
