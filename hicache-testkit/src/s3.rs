//! Real S3 servers on loopback for tests: `moto_server` and `s3s-fs`, each started on a free
//! 127.0.0.1 port for the test run and stopped when dropped.
//!
//! Binaries are found through `HICACHE_MOTO_SERVER` / `HICACHE_S3S_FS`, else in the workspace's
//! `target/s3-venv/bin/moto_server` and `target/s3s/bin/s3s-fs`, where `cargo xtask s3-servers`
//! (run by `cargo xtask ci`) installs them. When `HICACHE_REQUIRE_S3=1` (set by CI), a missing
//! server is a failure, not a skip.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum S3Kind {
    /// `moto_server` (Python): full conditional-request semantics, accepts any credentials.
    Moto,
    /// `s3s-fs` (Rust): a directory per bucket, checks SigV4 signatures.
    S3sFs,
}

/// Credentials the servers are started with (s3s-fs checks them).
pub const ACCESS_KEY: &str = "hicache-test-access";
/// Secret of [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "hicache-test-secret-0123456789";

/// A running server.
#[derive(Debug)]
pub struct S3Server {
    kind: S3Kind,
    binary: PathBuf,
    port: u16,
    child: Option<Child>,
    root: Option<tempfile::TempDir>,
}

/// Whether CI demands the servers (a missing one fails instead of skipping).
pub fn required() -> bool {
    std::env::var("HICACHE_REQUIRE_S3").is_ok_and(|v| v == "1")
}

fn workspace_target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        })
}

/// Where the server binary is, if installed.
pub fn find(kind: S3Kind) -> Option<PathBuf> {
    let (var, rel) = match kind {
        S3Kind::Moto => ("HICACHE_MOTO_SERVER", "s3-venv/bin/moto_server"),
        S3Kind::S3sFs => ("HICACHE_S3S_FS", "s3s/bin/s3s-fs"),
    };
    std::env::var_os(var)
        .map(PathBuf::from)
        .or_else(|| Some(workspace_target().join(rel)))
        .filter(|p| p.is_file())
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl S3Server {
    /// Starts a server of `kind`; an error says what is missing and how to install it.
    pub fn start(kind: S3Kind) -> std::io::Result<Self> {
        let binary = find(kind).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{kind:?} server not installed; run `cargo xtask s3-servers` (or set HICACHE_MOTO_SERVER / HICACHE_S3S_FS)"),
            )
        })?;
        let root = match kind {
            S3Kind::S3sFs => Some(tempfile::Builder::new().prefix("hicache-s3s-").tempdir()?),
            S3Kind::Moto => None,
        };
        let mut server = S3Server {
            kind,
            binary,
            port: free_port()?,
            child: None,
            root,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let mut cmd = Command::new(&self.binary);
        match self.kind {
            S3Kind::Moto => {
                cmd.args(["-H", "127.0.0.1", "-p", &self.port.to_string()]);
            }
            S3Kind::S3sFs => {
                cmd.args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
                    .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
                    .arg(self.root.as_ref().expect("s3s-fs has a root").path());
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(std::io::Error::other(format!(
                    "{:?} server exited at start: {status}",
                    self.kind
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "{:?} server did not listen on port {}",
                self.kind, self.port
            ),
        ))
    }

    /// Which server this is.
    pub fn kind(&self) -> S3Kind {
        self.kind
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates a bucket (an unsigned PUT for moto, a directory for s3s-fs).
    pub fn create_bucket(&self, bucket: &str) -> std::io::Result<()> {
        match self.kind {
            S3Kind::S3sFs => {
                std::fs::create_dir_all(self.root.as_ref().expect("root").path().join(bucket))
            }
            S3Kind::Moto => {
                let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
                write!(
                    s,
                    "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.port
                )?;
                let mut reply = String::new();
                s.read_to_string(&mut reply)?;
                if reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200") {
                    Ok(())
                } else {
                    Err(std::io::Error::other(format!(
                        "create bucket {bucket}: {}",
                        reply.lines().next().unwrap_or("")
                    )))
                }
            }
        }
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (s3s-fs keeps its data; moto starts empty).
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}
