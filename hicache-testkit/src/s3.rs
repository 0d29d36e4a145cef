//! Real S3 servers on loopback for tests: `moto_server` and `s3s-fs`, each started on a free
//! 127.0.0.1 port for the test run and stopped when dropped. A server counts as started once
//! it answers an HTTP request on a listening socket that its own process holds (on Linux,
//! checked through `/proc`), so a test never talks to another server that took the port.
//!
//! Binaries are found through `HICACHE_MOTO_SERVER` / `HICACHE_S3S_FS`, else in the workspace's
//! `target/s3-venv/bin/moto_server` and `target/s3s/bin/s3s-fs`, where `cargo xtask s3-servers`
//! (run by `cargo xtask ci`) installs them. When `HICACHE_REQUIRE_S3=1` (set by CI), a missing
//! server is a failure, not a skip.

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
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

/// Ports handed to live servers of this process. Tests in one binary run on parallel threads,
/// and a server that is restarted gives its port up for the moment it is down: without this
/// set, another test's `bind(0)` could get that port, and two servers would race for it, with
/// one test talking to the other's server.
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

fn reserved() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    RESERVED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port the kernel calls free that no live server of this process holds, now reserved.
fn reserve_port() -> std::io::Result<u16> {
    for _ in 0..64 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if reserved().insert(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::other(
        "no free loopback port after 64 tries",
    ))
}

/// Why a child did not come up.
enum SpawnError {
    /// It exited during start-up, most often because its port was taken: another may work.
    Exited(std::io::Error),
    /// It could not be run, or did not answer in time.
    Other(std::io::Error),
}

impl From<SpawnError> for std::io::Error {
    fn from(e: SpawnError) -> Self {
        match e {
            SpawnError::Exited(e) | SpawnError::Other(e) => e,
        }
    }
}

/// How many ports `start` tries when a server exits at start (its port taken by another
/// process between `reserve_port` and the server's own bind).
const START_TRIES: usize = 3;

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
            port: reserve_port()?,
            child: None,
            root,
        };
        let mut tries = 1;
        loop {
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(SpawnError::Exited(_)) if tries < START_TRIES => {
                    tries += 1;
                    let old = server.port;
                    server.port = reserve_port()?;
                    reserved().remove(&old);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Starts the child on `self.port` and waits until it answers an HTTP request while it
    /// still runs. A TCP connect alone is not enough: it also succeeds against another
    /// process's server on the port, and a child that lost the port exits only after its
    /// start-up (a second or more for moto).
    fn spawn(&mut self) -> Result<(), SpawnError> {
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
            .spawn()
            .map_err(SpawnError::Other)?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let answered = self.request("GET", "/").is_ok();
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(SpawnError::Exited(std::io::Error::other(format!(
                    "{:?} server exited at start on port {}: {status}",
                    self.kind, self.port
                ))));
            }
            if answered && self.listens_in_child() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(SpawnError::Other(std::io::Error::new(
            ErrorKind::TimedOut,
            format!(
                "{:?} server did not answer on port {} within 30 s",
                self.kind, self.port
            ),
        )))
    }

    /// Whether the socket listening on our port is one of the child's descriptors: the proof
    /// that an answer came from our server and not from another process on the same port.
    /// Where `/proc` cannot tell (not Linux, or hidden), the answer alone has to do.
    fn listens_in_child(&self) -> bool {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return false;
        };
        let Some(inode) = listening_inode(self.port) else {
            return !Path::new("/proc/net/tcp").exists();
        };
        if inode == 0 {
            // Some sandboxes hide socket inodes.
            return true;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return true;
        };
        let want = format!("socket:[{inode}]");
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == want.as_str())
        })
    }

    /// Sends one request with an empty body and returns the reply's status code.
    fn request(&self, method: &str, path: &str) -> std::io::Result<u16> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        let status_line = reply.lines().next().unwrap_or("");
        status_line
            .strip_prefix("HTTP/1.")
            .and_then(|rest| rest.get(2..5))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| {
                std::io::Error::new(
                    ErrorKind::InvalidData,
                    format!("{method} {path}: not an HTTP reply: {status_line:?}"),
                )
            })
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
    /// The name must be a valid S3 bucket name (3–63 of `a-z`, `0-9`, `.` and `-`, starting
    /// and ending with a letter or digit): anything else is refused before it reaches a
    /// request line or a path.
    pub fn create_bucket(&self, bucket: &str) -> std::io::Result<()> {
        let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let valid = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && edge(bucket.bytes().next())
            && edge(bucket.bytes().last());
        if !valid {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("{bucket:?} is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-')"),
            ));
        }
        match self.kind {
            S3Kind::S3sFs => {
                std::fs::create_dir_all(self.root.as_ref().expect("root").path().join(bucket))
            }
            S3Kind::Moto => match self.request("PUT", &format!("/{bucket}"))? {
                200 => Ok(()),
                code => Err(std::io::Error::other(format!(
                    "create bucket {bucket}: HTTP {code}"
                ))),
            },
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
        self.spawn().map_err(Into::into)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
        reserved().remove(&self.port);
    }
}

