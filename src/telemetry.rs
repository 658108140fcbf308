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
