//! Drives `skerry server` with the real etcdctl 3.4.23 (`apt-get install etcd-client`) and
//! checks that it prints what it prints against etcd 3.4.
//!
//! Each test starts its own server on a temp dir and a free port, so tests run in parallel.
//! Where values matter the output is read with `-w json` (keys and values are base64 there);
//! elsewhere the "simple" format is compared byte for byte, since scripts parse it.
//!
//! Endpoints are passed as etcdctl's default form (`127.0.0.1:PORT`); `http_scheme_endpoints`
//! checks the `http://` form, whose per-endpoint commands (endpoint status/hashkv, defrag)
//! send an `http://…` :authority that skerry must accept.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::Server;
use serde_json::Value;

/// The etcdctl binary, found on PATH (Debian's etcd-client puts it in /usr/bin).
const ETCDCTL: &str = "etcdctl";

/// How long a watch gets to print an event we expect. Events reach a synced watcher within
/// milliseconds; the slack covers a loaded 2-core machine running the suite in parallel.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long we listen for output that must not come (an extra watch event). Long enough for
/// a wrongly sent event to arrive on an idle machine; each use adds this to the suite's time.
const QUIET_PERIOD: Duration = Duration::from_millis(300);

/// How long a watch that the server cancels gets to exit on its own.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// What one etcdctl run left behind.
struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Output {
    fn combined(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// etcdctl aimed at one server.
struct Etcdctl {
    endpoints: String,
}

impl Etcdctl {
    fn new(server: &Server) -> Self {
        Self {
            endpoints: server.endpoint(),
        }
    }

    /// etcdctl against `endpoints` exactly as given (for the `http://` scheme test).
    fn with_endpoints(endpoints: String) -> Self {
        Self { endpoints }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(ETCDCTL);
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints))
            .args(args);
        command
    }

    /// Runs etcdctl to completion. etcdctl bounds itself: a 2 s dial and a 5 s command timeout.
    fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, b"")
    }

    fn run_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {ETCDCTL} (apt-get install etcd-client): {e}"));
        let mut input = child.stdin.take().expect("stdin is piped");
        let stdin = stdin.to_vec();
        // A separate writer: a large value must not deadlock against etcdctl's own output.
        let writer = std::thread::spawn(move || {
            // etcdctl may exit without reading all of it (a usage error); that is its answer.
            let _ = input.write_all(&stdin);
        });
        let output = child.wait_with_output().expect("wait for etcdctl");
        writer.join().expect("stdin writer never panics");
        Output {
            status: output.status,
            stdout: String::from_utf8(output.stdout).expect("etcdctl prints UTF-8 here"),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs etcdctl, asserts it succeeded, and returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        self.ok_with_stdin(args, b"")
    }

    fn ok_with_stdin(&self, args: &[&str], stdin: &[u8]) -> String {
        let out = self.run_with_stdin(args, stdin);
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed ({}):\n{}",
            out.status,
            out.combined()
        );
        out.stdout
    }

    /// Runs etcdctl, asserts it failed with `message` in its output, and returns the output.
    fn fails(&self, args: &[&str], message: &str) -> Output {
        self.fails_with_stdin(args, b"", message)
    }

    fn fails_with_stdin(&self, args: &[&str], stdin: &[u8], message: &str) -> Output {
        let out = self.run_with_stdin(args, stdin);
        assert!(
            !out.status.success(),
            "etcdctl {args:?} succeeded, expected {message:?}:\n{}",
            out.combined()
        );
        assert!(
            out.combined().contains(message),
            "etcdctl {args:?} failed without {message:?}:\n{}",
            out.combined()
        );
        out
    }

    /// Runs etcdctl with `-w json` and parses what it prints.
    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-w", "json"]);
        let stdout = self.ok(&args);
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("etcdctl {args:?} printed bad JSON ({e}):\n{stdout}"))
    }

    /// The store's current revision, from the header of a range over nothing.
    fn revision(&self) -> i64 {
        let response = self.json(&["get", "revision-probe-key-never-written"]);
        // etcd's JSON omits zero fields, so an absent revision is revision 0.
        response["header"].get("revision").map_or(0, int)
    }

    /// Starts `etcdctl watch ARGS` in the background.
    fn watch(&self, args: &[&str]) -> Background {
        let mut full = vec!["watch"];
        full.extend_from_slice(args);
        self.spawn(&full)
    }

    /// Starts a long-running etcdctl command (`watch`, `lease keep-alive`) in the background.
    fn spawn(&self, args: &[&str]) -> Background {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {ETCDCTL} (apt-get install etcd-client): {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr_pipe.read_to_string(&mut text);
            text
        });
        Background {
            child,
            lines,
            stderr: Some(stderr),
            args: args.join(" "),
        }
    }
}

/// A running etcdctl command, killed on drop.
struct Background {
    child: Child,
    /// stdout, a line at a time, from a reader thread: a channel so reads can time out.
    lines: mpsc::Receiver<String>,
    stderr: Option<JoinHandle<String>>,
    args: String,
}

