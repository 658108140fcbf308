use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Why a private Redis could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// No `redis-server` on `PATH`.
    #[error(
        "redis-server was not found on PATH; install it with `apt-get install -y redis-server` (Debian/Ubuntu) or pass --redis-url"
    )]
    RedisMissing,
    /// It started but never said it was ready.
    #[error("redis-server did not start: {0}")]
    RedisFailed(String),
}

/// A `redis-server` child process on a loopback port, killed on drop.
/// No persistence: it exists for tests and `proxy-pool serve`.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

impl RedisServer {
    /// Starts one on a free port.
    pub async fn start() -> Result<Self, LocalError> {
        Self::start_with(&[]).await
    }

    /// Starts one on a free port with extra `--name value` arguments.
    pub async fn start_with(extra: &[&str]) -> Result<Self, LocalError> {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port().map_err(|e| LocalError::RedisFailed(e.to_string()))?;
            match spawn(port, extra).await {
                Ok(child) => {
                    return Ok(Self {
                        child: Some(child),
                        port,
                    });
                }
                Err(LocalError::RedisFailed(why)) => last = why,
                Err(e) => return Err(e),
            }
        }
        Err(LocalError::RedisFailed(last))
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills it and waits until it is gone; the data is lost.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts it again on the same port (after [`stop`](Self::stop)), empty.
    pub async fn restart(&mut self) -> Result<(), LocalError> {
        self.stop().await;
        self.child = Some(spawn(self.port, &[]).await?);
        Ok(())
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn spawn(port: u16, extra: &[&str]) -> Result<Child, LocalError> {
    let port_arg = port.to_string();
    let mut args = vec![
        "--port",
        &port_arg,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--loglevel",
        "notice",
    ];
    args.extend_from_slice(extra);
    let mut child = Command::new("redis-server")
        .args(&args)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LocalError::RedisMissing,
            _ => LocalError::RedisFailed(e.to_string()),
        })?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| LocalError::RedisFailed("no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut last = String::new();
    // Redis says when it accepts connections; no polling, no sleeping.
    while let Ok(Some(line)) = lines.next_line().await {
        if line.contains("Ready to accept connections") {
            // Keep draining its log so the pipe never fills and blocks it.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Ok(child);
        }
        last = line;
    }
    let _ = child.kill().await;
    Err(LocalError::RedisFailed(last))
}
