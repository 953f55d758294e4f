//! Shared helpers for the tests that drive the real `skerry` binary: [`Server`] starts
//! `skerry server` on a data dir and a free port, waits until it serves, and kills it on drop.
//!
//! Invariant: a `Server` value owns a running (or already reaped) child process; dropping it
//! always kills and reaps that process, so a failing test never leaves a server behind.

#![allow(
    dead_code,
    reason = "each test binary uses a different subset of these helpers"
)]

pub mod boxes;
pub mod kube;
pub mod node;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What `skerry server` prints on stdout once it accepts connections (appliance/src/main.rs).
const READY_LINE: &str = "skerry: serving etcd v3 API on";

/// How long a server gets to open its store and bind. A debug build opens an empty redb in
/// well under a second; the slack covers a loaded 2-core CI machine running tests in parallel.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts to start a server when the port picked turns out to be taken. The port is free
/// when picked but another process (a parallel test's client socket) may grab it before the
/// server binds; one retry almost always suffices, three bounds a pathological machine.
const START_ATTEMPTS_MAX: usize = 3;

/// Bytes of server stderr kept for failure messages: enough for the last few hundred log
/// lines, small enough to print in a panic.
const LOG_TAIL_BYTES_MAX: usize = 64 * 1024;

/// A running `skerry server`, killed (SIGKILL) and reaped on drop.
pub struct Server {
    child: Child,
    port: u16,
    data_dir: PathBuf,
    /// The tail of the server's stderr. A `std::sync::Mutex`: the reader thread appends one
    /// line at a time and readers copy it out; no critical section blocks.
    log: Arc<Mutex<Vec<u8>>>,
}

/// Why one start attempt failed.
enum StartError {
    /// The port was taken between picking and binding: try another.
    PortTaken,
}

impl Server {
    /// Starts `skerry server` on `data_dir` (created by the server if missing) and a free
    /// port, and returns once it serves.
    ///
    /// # Panics
    /// If the server exits or does not become ready within [`READY_TIMEOUT`], with its logs.
    pub fn start(data_dir: &Path) -> Server {
        Self::start_with_args(data_dir, &[])
    }

    /// Like [`Server::start`], passing `extra_args` after the data dir and listen URL flags
    /// (for example `["--experimental-watch-progress-notify-interval", "1s"]`).
    ///
    /// # Panics
    /// If the server exits or does not become ready within [`READY_TIMEOUT`], with its logs.
    pub fn start_with_args(data_dir: &Path, extra_args: &[&str]) -> Server {
        for _ in 0..START_ATTEMPTS_MAX {
            match Self::try_start_with_scheme(data_dir, "http", free_port(), extra_args) {
                Ok(server) => return server,
                Err(StartError::PortTaken) => continue,
            }
        }
        panic!("could not start skerry: the port was taken {START_ATTEMPTS_MAX} times");
    }

    /// Like [`Server::start_with_args`] on a given client port (a member restarting where its
    /// clients expect it).
    ///
    /// # Panics
    /// If the port is taken, the server exits, or it does not become ready in time.
    pub fn start_on_port(data_dir: &Path, port: u16, extra_args: &[&str]) -> Server {
        match Self::try_start_with_scheme(data_dir, "http", port, extra_args) {
            Ok(server) => server,
            Err(StartError::PortTaken) => panic!("client port {port} is taken"),
        }
    }

    /// Like [`Server::start_with_args`] with an `https://` client URL (pass the TLS flags in
    /// `extra_args`).
    ///
    /// # Panics
    /// If the server exits or does not become ready in time.
    pub fn start_https(data_dir: &Path, extra_args: &[&str]) -> Server {
        for _ in 0..START_ATTEMPTS_MAX {
            match Self::try_start_with_scheme(data_dir, "https", free_port(), extra_args) {
                Ok(server) => return server,
                Err(StartError::PortTaken) => continue,
            }
        }
        panic!("could not start skerry: the port was taken {START_ATTEMPTS_MAX} times");
    }

    fn try_start_with_scheme(
        data_dir: &Path,
        scheme: &str,
        port: u16,
        extra_args: &[&str],
    ) -> Result<Server, StartError> {
        let url = format!("{scheme}://127.0.0.1:{port}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_skerry"))
            .arg("server")
            // The etcd-API tests run many servers at once: no Kubernetes API on them.
            .arg("--secure-port=0")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen-client-urls")
            .arg(&url)
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the skerry binary");

        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let stderr_reader = spawn_log_reader(stderr, Arc::clone(&log));