impl Background {
    /// The next `n` lines of stdout, panicking if they do not all come within [`EVENT_TIMEOUT`].
    fn lines(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        let mut got = Vec::new();
        while got.len() < n {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => got.push(line),
                Err(_) => panic!("etcdctl {} printed {got:?}, expected {n} lines", self.args),
            }
        }
        got
    }

    /// The next line, if one comes within `timeout`.
    fn line_within(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Asserts that nothing more is printed for [`QUIET_PERIOD`].
    fn assert_quiet(&self) {
        if let Ok(line) = self.lines.recv_timeout(QUIET_PERIOD) {
            panic!("etcdctl {} printed an unexpected {line:?}", self.args);
        }
    }

    /// Waits for etcdctl to exit on its own; returns its status and everything it printed.
    fn wait_exit(mut self) -> Output {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("poll etcdctl") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "etcdctl {} still running after {EXIT_TIMEOUT:?}",
                self.args
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let stderr = self
            .stderr
            .take()
            .expect("stderr is joined once")
            .join()
            .expect("stderr reader never panics");
        let stdout: Vec<String> = self.lines.try_iter().collect();
        Output {
            status,
            stdout: stdout.join("\n"),
            stderr,
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // Errors mean etcdctl already exited.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("create a temp dir")
}

/// A server with the data dir that it lives in; the dir outlives the server (field order).
fn start() -> (Server, tempfile::TempDir) {
    let dir = temp_dir();
    let server = Server::start(&dir.path().join("data"));
    (server, dir)
}

fn int(v: &Value) -> i64 {
    v.as_i64()
        .unwrap_or_else(|| panic!("expected an integer, got {v}"))
}

/// A base64 JSON string (etcdctl's encoding of keys and values) decoded to text.
fn text(v: &Value) -> String {
    let encoded = v
        .as_str()
        .unwrap_or_else(|| panic!("expected a base64 string, got {v}"));
    let bytes = BASE64
        .decode(encoded)
        .unwrap_or_else(|e| panic!("bad base64 {encoded:?}: {e}"));
    String::from_utf8(bytes).expect("test keys and values are UTF-8")
}

/// The keys of a range response's `kvs`, in order.
fn keys(response: &Value) -> Vec<String> {
    kvs(response).iter().map(|kv| text(&kv["key"])).collect()
}

fn kvs(response: &Value) -> Vec<Value> {
    // etcd omits empty repeated fields from JSON.
    response["kvs"].as_array().cloned().unwrap_or_default()
}

/// The lease id from "lease 694d77aa9e38260f granted with TTL(2s)".
fn granted_lease(stdout: &str, ttl_s: i64) -> String {
    let id = stdout
        .strip_prefix("lease ")
        .and_then(|rest| rest.strip_suffix(&format!(" granted with TTL({ttl_s}s)\n")))
        .unwrap_or_else(|| panic!("unexpected lease grant output {stdout:?}"));
    assert!(
        i64::from_str_radix(id, 16).is_ok(),
        "lease id {id:?} is not hex"
    );
    id.to_string()
}

/// `--rev=N`.
fn rev_flag(revision: i64) -> String {
    format!("--rev={revision}")
}

// Revisions below are counted from `r0`, the store's revision before the test's first write,
// so the checks hold whatever revision a fresh store starts at (see `fresh_store_revision`).

#[test]
fn fresh_store_revision() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);
    // etcd: {"header":{...,"revision":1,...}} on a fresh cluster (mvcc NewStore: currentRev 1).
    let empty = ctl.json(&["get", "foo"]);
    assert_eq!(
        empty["header"].get("revision").and_then(Value::as_i64),
        Some(1),
        "{empty}"
    );
    // etcd's docs: `etcdctl put foo bar  # revision = 2` on a fresh cluster.
    ctl.ok(&["put", "foo", "bar"]);
    let got = ctl.json(&["get", "foo"]);
    assert_eq!(int(&got["header"]["revision"]), 2);
    assert_eq!(int(&got["kvs"][0]["create_revision"]), 2);
    assert_eq!(int(&got["kvs"][0]["mod_revision"]), 2);
}

#[test]
fn put_and_get() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);
    let r0 = ctl.revision();

    assert_eq!(ctl.ok(&["put", "foo", "bar"]), "OK\n"); // r0 + 1
    assert_eq!(ctl.ok(&["get", "foo"]), "foo\nbar\n");
    let first = ctl.json(&["get", "foo"]);
    assert_eq!(int(&first["header"]["revision"]), r0 + 1);
    assert_eq!(int(&first["count"]), 1);
    let kv = &first["kvs"][0];
    assert_eq!(text(&kv["key"]), "foo");
    assert_eq!(text(&kv["value"]), "bar");
    assert_eq!(int(&kv["create_revision"]), r0 + 1);
    assert_eq!(int(&kv["mod_revision"]), r0 + 1);
    assert_eq!(int(&kv["version"]), 1);

    ctl.ok(&["put", "foo1", "x"]); // r0 + 2
    ctl.ok(&["put", "foo2", "y"]); // r0 + 3
    // --prev-kv prints the value it replaced after OK.
    assert_eq!(
        ctl.ok(&["put", "foo", "baz", "--prev-kv"]),
        "OK\nfoo\nbar\n"
    ); // r0 + 4
    ctl.ok(&["put", "other", "z"]); // r0 + 5

    let second = ctl.json(&["get", "foo"]);
    assert_eq!(int(&second["header"]["revision"]), r0 + 5);
    let kv = &second["kvs"][0];
    assert_eq!(text(&kv["value"]), "baz");
    assert_eq!(int(&kv["create_revision"]), r0 + 1);
    assert_eq!(int(&kv["mod_revision"]), r0 + 4);
    assert_eq!(int(&kv["version"]), 2);

    assert_eq!(
        ctl.ok(&["get", "--prefix", "foo"]),
        "foo\nbaz\nfoo1\nx\nfoo2\ny\n"
    );
    assert_eq!(
        ctl.ok(&["get", "", "--from-key"]),
        "foo\nbaz\nfoo1\nx\nfoo2\ny\nother\nz\n"
    );
    assert_eq!(
        ctl.ok(&["get", "foo1", "foo3"]),
        "foo1\nx\nfoo2\ny\n",
        "explicit range end"
    );

    // An older revision: the old value; the header still carries the current revision.
    assert_eq!(ctl.ok(&["get", "foo", &rev_flag(r0 + 1)]), "foo\nbar\n");
    let old = ctl.json(&["get", "foo", &rev_flag(r0 + 3)]);
    assert_eq!(int(&old["header"]["revision"]), r0 + 5);
    assert_eq!(text(&old["kvs"][0]["value"]), "bar");
    assert_eq!(int(&old["kvs"][0]["version"]), 1);
    assert_eq!(
        ctl.ok(&["get", "foo2", &rev_flag(r0 + 2)]),
        "",
        "foo2 did not exist yet"
    );

    // --limit: one kv, `more`, and `count` over the whole range.
    let limited = ctl.json(&["get", "--prefix", "foo", "--limit", "1"]);
    assert_eq!(keys(&limited), ["foo"]);
    assert_eq!(limited["more"], Value::Bool(true));
    assert_eq!(int(&limited["count"]), 3);
    let unlimited = ctl.json(&["get", "--prefix", "foo"]);
    assert_eq!(unlimited.get("more"), None, "etcd omits more=false");
    assert_eq!(int(&unlimited["count"]), 3);

    // --keys-only prints each key followed by an empty value line.
    assert_eq!(
        ctl.ok(&["get", "--prefix", "foo", "--keys-only"]),
        "foo\n\nfoo1\n\nfoo2\n\n"
    );
    let keys_only = ctl.json(&["get", "--prefix", "foo", "--keys-only"]);
    assert_eq!(keys(&keys_only), ["foo", "foo1", "foo2"]);
    assert!(
        kvs(&keys_only).iter().all(|kv| kv.get("value").is_none()),
        "{keys_only}"
    );
    // (etcdctl 3.4.23 has no --count-only; `count` above is what it would print.)

    // Sorting: foo was modified last (r0 + 4), then foo2 (r0 + 3), then foo1 (r0 + 2).
    let sorted = |sort: &[&str]| {
        let mut args = vec!["get", "--prefix", "foo", "--keys-only"];
        args.extend_from_slice(sort);
        ctl.ok(&args)
    };
    assert_eq!(
        sorted(&["--sort-by=MODIFY", "--order=DESCEND"]),
        "foo\n\nfoo2\n\nfoo1\n\n"
    );
    assert_eq!(
        sorted(&["--sort-by=MODIFY", "--order=ASCEND"]),
        "foo1\n\nfoo2\n\nfoo\n\n"
    );
    assert_eq!(
        sorted(&["--order=DESCEND"]),
        "foo2\n\nfoo1\n\nfoo\n\n",
        "by key"
    );
    assert_eq!(
        sorted(&["--sort-by=VALUE"]),
        "foo\n\nfoo1\n\nfoo2\n\n",
        "baz < x < y"
    );
    let by_version = ctl.json(&[
        "get",
        "--prefix",
        "foo",
        "--sort-by=VERSION",
        "--order=DESCEND",
        "--limit=1",
    ]);
    assert_eq!(keys(&by_version), ["foo"]);

    assert_eq!(ctl.ok(&["get", "foo", "--print-value-only"]), "baz\n");
    assert_eq!(ctl.ok(&["get", "missing"]), "");
    let missing = ctl.json(&["get", "missing"]);
    assert_eq!(missing.get("kvs"), None, "{missing}");
    assert_eq!(missing.get("count"), None, "etcd omits count=0: {missing}");
}