/// The inode of the IPv4 socket listening on 127.0.0.1:`port`, from `/proc/net/tcp`.
fn listening_inode(port: u16) -> Option<u64> {
    const LISTEN: &str = "0A";
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&LISTEN))
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_name_that_could_leave_the_root_or_the_request_line_is_refused() {
        let server = S3Server {
            kind: S3Kind::S3sFs,
            binary: PathBuf::from("/nonexistent"),
            port: 0,
            child: None,
            root: Some(tempfile::tempdir().unwrap()),
        };
        for bad in [
            "..",
            "../escape",
            "a/b",
            "ab\r\nHost: x",
            "",
            "x",
            "Upper",
            "-ab",
            "ab-",
            &"a".repeat(64),
        ] {
            let err = server.create_bucket(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
        server.create_bucket("hicache-test.1").unwrap();
        assert!(
            server
                .root
                .as_ref()
                .unwrap()
                .path()
                .join("hicache-test.1")
                .is_dir()
        );
    }

    #[test]
    fn the_listening_socket_of_a_port_is_found_among_its_owners_descriptors() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let Some(inode) = listening_inode(port) else {
            assert!(
                !Path::new("/proc/net/tcp").exists(),
                "port {port} not in /proc/net/tcp"
            );
            return;
        };
        let want = format!("socket:[{inode}]");
        let ours = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == want.as_str()));
        assert!(
            inode == 0 || ours,
            "inode {inode} of port {port} is not ours"
        );
        drop(listener);
        assert_eq!(
            listening_inode(port),
            None,
            "port {port} still listed as listening"
        );
    }

    /// A server that loses its port to another process is not taken for ready, however well
    /// the other one answers: its start fails as an exit, which `start` retries elsewhere.
    #[test]
    fn an_answer_from_another_process_on_the_port_is_not_readiness() {
        let Some(binary) = find(S3Kind::Moto) else {
            assert!(!required(), "moto_server is required but not installed");
            return;
        };
        let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = squatter.local_addr().unwrap().port();
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = answered.clone();
        std::thread::spawn(move || {
            for mut conn in squatter.incoming().flatten() {
                let mut request = [0u8; 1024];
                let _ = conn.read(&mut request);
                let _ = conn.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let mut server = S3Server {
            kind: S3Kind::Moto,
            binary,
            port,
            child: None,
            root: None,
        };
        match server.spawn() {
            Err(SpawnError::Exited(e)) => assert!(e.to_string().contains("exited at start")),
            Err(SpawnError::Other(e)) => panic!("not an exit: {e}"),
            Ok(()) => panic!("the squatter's answer on port {port} was taken for moto's"),
        }
        assert!(answered.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }
}
