//! The bounds that let `serve` run unattended, and their defaults.

use std::time::Duration;

/// The bounds that let `serve` run unattended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// A request's headers must arrive within this: counted from the
    /// connection's start for its first request, from the first byte for
    /// later ones (default 10 s).
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request
    /// (default 60 s).
    pub idle_timeout: Duration,
    /// A request's body must arrive within this after its headers
    /// (default 10 s).
    pub body_read_timeout: Duration,
    /// Connections open at once; more wait in the listen backlog until one
    /// closes (default 4096: keep the file descriptor limit above it).
    pub max_connections: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(10),
            max_connections: 4096,
        }
    }
}