#[test]
fn delete() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);
    let r0 = ctl.revision();
    for (key, value) in [("a/1", "1"), ("a/2", "2"), ("a/3", "3"), ("b", "b")] {
        ctl.ok(&["put", key, value]);
    }
    assert_eq!(ctl.revision(), r0 + 4);

    // A delete that matches nothing prints 0 and does not create a revision.
    assert_eq!(ctl.ok(&["del", "missing"]), "0\n");
    assert_eq!(ctl.ok(&["del", "--prefix", "missing/"]), "0\n");
    assert_eq!(ctl.revision(), r0 + 4);
    let none = ctl.json(&["del", "missing"]);
    assert_eq!(none.get("deleted"), None, "etcd omits deleted=0: {none}");
    assert_eq!(int(&none["header"]["revision"]), r0 + 4);

    assert_eq!(ctl.ok(&["del", "a/1"]), "1\n");
    assert_eq!(ctl.revision(), r0 + 5);
    assert_eq!(ctl.ok(&["del", "--prev-kv", "a/2"]), "1\na/2\n2\n");
    assert_eq!(ctl.revision(), r0 + 6);

    // A prefix delete removes every match in one revision.
    ctl.ok(&["put", "a/4", "4"]); // r0 + 7
    assert_eq!(ctl.ok(&["del", "--prefix", "a/"]), "2\n");
    assert_eq!(ctl.revision(), r0 + 8);
    assert_eq!(ctl.ok(&["get", "--prefix", "a/"]), "");

    let deleted = ctl.json(&["del", "b", "--prev-kv"]);
    assert_eq!(int(&deleted["deleted"]), 1);
    assert_eq!(int(&deleted["header"]["revision"]), r0 + 9);
    assert_eq!(text(&deleted["prev_kvs"][0]["value"]), "b");
    assert_eq!(ctl.ok(&["get", "", "--from-key"]), "");

    // The history is still there.
    assert_eq!(
        ctl.ok(&["get", "--prefix", "a/", &rev_flag(r0 + 4), "--keys-only"]),
        "a/1\n\na/2\n\na/3\n\n"
    );
}