        // The stdout reader keeps draining after the ready line so the server never blocks on
        // a full pipe; it stops at EOF, when the server exits.
        let stdout = child.stdout.take().expect("stdout is piped");
        let (lines_tx, lines_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = lines_tx.send(line);
            }
        });

        let server = Server {
            child,
            port,
            data_dir: data_dir.to_path_buf(),
            log,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines_rx.recv_timeout(left) {
                Ok(line) if line.starts_with(READY_LINE) => return Ok(server),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "skerry on {url} not ready after {READY_TIMEOUT:?}; stderr:\n{}",
                        server.logs()
                    );
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed: the server exited. Reap it, let the log reader finish.
                    let mut server = server;
                    let status = server.child.wait().expect("reap the exited skerry");
                    let _ = stderr_reader.join();
                    let logs = server.logs();
                    if logs.contains("listen on") && logs.to_lowercase().contains("in use") {
                        return Err(StartError::PortTaken);
                    }
                    panic!("skerry on {url} exited before serving ({status}); stderr:\n{logs}");
                }
            }
        }
    }

    /// The endpoint in etcdctl's default form: `127.0.0.1:PORT`, without a scheme.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The client URL the server listens on and advertises: `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server with SIGKILL, as a crash would, and reaps it.
    pub fn kill(mut self) -> ExitStatus {
        self.child.kill().expect("send SIGKILL to skerry");
        self.child.wait().expect("reap the killed skerry")
    }

    /// The server's exit status if it has exited, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("poll the skerry process")
    }

    /// The tail of what the server wrote to stderr so far (its logs).
    pub fn logs(&self) -> String {
        let log = self
            .log
            .lock()
            .expect("log reader never panics holding the lock");
        String::from_utf8_lossy(&log).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Errors mean the process is already gone; nothing is left to clean up then.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where test servers' ports come from: below Linux's ephemeral range (32768-60999 by
/// default), so no outgoing connection of any process — another test's clients, the
/// controllers' loopback connections — is ever given one of them by the kernel. A port from
/// `bind(0)` is ephemeral: a member restarted on "its" port could find it taken by some
/// process's outgoing connection meanwhile, which made the restart tests flaky.
const TEST_PORTS: std::ops::Range<u16> = 10_000..32_768;

/// Picks tried before giving up: the range has 22,768 ports and the tests use a few hundred.
const FREE_PORT_ATTEMPTS_MAX: usize = 1_000;

/// A port outside the ephemeral range that was free a moment ago.
pub fn free_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::rng();
    for _ in 0..FREE_PORT_ATTEMPTS_MAX {
        let port = rng.random_range(TEST_PORTS);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {TEST_PORTS:?} after {FREE_PORT_ATTEMPTS_MAX} tries");
}

/// Copies `source` into `log` line by line, keeping the last [`LOG_TAIL_BYTES_MAX`] bytes.
fn spawn_log_reader(
    source: impl Read + Send + 'static,
    log: Arc<Mutex<Vec<u8>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let mut log = log
                .lock()
                .expect("log readers never panic holding the lock");
            log.extend_from_slice(&line);
            if log.len() > LOG_TAIL_BYTES_MAX {
                let excess = log.len() - LOG_TAIL_BYTES_MAX;
                log.drain(..excess);
            }
        }
    })
}

/// One HTTP/1.0 GET to `127.0.0.1:port`, the whole answer, retried for `within` while
/// nothing listens yet (a port-forward starting); each read waits at most `read_timeout`.
pub fn http_get(
    port: u16,
    path: &str,
    within: Duration,
    read_timeout: Duration,
) -> Result<String, String> {
    use std::io::Write;
    let deadline = Instant::now() + within;
    loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(read_timeout))?;
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: web\r\n\r\n").as_bytes())?;
            let mut answer = String::new();
            s.read_to_string(&mut answer)?;
            Ok(answer)
        })();
        match attempt {
            Ok(a) if !a.is_empty() => return Ok(a),
            Ok(_) if Instant::now() > deadline => return Err("empty answer".to_string()),
            Err(e) if Instant::now() > deadline => return Err(e.to_string()),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The API URL of the admin kubeconfig `kube`'s server wrote.
pub fn api_url(kube: &kube::Kube) -> String {
    let text = std::fs::read_to_string(&kube.kubeconfig).expect("kubeconfig");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("a server line")
        .trim()
        .trim_matches('"')
        .to_string()
}

/// This machine's first global IPv4 address (what an agent's Node publishes and its serving
/// certificate must name).
pub fn host_ip() -> String {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .expect("ip addr");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next().map(str::to_string)
        })
        .expect("a global IPv4 address")
}
