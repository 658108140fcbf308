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

/// Installs a subscriber that formats every event as Lambda does (JSON, at
/// `RUST_LOG`, default `info`) and throws the line away: benchmarks pay for
/// the access log without flooding the terminal.
pub fn init_discarding() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::sink)
        .json()
        .flatten_event(true)
        .try_init();
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