#[test]
fn txn() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);
    let r0 = ctl.revision();
    ctl.ok(&["put", "foo", "bar"]); // r0 + 1
    ctl.ok(&["put", "foo", "baz"]); // r0 + 2

    // etcdctl's interactive format: compares, blank line, success ops, blank line, failure ops.
    let all_hold = format!(
        "mod(\"foo\") = \"{mod_revision}\"\n\
         value(\"foo\") = \"baz\"\n\
         version(\"foo\") = \"2\"\n\
         create(\"foo\") = \"{create_revision}\"\n\
         mod(\"foo\") < \"{next}\"\n\
         version(\"foo\") > \"1\"\n\
         \n\
         put foo qux\n\
         get foo\n\
         \n\
         put foo never\n\
         \n",
        mod_revision = r0 + 2,
        create_revision = r0 + 1,
        next = r0 + 3,
    );
    assert_eq!(
        ctl.ok_with_stdin(&["txn"], all_hold.as_bytes()),
        "SUCCESS\n\nOK\n\nfoo\nqux\n"
    );
    let after = ctl.json(&["get", "foo"]);
    assert_eq!(
        int(&after["header"]["revision"]),
        r0 + 3,
        "a txn is one revision"
    );
    assert_eq!(text(&after["kvs"][0]["value"]), "qux");

    // foo's mod revision has moved on, so the failure branch runs.
    let stale = format!(
        "mod(\"foo\") = \"{}\"\n\nput foo never\n\nput other failed\nget other\ndel missing\n\n",
        r0 + 2
    );
    assert_eq!(
        ctl.ok_with_stdin(&["txn"], stale.as_bytes()),
        "FAILURE\n\nOK\n\nother\nfailed\n\n0\n"
    );
    assert_eq!(ctl.ok(&["get", "foo", "--print-value-only"]), "qux\n");

    // One failing compare among holding ones fails the txn; an empty branch prints nothing.
    let value_differs = "version(\"foo\") = \"3\"\nvalue(\"foo\") = \"bar\"\n\nput foo never\n\n\n";
    assert_eq!(
        ctl.ok_with_stdin(&["txn"], value_differs.as_bytes()),
        "FAILURE\n"
    );

    // create = 0 means "does not exist": the usual create-if-absent.
    let create_if_absent = "create(\"fresh\") = \"0\"\n\nput fresh yes\n\nget fresh\n\n";
    assert_eq!(
        ctl.ok_with_stdin(&["txn"], create_if_absent.as_bytes()),
        "SUCCESS\n\nOK\n"
    );
    assert_eq!(
        ctl.ok_with_stdin(&["txn"], create_if_absent.as_bytes()),
        "FAILURE\n\nfresh\nyes\n"
    );

    let json = ctl.ok_with_stdin(
        &["txn", "-w", "json"],
        b"version(\"foo\") = \"3\"\n\nget foo\n\n\n",
    );
    let json: Value = serde_json::from_str(&json).expect("txn -w json prints JSON");
    assert_eq!(json["succeeded"], Value::Bool(true));
    let range = &json["responses"][0]["Response"]["ResponseRange"];
    assert_eq!(text(&range["kvs"][0]["value"]), "qux");
    assert_eq!(int(&range["kvs"][0]["mod_revision"]), r0 + 3);

    // Two writes to one key in a txn are refused, and nothing is written.
    let revision = ctl.revision();
    ctl.fails_with_stdin(
        &["txn"],
        b"\nput dup 1\nput dup 2\n\n\n",
        "etcdserver: duplicate key given in txn request",
    );
    assert_eq!(ctl.revision(), revision);
    assert_eq!(ctl.ok(&["get", "dup"]), "");
}

#[test]
fn watch_replays_history() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);
    let r0 = ctl.revision();
    ctl.ok(&["put", "foo", "1"]); // r0 + 1
    ctl.ok(&["put", "foo", "2"]); // r0 + 2
    ctl.ok(&["del", "foo"]); // r0 + 3
    ctl.ok(&["put", "foo", "3"]); // r0 + 4
    ctl.ok(&["put", "foobar", "x"]); // r0 + 5
    ctl.ok(&["put", "other", "y"]); // r0 + 6

    // Each event prints its type, key and value; a delete's value is empty.
    let watch = ctl.watch(&["foo", &rev_flag(r0 + 1)]);
    assert_eq!(
        watch.lines(12),
        [
            "PUT", "foo", "1", "PUT", "foo", "2", "DELETE", "foo", "", "PUT", "foo", "3"
        ]
    );
    watch.assert_quiet();

    // --prev-kv prints the previous key and value before the event's own.
    let watch = ctl.watch(&["foo", "--prefix", &rev_flag(r0 + 2), "--prev-kv"]);
    assert_eq!(
        watch.lines(16),
        [
            "PUT", "foo", "1", "foo", "2", //
            "DELETE", "foo", "2", "foo", "", //
            "PUT", "foo", "3", //
            "PUT", "foobar", "x",
        ]
    );
    watch.assert_quiet();

    // A range watch [foo, foobar) excludes foobar; history starts at the given revision.
    let watch = ctl.watch(&["foo", "foobar", &rev_flag(r0 + 3)]);
    assert_eq!(watch.lines(6), ["DELETE", "foo", "", "PUT", "foo", "3"]);
    watch.assert_quiet();
}

#[test]
fn watch_live() {
    let dir = temp_dir();
    // A 1 s progress interval: etcdctl does not ask for progress notifications, so it must
    // hear none however often the server sends them to watchers that did ask.
    let server = Server::start_with_args(
        &dir.path().join("data"),
        &["--experimental-watch-progress-notify-interval", "1s"],
    );
    let ctl = Etcdctl::new(&server);
    ctl.ok(&["put", "live", "before"]);

    // The watch starts at "now", and etcdctl prints nothing when it is created: put until an
    // event shows up, then every later put must follow in order.
    let watch = ctl.watch(&["live"]);
    let deadline = Instant::now() + EVENT_TIMEOUT;
    let mut puts = 0;
    let first = loop {
        assert!(
            Instant::now() < deadline,
            "etcdctl watch printed nothing after {puts} puts"
        );
        ctl.ok(&["put", "live", &format!("v{puts}")]);
        puts += 1;
        if let Some(line) = watch.line_within(Duration::from_millis(200)) {
            break line;
        }
    };
    assert_eq!(first, "PUT");
    let rest = watch.lines(2);
    assert_eq!(rest[0], "live");
    let mut seen: usize = rest[1]
        .strip_prefix('v')
        .and_then(|n| n.parse().ok())
        .expect("a value this test put");
    for _ in seen + 1..puts {
        seen += 1;
        assert_eq!(watch.lines(3), ["PUT", "live", &format!("v{seen}")]);
    }
    ctl.ok(&["put", "live", "last"]);
    assert_eq!(watch.lines(3), ["PUT", "live", "last"]);
    ctl.ok(&["del", "live"]);
    assert_eq!(watch.lines(3), ["DELETE", "live", ""]);
    ctl.ok(&["put", "unrelated", "x"]);
    watch.assert_quiet();
    drop(watch);

    // In JSON each response is one line; starting at the next revision leaves no race.
    let next = ctl.revision() + 1;
    let watch = ctl.watch(&["live", &rev_flag(next), "-w", "json"]);
    ctl.ok(&["put", "live", "json"]);
    let line = watch.lines(1).remove(0);
    let response: Value = serde_json::from_str(&line).expect("watch -w json prints JSON lines");
    assert_eq!(int(&response["Header"]["revision"]), next);
    let events = response["Events"].as_array().expect("an event list");
    assert_eq!(events.len(), 1, "{response}");
    assert_eq!(events[0].get("type"), None, "PUT is type 0, omitted");
    assert_eq!(text(&events[0]["kv"]["value"]), "json");
    assert_eq!(int(&events[0]["kv"]["mod_revision"]), next);
    // Longer than the progress interval: no progress notification may reach this watch.
    if let Some(line) = watch.line_within(Duration::from_millis(1500)) {
        panic!("watch without progress_notify got {line}");
    }
}

