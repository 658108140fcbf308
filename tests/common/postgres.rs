//! A real PostgreSQL server per test: Debian's `postgresql` binaries
//! (`/usr/lib/postgresql/<newest>/bin`, or `PG_BIN`), a cluster copied from
//! one made by `initdb` (once per machine and version, under the target
//! directory), started on a free loopback port, stopped on drop. As root
//! (CI), the server runs as the `postgres` user (else `nobody`): `initdb`
//! and `postgres` refuse to run as root. Logins need the password
//! [`PASSWORD`] (SCRAM), so a test can look for it where it must not be.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::process::{Child, Command};

/// The superuser the clusters are made with.
pub const USER: &str = "proxy_pool";
/// Its password.
pub const PASSWORD: &str = "pg-test-Secret-51f3";

/// A running (or stopped) PostgreSQL with a private data directory.
pub struct Postgres {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    extra: Vec<String>,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.child.is_some() {
            // An immediate shutdown takes the backends down with the server.
            let _ = pg_ctl_stop(&self.dir).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory of `initdb` and `postgres`.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).expect(
        "PostgreSQL must be installed for the aggregates tests (apt-get install -y postgresql), or PG_BIN set",
    )
}

/// Uid and gid the server runs as: ours, unless we are root.
fn server_user() -> Option<(u32, u32)> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    if uid != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let entry = |name: &str| {
        passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name)).then(|| (f[2].parse().unwrap(), f[3].parse().unwrap()))
        })
    };
    Some(
        entry("postgres")
            .or_else(|| entry("nobody"))
            .expect("no postgres nor nobody user"),
    )
}

/// A command run as the server's user.
fn as_server(program: PathBuf) -> Command {
    let mut cmd = std::process::Command::new(program);
    if let Some((uid, gid)) = server_user() {
        cmd.uid(uid).gid(gid);
    }
    cmd.env("LC_ALL", "C");
    Command::from(cmd)
}

/// `pg_ctl stop -m immediate` (SIGQUIT to the server, as a crash would
/// end it; waits until it is gone), run as the server's user.
fn pg_ctl_stop(dir: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin_dir().join("pg_ctl"));
    if let Some((uid, gid)) = server_user() {
        cmd.uid(uid).gid(gid);
    }
    cmd.arg("stop")
        .arg("-D")
        .arg(dir)
        .args(["-m", "immediate", "-w"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// Gives `path` to the server's user (when we are root).
fn hand_over(path: &Path) {
    if let Some((uid, gid)) = server_user() {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    }
}

/// The cluster every test copies: made once per PostgreSQL version under
/// the target directory (a template from an earlier run is reused).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let bin = bin_dir();
        let version = bin
            .parent()
            .and_then(|p| p.file_name())
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let dir = root.join(format!("pg-template-{version}"));
        if dir.join("PG_VERSION").exists() {
            return dir;
        }
        // Made aside and renamed into place: concurrent test binaries race
        // harmlessly.
        let work = root.join(format!("pg-template-{version}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).unwrap();
        hand_over(&work);
        let pwfile = work.join("pwfile");
        std::fs::write(&pwfile, PASSWORD).unwrap();
        hand_over(&pwfile);
        let data = work.join("data");
        let mut cmd = std::process::Command::new(bin.join("initdb"));
        if let Some((uid, gid)) = server_user() {
            cmd.uid(uid).gid(gid);
        }
        let out = cmd
            .env("LC_ALL", "C")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                USER,
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
            ])
            .args(["-E", "UTF8", "--locale=C", "-N"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if std::fs::rename(&data, &dir).is_err() {
            assert!(dir.join("PG_VERSION").exists(), "template not made");
        }
        let _ = std::fs::remove_dir_all(&work);
        dir
    })
}

impl Postgres {
    /// A fresh cluster on a free port, ready for logins.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Like [`Postgres::start`], with extra `-c name=value` settings.
    pub async fn start_with(settings: &[&str]) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let template = template();
        let dir = std::env::temp_dir().join(format!(
            "proxy-pool-pg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let out = std::process::Command::new("cp")
            .arg("-a")
            .arg(template)
            .arg(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "cp -a of the template failed");
        let mut pg = Self {
            dir,
            port: proxy_pool::local::free_port().unwrap(),
            child: None,
            extra: settings.iter().map(|s| s.to_string()).collect(),
        };
        pg.restart().await;
        pg
    }

    /// The data directory (owned by the server's user).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Copies `file` into the data directory for the server to read
    /// (e.g. a TLS key, which must belong to the server's user, mode 0600).
    pub fn give(&self, file: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let to = self.dir.join(file.file_name().unwrap());
        std::fs::copy(file, &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
        hand_over(&to);
        to
    }

    /// Extra `-c name=value` settings from the next (re)start on.
    pub fn configure(&mut self, settings: &[String]) {
        self.extra.extend(settings.iter().cloned());
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://` URL with the password, TLS off.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// An immediate shutdown (as a crash or a pulled plug: open transactions
    /// are lost, nothing committed is); waits until it is gone.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let status = Command::from(pg_ctl_stop(&self.dir))
                .status()
                .await
                .unwrap();
            assert!(status.success(), "pg_ctl stop failed");
            let _ = child.wait().await;
        }
    }

    /// Starts it (again) on the same port and data, and waits until it
    /// accepts logins (polled, bounded).
    pub async fn restart(&mut self) {
        self.stop().await;
        let log = std::fs::File::create(self.dir.join("server.log")).unwrap();
        let mut cmd = as_server(bin_dir().join("postgres"));
        cmd.arg("-D")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k", ""])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "synchronous_commit=off", "-c", "max_connections=40"])
            .args(["-c", "shared_buffers=16MB"]);
        for s in &self.extra {
            cmd.args(["-c", s]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.child = Some(child);
        for _ in 0..200 {
            match tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await {
                Ok((client, conn)) => {
                    tokio::spawn(conn);
                    if client.simple_query("SELECT 1").await.is_ok() {
                        return;
                    }
                }
                // The server answered but refused this login (e.g. a test's
                // pg_hba.conf allows TLS only): it is up. 57P03: starting.
                Err(e) if e.as_db_error().is_some_and(|d| d.code().code() != "57P03") => {
                    return;
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        panic!("postgres did not start within 10 s:\n{log}");
    }

    /// A plain connection for inspecting the database.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    }
}
