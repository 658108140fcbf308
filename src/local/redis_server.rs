use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// The server binary, found on `PATH`.
const REDIS_SERVER: &str = "redis-server";

/// A `redis-server` child process on a loopback port, killed on drop.
/// No persistence: it exists for tests and `proxy-pool serve`. Each one
/// works in a private directory (removed on drop), so nothing it writes
/// (a replica's sync file, a cluster's node table) is seen by another.
pub struct RedisServer {
    child: Option<Child>,
    program: PathBuf,
    port: u16,
    tls: bool,
    extra: Vec<String>,
    dir: PathBuf,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh private working directory for one server.
fn private_dir(port: u16) -> Result<PathBuf, LocalError> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "proxy-pool-redis-{}-{port}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| LocalError::RedisFailed(e.to_string()))?;
    Ok(dir)
}

/// Server-side TLS files for [`RedisServer::start_tls`] (PEM).
#[derive(Debug, Clone, Copy)]
pub struct TlsFiles<'a> {
    /// The server's certificate.
    pub cert: &'a Path,
    /// Its private key.
    pub key: &'a Path,
    /// The CA that signed it.
    pub ca: &'a Path,
}

impl RedisServer {
    /// Starts one on a free port.
    pub async fn start() -> Result<Self, LocalError> {
        Self::start_with(&[]).await
    }

    /// Starts one on a free port with extra `--name value` arguments.
    pub async fn start_with(extra: &[&str]) -> Result<Self, LocalError> {
        Self::start_on_free_port(Path::new(REDIS_SERVER), extra, false).await
    }

    /// Starts one that speaks only TLS (`--port 0`, `--tls-port`), without
    /// asking clients for certificates; [`url`](Self::url) is `rediss://`.
    pub async fn start_tls(files: TlsFiles<'_>) -> Result<Self, LocalError> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let (cert, key, ca) = (path(files.cert), path(files.key), path(files.ca));
        let extra = [
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ];
        Self::start_on_free_port(Path::new(REDIS_SERVER), &extra, true).await
    }

    /// Starts `program` (another `redis-server` binary, e.g. an older
    /// version) on a free port with extra `--name value` arguments.
    pub async fn start_program(program: &Path, extra: &[&str]) -> Result<Self, LocalError> {
        Self::start_on_free_port(program, extra, false).await
    }

    async fn start_on_free_port(
        program: &Path,
        extra: &[&str],
        tls: bool,
    ) -> Result<Self, LocalError> {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port().map_err(|e| LocalError::RedisFailed(e.to_string()))?;
            let dir = private_dir(port)?;
            match spawn(program, port, extra, tls, &dir).await {
                Ok(child) => {
                    return Ok(Self {
                        child: Some(child),
                        program: program.to_owned(),
                        port,
                        tls,
                        extra: extra.iter().map(|s| s.to_string()).collect(),
                        dir,
                    });
                }
                Err(LocalError::RedisFailed(why)) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    last = why;
                }
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
            }
        }
        Err(LocalError::RedisFailed(last))
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/` (`rediss://` when started with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Kills it and waits until it is gone; the data is lost.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts it again on the same port and arguments (after
    /// [`stop`](Self::stop)), empty.
    pub async fn restart(&mut self) -> Result<(), LocalError> {
        self.stop().await;
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.child = Some(spawn(&self.program, self.port, &extra, self.tls, &self.dir).await?);
        Ok(())
    }
}

/// A loopback port free right now (the OS picks it), for a server to bind.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn spawn(
    program: &Path,
    port: u16,
    extra: &[&str],
    tls: bool,
    dir: &Path,
) -> Result<Child, LocalError> {
    let port_arg = port.to_string();
    let mut args = if tls {
        vec!["--port", "0", "--tls-port", &port_arg]
    } else {
        vec!["--port", &port_arg]
    };
    args.extend_from_slice(&[
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
    ]);
    args.extend_from_slice(extra);
    let mut child = Command::new(program)
        .args(&args)
        .current_dir(dir)
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