#[test]
fn compaction() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);
    let r0 = ctl.revision();
    for value in ["1", "2", "3", "4"] {
        ctl.ok(&["put", "foo", value]); // r0 + 1 ..= r0 + 4
    }

    let at = (r0 + 3).to_string();
    assert_eq!(
        ctl.ok(&["compact", &at]),
        format!("compacted revision {at}\n")
    );
    let compacted = "etcdserver: mvcc: required revision has been compacted";
    ctl.fails(&["get", "foo", &rev_flag(r0 + 2)], compacted);
    ctl.fails(&["get", "foo", &rev_flag(r0 + 1)], compacted);
    assert_eq!(
        ctl.ok(&["get", "foo", &rev_flag(r0 + 3)]),
        "foo\n3\n",
        "still readable"
    );
    assert_eq!(ctl.ok(&["get", "foo"]), "foo\n4\n");

    // A watch from before the compaction is canceled by the server; etcdctl says why and exits.
    let out = ctl.watch(&["foo", &rev_flag(r0 + 2)]).wait_exit();
    assert!(
        !out.status.success(),
        "etcdctl watch exited 0:\n{}",
        out.combined()
    );
    assert!(
        out.combined()
            .contains(&format!("watch was canceled ({compacted})")),
        "etcdctl watch from a compacted revision printed:\n{}",
        out.combined()
    );
    let watch = ctl.watch(&["foo", &rev_flag(r0 + 3)]);
    assert_eq!(watch.lines(6), ["PUT", "foo", "3", "PUT", "foo", "4"]);
    drop(watch);

    // Compacting again below the compaction revision, or past the head, is refused.
    ctl.fails(&["compact", &(r0 + 2).to_string()], compacted);
    let future = "etcdserver: mvcc: required revision is a future revision";
    ctl.fails(&["compact", &(r0 + 100).to_string()], future);
    ctl.fails(&["get", "foo", &rev_flag(r0 + 1000)], future);
    ctl.fails(&["get", "foo", &rev_flag(r0 + 5)], future);

    let hash = ctl.json(&["endpoint", "hashkv"]);
    assert_eq!(int(&hash[0]["HashKV"]["compact_revision"]), r0 + 3);

    let at = (r0 + 4).to_string();
    assert_eq!(
        ctl.ok(&["compact", &at, "--physical"]),
        format!("compacted revision {at}\n")
    );
    ctl.fails(&["get", "foo", &rev_flag(r0 + 3)], compacted);
    assert_eq!(ctl.ok(&["get", "foo"]), "foo\n4\n");
}

#[test]
fn leases() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);

    let lease = granted_lease(&ctl.ok(&["lease", "grant", "2"]), 2);
    // A second 2 s lease, kept alive by etcdctl's keep-alive stream (every TTL/3).
    let kept = granted_lease(&ctl.ok(&["lease", "grant", "2"]), 2);
    ctl.ok(&["put", "kept", "v", &format!("--lease={kept}")]);
    let keep_alive = ctl.spawn(&["lease", "keep-alive", &kept]);
    let keepalived = format!("lease {kept} keepalived with TTL(2)");
    assert_eq!(keep_alive.lines(1), [keepalived.as_str()]);
    let lease_id = i64::from_str_radix(&lease, 16).expect("granted_lease checked the hex");
    assert_eq!(
        ctl.ok(&["put", "k", "v", &format!("--lease={lease}")]),
        "OK\n"
    );
    let got = ctl.json(&["get", "k"]);
    assert_eq!(int(&got["kvs"][0]["lease"]), lease_id);

    let ttl = ctl.ok(&["lease", "timetolive", &lease, "--keys"]);
    let remaining = ttl
        .strip_prefix(&format!("lease {lease} granted with TTL(2s), remaining("))
        .and_then(|rest| rest.strip_suffix("s), attached keys([k])\n"))
        .unwrap_or_else(|| panic!("unexpected timetolive output {ttl:?}"));
    assert!(
        matches!(remaining, "1" | "2"),
        "remaining {remaining}s of a 2 s lease"
    );
    let ttl = ctl.json(&["lease", "timetolive", &lease, "--keys"]);
    assert_eq!(int(&ttl["id"]), lease_id);
    assert_eq!(int(&ttl["granted-ttl"]), 2);
    assert_eq!(
        ttl["keys"]
            .as_array()
            .map(|keys| keys.iter().map(text).collect::<Vec<_>>()),
        Some(vec!["k".to_string()])
    );

    // etcd lists leases in no particular order.
    let list = ctl.ok(&["lease", "list"]);
    let mut listed: Vec<&str> = list.lines().collect();
    listed.sort_unstable();
    let mut expected = vec!["found 2 leases", &lease, &kept];
    expected.sort_unstable();
    assert_eq!(listed, expected, "lease list printed {list:?}");
    assert_eq!(
        ctl.ok(&["lease", "keep-alive", "--once", &lease]),
        format!("lease {lease} keepalived with TTL(2)\n")
    );
    let refreshed = Instant::now();
    assert_eq!(ctl.ok(&["get", "k"]), "k\nv\n");

    // No more keep-alives: the lease expires about 2 s later and takes its key with it.
    let deadline = refreshed + Duration::from_secs(6);
    while !ctl.ok(&["get", "k"]).is_empty() {
        assert!(
            Instant::now() < deadline,
            "k still there 6 s after its 2 s lease was refreshed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let lived = refreshed.elapsed();
    assert!(
        lived >= Duration::from_millis(1500),
        "a 2 s lease expired after {lived:?}"
    );
    assert_eq!(
        ctl.ok(&["lease", "timetolive", &lease]),
        format!("lease {lease} already expired\n")
    );
    ctl.fails(
        &["lease", "keep-alive", "--once", &lease],
        "etcdserver: requested lease not found",
    );
    ctl.fails(
        &["put", "k", "v", &format!("--lease={lease}")],
        "etcdserver: requested lease not found",
    );
    // Meanwhile the streamed keep-alives held the other lease.
    assert_eq!(keep_alive.lines(1), [keepalived.as_str()]);
    assert_eq!(ctl.ok(&["get", "kept"]), "kept\nv\n");
    assert_eq!(
        ctl.ok(&["lease", "list"]),
        format!("found 1 leases\n{kept}\n")
    );
    drop(keep_alive);

    // Revoking deletes every key attached, in one revision.
    let lease = granted_lease(&ctl.ok(&["lease", "grant", "60"]), 60);
    ctl.ok(&["put", "r1", "v", &format!("--lease={lease}")]);
    ctl.ok(&["put", "r2", "v", &format!("--lease={lease}")]);
    ctl.ok(&["put", "r3", "v"]);
    let revision = ctl.revision();
    assert_eq!(
        ctl.ok(&["lease", "revoke", &lease]),
        format!("lease {lease} revoked\n")
    );
    assert_eq!(ctl.revision(), revision + 1);
    assert_eq!(ctl.ok(&["get", "--prefix", "r", "--keys-only"]), "r3\n\n");
    ctl.fails(
        &["lease", "revoke", &lease],
        "etcdserver: requested lease not found",
    );
    ctl.fails(
        &["put", "x", "v", "--lease=1234"],
        "etcdserver: requested lease not found",
    );
}

#[test]
fn snapshot_save_and_restore() {
    let (server, dir) = start();
    let ctl = Etcdctl::new(&server);
    let r0 = ctl.revision();
    for (key, value) in [("a", "1"), ("b", "2"), ("c", "3"), ("a", "4")] {
        ctl.ok(&["put", key, value]);
    }
    ctl.ok(&["del", "b"]);
    let original = ctl.json(&["get", "", "--from-key"]);
    assert_eq!(int(&original["header"]["revision"]), r0 + 5);

    let file = dir.path().join("snapshot.db");
    let file_arg = file.to_str().expect("temp paths are UTF-8");
    assert_eq!(
        ctl.ok(&["snapshot", "save", file_arg]),
        format!("Snapshot saved at {file_arg}\n")
    );
    drop(server);

    let verify = skerry(&["snapshot", "verify", file_arg]);
    assert!(
        verify.status.success(),
        "skerry snapshot verify:\n{}",
        verify.combined()
    );

    let restored_dir = dir.path().join("restored");
    let restored_arg = restored_dir.to_str().expect("temp paths are UTF-8");
    let restore = skerry(&["snapshot", "restore", file_arg, "--data-dir", restored_arg]);
    assert!(
        restore.status.success(),
        "skerry snapshot restore:\n{}",
        restore.combined()
    );
    let again = skerry(&["snapshot", "restore", file_arg, "--data-dir", restored_arg]);
    assert!(
        !again.status.success(),
        "restore over an existing store must fail:\n{}",
        again.combined()
    );

    let server = Server::start(&restored_dir);
    let ctl = Etcdctl::new(&server);
    let restored = ctl.json(&["get", "", "--from-key"]);
    assert_eq!(int(&restored["header"]["revision"]), r0 + 5);
    assert_eq!(
        restored["kvs"], original["kvs"],
        "same keys, values and revisions"
    );
    assert_eq!(
        ctl.ok(&["get", "a", &rev_flag(r0 + 1)]),
        "a\n1\n",
        "history survives a snapshot"
    );
    ctl.ok(&["put", "d", "5"]);
    assert_eq!(ctl.revision(), r0 + 6);

    // A damaged snapshot does not verify.
    let mut bytes = std::fs::read(&file).expect("read the snapshot");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    let damaged = dir.path().join("damaged.db");
    std::fs::write(&damaged, &bytes).expect("write the damaged copy");
    let verify = skerry(&[
        "snapshot",
        "verify",
        damaged.to_str().expect("temp paths are UTF-8"),
    ]);
    assert!(
        !verify.status.success(),
        "a damaged snapshot verified:\n{}",
        verify.combined()
    );
}

/// Runs a `skerry` subcommand to completion.
fn skerry(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(args)
        .output()
        .expect("run skerry");
    Output {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn maintenance() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);
    ctl.ok(&["put", "a", "1"]);

    let status = ctl.json(&["endpoint", "status"]);
    assert_eq!(status[0]["Endpoint"], Value::String(server.endpoint()));
    let status = &status[0]["Status"];
    assert_eq!(status["version"], Value::String("3.4.23".into()));
    let member_id = status["header"]["member_id"].as_u64().expect("a member id");
    assert_ne!(member_id, 0);
    assert_eq!(
        status["leader"].as_u64(),
        Some(member_id),
        "a single member leads"
    );
    assert!(int(&status["dbSize"]) > 0, "{status}");
    let raft_index = int(&status["raftIndex"]);
    ctl.ok(&["put", "a", "2"]);
    let status = ctl.json(&["endpoint", "status"]);
    assert!(
        int(&status[0]["Status"]["raftIndex"]) > raft_index,
        "raft index did not grow: {status}"
    );

    let health = ctl.json(&["endpoint", "health"]);
    assert_eq!(health[0]["health"], Value::Bool(true), "{health}");
    let health = ctl.run(&["endpoint", "health"]);
    assert!(health.status.success(), "{}", health.combined());
    // etcdctl 3.4 prints this line on stderr.
    assert!(
        health.stderr.starts_with(&format!(
            "{} is healthy: successfully committed proposal",
            server.endpoint()
        )),
        "{}",
        health.combined()
    );

    let members = ctl.json(&["member", "list"]);
    let list = members["members"].as_array().expect("a member list");
    assert_eq!(list.len(), 1, "{members}");
    assert_eq!(list[0]["ID"].as_u64(), Some(member_id));
    assert_eq!(list[0]["name"], Value::String("default".into()));
    assert_eq!(list[0]["clientURLs"], serde_json::json!([server.url()]));
    let simple = ctl.ok(&["member", "list"]);
    assert!(
        simple.starts_with(&format!("{member_id:x}, started, default, ")),
        "{simple}"
    );
    assert!(
        simple.ends_with(&format!("{}, false\n", server.url())),
        "{simple}"
    );

    assert_eq!(
        ctl.ok(&["defrag"]),
        format!(
            "Finished defragmenting etcd member[{}]\n",
            server.endpoint()
        )
    );
    assert_eq!(ctl.ok(&["get", "a"]), "a\n2\n", "defrag keeps the data");

    // The hash covers the whole keyspace at the current revision: stable until a write.
    let hash = |ctl: &Etcdctl| {
        let hash = ctl.json(&["endpoint", "hashkv"]);
        assert_eq!(hash[0]["Endpoint"], Value::String(server.endpoint()));
        hash[0]["HashKV"]["hash"].as_u64().expect("a hash")
    };
    let before = hash(&ctl);
    assert_eq!(hash(&ctl), before);
    ctl.ok(&["put", "b", "1"]);
    assert_ne!(hash(&ctl), before);

    assert_eq!(ctl.ok(&["alarm", "list"]), "", "no alarms");
}

#[test]
fn request_errors() {
    let (server, _dir) = start();
    let ctl = Etcdctl::new(&server);
    let r0 = ctl.revision();

    ctl.fails(&["put", "", "v"], "etcdserver: key is not provided");
    ctl.fails(
        &["put", "missing", "--ignore-value"],
        "etcdserver: key not found",
    );
    assert_eq!(ctl.revision(), r0, "failed requests write nothing");

    // --ignore-value keeps the value and bumps the version.
    ctl.ok(&["put", "k", "v"]);
    assert_eq!(ctl.ok(&["put", "k", "--ignore-value"]), "OK\n");
    let kv = ctl.json(&["get", "k"]);
    assert_eq!(text(&kv["kvs"][0]["value"]), "v");
    assert_eq!(int(&kv["kvs"][0]["version"]), 2);

    // With the value argument left out, etcdctl reads the value from stdin. etcd refuses a
    // request over 1.5 MiB ("request is too large"), and takes one just under it.
    let revision = ctl.revision();
    let big = vec![b'a'; 1024 * 1024 * 3 / 2 + 1024];
    ctl.fails_with_stdin(&["put", "big"], &big, "etcdserver: request is too large");
    assert_eq!(ctl.revision(), revision);
    let large = vec![b'b'; 1024 * 1024];
    assert_eq!(ctl.ok_with_stdin(&["put", "large"], &large), "OK\n");
    assert_eq!(
        ctl.ok(&["get", "large", "--print-value-only"]).len(),
        large.len() + 1
    );
}

#[test]
fn restart_keeps_data() {
    let dir = temp_dir();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir);
    let ctl = Etcdctl::new(&server);
    let r0 = ctl.revision();
    for i in 0..20 {
        ctl.ok(&["put", &format!("key/{i:02}"), &format!("value {i}")]);
    }
    ctl.ok(&["del", "key/07"]);
    let lease = granted_lease(&ctl.ok(&["lease", "grant", "600"]), 600);
    ctl.ok(&["put", "leased", "v", &format!("--lease={lease}")]);
    ctl.ok(&["compact", &(r0 + 5).to_string()]);
    let before = ctl.json(&["get", "", "--from-key"]);
    assert_eq!(int(&before["header"]["revision"]), r0 + 22);

    // SIGKILL: no shutdown path runs, so only what was made durable before each reply counts.
    let status = server.kill();
    assert!(!status.success(), "skerry exited on its own: {status}");

    let server = Server::start(&data_dir);
    let ctl = Etcdctl::new(&server);
    let after = ctl.json(&["get", "", "--from-key"]);
    assert_eq!(int(&after["header"]["revision"]), r0 + 22);
    assert_eq!(after["kvs"], before["kvs"]);
    assert_eq!(int(&after["count"]), 20);
    assert_eq!(
        ctl.ok(&["get", "key/03", &rev_flag(r0 + 6)]),
        "key/03\nvalue 3\n",
        "history survives"
    );
    ctl.fails(
        &["get", "key/03", &rev_flag(r0 + 4)],
        "etcdserver: mvcc: required revision has been compacted",
    );
    assert_eq!(
        ctl.ok(&["lease", "list"]),
        format!("found 1 leases\n{lease}\n")
    );
    ctl.ok(&["put", "after", "restart"]);
    assert_eq!(ctl.revision(), r0 + 23);
    assert_eq!(
        ctl.ok(&["lease", "revoke", &lease]),
        format!("lease {lease} revoked\n")
    );
    assert_eq!(ctl.ok(&["get", "leased"]), "");
}

#[test]
fn http_scheme_endpoints() {
    let (server, _dir) = start();
    // etcdctl accepts endpoints with a scheme; the KV calls go over its balancer and work.
    let ctl = Etcdctl::with_endpoints(server.url());
    assert_eq!(ctl.ok(&["put", "s", "1"]), "OK\n");
    assert_eq!(ctl.ok(&["get", "s"]), "s\n1\n");
    let health = ctl.run(&["endpoint", "health"]);
    assert!(health.status.success(), "{}", health.combined());

    // The per-endpoint commands dial the URL itself, so grpc-go sends "http://127.0.0.1:PORT"
    // as the HTTP/2 :authority; h2 would refuse it, skerry's AuthorityFix rewrites it.
    let status = ctl.run(&["endpoint", "status", "-w", "json"]);
    assert!(status.status.success(), "{}", status.combined());
    let status: Value = serde_json::from_str(&status.stdout).expect("endpoint status JSON");
    assert_eq!(
        status[0]["Status"]["version"],
        Value::String("3.4.23".into())
    );
    for command in [&["endpoint", "hashkv"][..], &["defrag"][..]] {
        let out = ctl.run(command);
        assert!(out.status.success(), "{command:?}: {}", out.combined());
    }
}

/// The small quota the space tests use: 1 MiB.
const SMALL_QUOTA: &str = "1048576";

/// Writes `fill/0` .. `fill/9` over and over with 16 KiB values until the server refuses
/// with etcd's out-of-space error, recording each key's last acknowledged value in `last`;
/// returns how many writes were taken. History piles up (every overwrite is kept until
/// compaction), which is what a compaction then frees.
fn fill_until_refused(ctl: &Etcdctl, last: &mut [String]) -> usize {
    for round in 0..2_000 {
        let key = round % 10;
        let value = format!("{round:05}-{}", "v".repeat(16 * 1024));
        let out = ctl.run(&["put", &format!("fill/{key}"), &value]);
        if out.status.success() {
            last[key] = value;
            continue;
        }
        assert!(
            out.stderr
                .contains("Error: etcdserver: mvcc: database space exceeded"),
            "{}",
            out.combined()
        );
        assert!(
            out.stderr.contains("code = ResourceExhausted"),
            "{}",
            out.combined()
        );
        return round;
    }
    panic!("2,000 writes of 16 KiB fit in a 1 MiB quota");
}

/// Every `fill/N` key holds its last acknowledged value.
fn assert_fill_kept(ctl: &Etcdctl, last: &[String]) {
    for (key, value) in last.iter().enumerate() {
        assert_eq!(
            ctl.ok(&["get", &format!("fill/{key}"), "--print-value-only"]),
            format!("{value}\n"),
            "fill/{key}"
        );
    }
}

#[test]
fn past_the_space_quota_writes_stop_until_compact_defrag_and_disarm() {
    let dir = temp_dir();
    let data_dir = dir.path().join("data");
    let quota = ["--quota-backend-bytes", SMALL_QUOTA];
    let server = Server::start_with_args(&data_dir, &quota);
    let ctl = Etcdctl::new(&server);
    let member = ctl.json(&["endpoint", "status"])[0]["Status"]["header"]["member_id"]
        .as_u64()
        .expect("a member id");
    let alarm = format!("memberID:{member} alarm:NOSPACE ");
    ctl.ok(&["put", "scratch", "1"]);
    assert_eq!(ctl.ok(&["alarm", "list"]), "");

    let mut last = vec![String::new(); 10];
    let taken = fill_until_refused(&ctl, &mut last);
    assert!(taken > 10, "refused after {taken} writes");
    // The alarm is raised: every write that costs something is refused, with etcd's texts.
    ctl.fails(
        &["put", "x", "y"],
        "Error: etcdserver: mvcc: database space exceeded",
    );
    ctl.fails(
        &["lease", "grant", "10"],
        "Error: failed to grant lease (etcdserver: mvcc: database space exceeded)",
    );
    ctl.fails_with_stdin(
        &["txn"],
        b"\nput x y\n\n\n",
        "Error: etcdserver: mvcc: database space exceeded",
    );
    // The alarm, as etcdctl lists it and as `endpoint status` reports it.
    assert_eq!(ctl.ok(&["alarm", "list"]), format!("{alarm}\n"));
    assert_eq!(
        ctl.json(&["alarm", "list"]),
        serde_json::json!({"alarms": [{"memberID": member, "alarm": 1}]})
    );
    let status = ctl.json(&["endpoint", "status"]);
    assert_eq!(
        status[0]["Status"]["errors"],
        serde_json::json!([alarm]),
        "{status}"
    );
    // Reads, read-only txns and deletes go on.
    assert_fill_kept(&ctl, &last);
    assert_eq!(
        ctl.ok_with_stdin(&["txn"], b"\nget scratch\n\n\n"),
        "SUCCESS\n\nscratch\n1\n"
    );
    assert_eq!(ctl.ok(&["del", "scratch"]), "1\n");

    // A member that restarts keeps the alarm.
    assert!(!server.kill().success());
    let server = Server::start_with_args(&data_dir, &quota);
    let ctl = Etcdctl::new(&server);
    assert_eq!(ctl.ok(&["alarm", "list"]), format!("{alarm}\n"));
    ctl.fails(
        &["put", "x", "y"],
        "etcdserver: mvcc: database space exceeded",
    );
    assert_fill_kept(&ctl, &last);

    // Disarmed without freeing anything: writes soon pass the quota again, and raise it.
    assert_eq!(ctl.ok(&["alarm", "disarm"]), format!("{alarm}\n"));
    assert_eq!(ctl.ok(&["alarm", "list"]), "");
    fill_until_refused(&ctl, &mut last);
    assert_eq!(ctl.ok(&["alarm", "list"]), format!("{alarm}\n"));

    // Compaction frees the overwritten history, defragmentation gives the space back, and
    // once disarmed the store takes writes again, having lost nothing.
    let revision = ctl.revision();
    assert_eq!(
        ctl.ok(&["compact", &revision.to_string(), "--physical"]),
        format!("compacted revision {revision}\n")
    );
    assert_eq!(
        ctl.ok(&["defrag"]),
        format!(
            "Finished defragmenting etcd member[{}]\n",
            server.endpoint()
        )
    );
    let size = int(&ctl.json(&["endpoint", "status"])[0]["Status"]["dbSize"]);
    assert!(size < 1024 * 1024, "{size} bytes after defrag");
    ctl.fails(
        &["put", "x", "y"],
        "etcdserver: mvcc: database space exceeded",
    );
    assert_eq!(ctl.ok(&["alarm", "disarm"]), format!("{alarm}\n"));
    assert_eq!(ctl.ok(&["alarm", "disarm"]), "", "nothing left to disarm");
    assert_eq!(ctl.ok(&["alarm", "list"]), "");
    assert_eq!(ctl.ok(&["put", "x", "y"]), "OK\n");
    granted_lease(&ctl.ok(&["lease", "grant", "10"]), 10);
    assert_fill_kept(&ctl, &last);
    let status = ctl.json(&["endpoint", "status"]);
    assert_eq!(status[0]["Status"].get("errors"), None, "{status}");
}
