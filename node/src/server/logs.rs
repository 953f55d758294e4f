//! A container's log as `kubectl logs` reads it: the CRI log files the runtime writes for the
//! kubelet (`<time> <stream> <P|F> <message>` per line, upstream
//! `pkg/kubelet/kuberuntime/logs/logs.go`, `ReadLogs` and `parseCRILog`), decoded and
//! filtered by the `PodLogOptions` the kubelet takes in its query (`tailLines`, `limitBytes`,
//! `sinceSeconds` / `sinceTime`, `timestamps`, `follow`).
//!
//! The trick it carries: partial lines (`P`, what the runtime writes when a line is longer
//! than its buffer) are joined here into the one line the container wrote, under the first
//! part's timestamp, so `--timestamps` prints one time per line; and `follow` keeps reading
//! at end of file, reopening the path when it names a new file (a rotation) and moving on to
//! the next instance's file when the container was restarted, ending once the container is
//! no longer running and its file is drained.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use jiff::Timestamp;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tokio::sync::mpsc;

/// How long a follower sleeps at end of file before it reads again. Upstream waits on
/// fsnotify; a poll this short keeps `kubectl logs -f` interactive at the cost of one
/// `read(2)` and one `stat(2)` per follower per tick.
pub const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// How often a follower asks whether its container still runs (upstream `logs.go`,
/// `stateCheckPeriod`, 5 s; shorter here so a follow ends soon after the container does).
pub const STATE_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// The bytes read from the file at a time.
const READ_CHUNK: usize = 32 * 1024;

/// The longest file line kept whole: beyond it the line is cut and handed on as it is.
/// containerd splits a container's line into `P` parts of 16 KiB
/// (`pkg/cri/config` `MaxContainerLogLineSize`), so a real file line is far shorter; the cap
/// bounds what a corrupt file without newlines can make the kubelet hold.
const MAX_FILE_LINE: usize = 1024 * 1024;

/// The longest joined line (a container line made of `P` parts): beyond it the joined line
/// is handed on and a new one started, so a container that never ends its line cannot make
/// the kubelet hold more than this per reader.
const MAX_JOINED_LINE: usize = 4 * 1024 * 1024;

/// How far back `tailLines` scans at a time.
const TAIL_BLOCK: u64 = 64 * 1024;

/// The log options of one request (upstream `v1.PodLogOptions` as the kubelet converts
/// them, `ContainerLogOptions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep reading as the container writes.
    pub follow: bool,
    /// The last lines only.
    pub tail_lines: Option<u64>,
    /// At most this many bytes.
    pub limit_bytes: Option<u64>,
    /// Lines from this time on.
    pub since: Option<Timestamp>,
    /// Prefix each line with its time (RFC 3339 with nanoseconds).
    pub timestamps: bool,
    /// The previous instance of the container.
    pub previous: bool,
}

impl LogOptions {
    /// The options of a query, validated as upstream `ValidatePodLogOptions`; `now` turns
    /// `sinceSeconds` into a time. The error is the message of a 400.
    pub fn from_query(query: &HashMap<String, String>, now: Timestamp) -> Result<Self, String> {
        let flag = |name: &str| -> Result<bool, String> {
            match query.get(name).map(String::as_str) {
                None | Some("") => Ok(false),
                Some(v) => match v.to_ascii_lowercase().as_str() {
                    "1" | "t" | "true" => Ok(true),
                    "0" | "f" | "false" => Ok(false),
                    _ => Err(format!("{name}: invalid boolean value {v:?}")),
                },
            }
        };
        let int = |name: &str| -> Result<Option<i64>, String> {
            query
                .get(name)
                .map(|v| {
                    v.parse::<i64>()
                        .map_err(|_| format!("{name}: invalid integer value {v:?}"))
                })
                .transpose()
        };
        let tail = int("tailLines")?;
        if tail.is_some_and(|t| t < 0) {
            return Err("tailLines: Invalid value: must be greater than or equal to 0".into());
        }
        let limit = int("limitBytes")?;
        if limit.is_some_and(|l| l < 1) {
            return Err("limitBytes: Invalid value: must be greater than 0".into());
        }
        let since_seconds = int("sinceSeconds")?;
        let since_time = query
            .get("sinceTime")
            .map(|v| {
                v.parse::<Timestamp>()
                    .map_err(|_| format!("sinceTime: invalid RFC 3339 time {v:?}"))
            })
            .transpose()?;
        let since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err("at most one of `sinceTime` or `sinceSeconds` may be specified".into());
            }
            (Some(s), None) if s < 1 => {
                return Err("sinceSeconds: Invalid value: must be greater than 0".into());
            }
            (Some(s), None) => Some(
                now.checked_sub(jiff::SignedDuration::from_secs(s))
                    .unwrap_or(Timestamp::MIN),
            ),
            (None, t) => t,
        };
        Ok(LogOptions {
            follow: flag("follow")?,
            tail_lines: tail.map(|t| u64::try_from(t).unwrap_or(0)),
            limit_bytes: limit.map(|l| u64::try_from(l).unwrap_or(1)),
            since,
            timestamps: flag("timestamps")?,
            previous: flag("previous")?,
        })
    }
}

/// One line of a CRI log file.
#[derive(Debug, PartialEq, Eq)]
pub struct CriLine<'a> {
    /// The time as the runtime wrote it (RFC 3339 with nanoseconds).
    pub time: &'a str,
    /// `stdout` or `stderr`.
    pub stream: &'a str,
    /// A `P` part of a longer line.
    pub partial: bool,
    /// The message, without the file's newline.
    pub message: &'a [u8],
}

/// Parses one file line (without its newline), or `None` when it is not CRI format
/// (skipped, as upstream does).
pub fn parse_cri_line(line: &[u8]) -> Option<CriLine<'_>> {
    let mut fields = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(fields.next()?).ok()?;
    let stream = std::str::from_utf8(fields.next()?).ok()?;
    if stream != "stdout" && stream != "stderr" {
        return None;
    }
    // The tag field may carry more tags after `:`; the first says partial or full.
    let tag = fields.next()?;
    let partial = match tag.split(|b| *b == b':').next() {
        Some(b"P") => true,
        Some(b"F") => false,
        _ => return None,
    };
    let message = fields.next().unwrap_or(b"");
    Some(CriLine {
        time,
        stream,
        partial,
        message,
    })
}

/// Turns file lines into the lines a reader gets: partial parts joined, `since` applied,
/// timestamps prefixed, `limitBytes` counted down.
struct Decoder {
    options: LogOptions,
    /// The joined parts so far and the first part's time.
    joined: Vec<u8>,
    joined_time: Option<(String, Option<Timestamp>)>,
    /// Bytes still allowed (`limitBytes`).
    left: Option<u64>,
}

impl Decoder {
    fn new(options: LogOptions) -> Self {
        Decoder {
            left: options.limit_bytes,
            options,
            joined: Vec::new(),
            joined_time: None,
        }
    }

    fn done(&self) -> bool {
        self.left == Some(0)
    }

    /// Decodes one file line; returns what to send, if anything.
    fn line(&mut self, raw: &[u8]) -> Option<Bytes> {
        let line = parse_cri_line(raw)?;
        if self.joined_time.is_none() {
            self.joined_time = Some((line.time.to_string(), line.time.parse().ok()));
        }
        self.joined.extend_from_slice(line.message);
        if line.partial && self.joined.len() < MAX_JOINED_LINE {
            return None;
        }
        let (time, parsed) = self.joined_time.take().expect("set above");
        let message = std::mem::take(&mut self.joined);
        if let (Some(since), Some(at)) = (self.options.since, parsed)
            && at < since
        {
            return None;
        }
        let mut out = Vec::with_capacity(message.len() + time.len() + 2);
        if self.options.timestamps {
            out.extend_from_slice(time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&message);
        if !line.partial {
            out.push(b'\n');
        }
        if let Some(left) = &mut self.left {
            let take = usize::try_from(*left).unwrap_or(usize::MAX).min(out.len());
            out.truncate(take);
            *left -= take as u64;
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }
}

/// The byte offset where the last `lines` lines of the file begin (a final line without a
/// newline counts as a line), as upstream `tail.FindTailLineStartIndex`.
pub async fn tail_start(file: &mut tokio::fs::File, lines: u64) -> std::io::Result<u64> {
    let len = file.metadata().await?.len();
    if lines == 0 {
        return Ok(len);
    }
    let mut end = len;
    let mut seen = 0u64;
    let mut block = vec![0u8; TAIL_BLOCK as usize];
    while end > 0 {
        let start = end.saturating_sub(TAIL_BLOCK);
        let n = usize::try_from(end - start).expect("a block fits in memory");
        file.seek(std::io::SeekFrom::Start(start)).await?;
        file.read_exact(&mut block[..n]).await?;
        for i in (0..n).rev() {
            let at = start + i as u64;
            // The newline ending the file ends its last line; it starts no line after it.
            if block[i] == b'\n' && at + 1 != len {
                seen += 1;
                if seen == lines {
                    return Ok(at + 1);
                }
            }
        }
        end = start;
    }
    Ok(0)
}

/// What a follower does when its file is drained.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The container still runs: keep waiting on this file.
    Wait,
    /// The container was restarted: go on with the new instance's file.
    Switch(PathBuf),
    /// The container no longer runs: end.
    End,
}

/// Streams the log file at `path` into `tx` under `options`. `next` is asked (every
/// [`STATE_CHECK_PERIOD`] while following at end of file) whether the container still runs.
/// Returns when the log is read (or the receiver is gone).
pub async fn stream<F, Fut>(path: PathBuf, options: LogOptions, tx: mpsc::Sender<Bytes>, next: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Next>,
{
    if let Err(e) = stream_inner(path, options, &tx, next).await {
        let _ = tx
            .send(Bytes::from(format!("failed to read the log: {e}\n")))
            .await;
    }
}

async fn stream_inner<F, Fut>(
    mut path: PathBuf,
    options: LogOptions,
    tx: &mpsc::Sender<Bytes>,
    next: F,
) -> std::io::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Next>,
{
    let follow = options.follow;
    let mut decoder = Decoder::new(options.clone());
    let mut file = tokio::fs::File::open(&path).await?;
    if let Some(lines) = options.tail_lines {
        let start = tail_start(&mut file, lines).await?;
        file.seek(std::io::SeekFrom::Start(start)).await?;
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut last_check = tokio::time::Instant::now();
    loop {
        if decoder.done() {
            return Ok(());
        }
        let n = file.read(&mut chunk).await?;
        if n > 0 {
            pending.extend_from_slice(&chunk[..n]);
            let mut from = 0;
            while let Some(i) = pending[from..].iter().position(|b| *b == b'\n') {
                let line = &pending[from..from + i];
                from += i + 1;
                if let Some(out) = decoder.line(line)
                    && tx.send(out).await.is_err()
                {
                    return Ok(());
                }
                if decoder.done() {
                    return Ok(());
                }
            }
            pending.drain(..from);
            if pending.len() > MAX_FILE_LINE {
                let line = std::mem::take(&mut pending);
                if let Some(out) = decoder.line(&line)
                    && tx.send(out).await.is_err()
                {
                    return Ok(());
                }
            }
            continue;
        }
        // End of file.
        if !follow {
            if !pending.is_empty()
                && let Some(out) = decoder.line(&pending)
            {
                let _ = tx.send(out).await;
            }
            return Ok(());
        }
        // A rotation: the path now names another file; this one is drained, so go on there.
        if rotated(&path, &file).await {
            file = tokio::fs::File::open(&path).await?;
            pending.clear();
            continue;
        }
        if last_check.elapsed() >= STATE_CHECK_PERIOD {
            last_check = tokio::time::Instant::now();
            match next().await {
                Next::Wait => {}
                Next::Switch(new) => {
                    // Drain what was written before the switch was seen, then move on.
                    let n = file.read(&mut chunk).await?;
                    if n > 0 {
                        pending.extend_from_slice(&chunk[..n]);
                        continue;
                    }
                    path = new;
                    file = tokio::fs::File::open(&path).await?;
                    pending.clear();
                    continue;
                }
                Next::End => {
                    let n = file.read(&mut chunk).await?;
                    if n > 0 {
                        pending.extend_from_slice(&chunk[..n]);
                        continue;
                    }
                    return Ok(());
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(FOLLOW_POLL) => {}
            () = tx.closed() => return Ok(()),
        }
    }
}

/// Whether `path` now names another file than `open` (or none yet: a rotation in progress
/// is not a rotation until the new file exists).
async fn rotated(path: &Path, open: &tokio::fs::File) -> bool {
    let (Ok(now), Ok(open)) = (tokio::fs::metadata(path).await, open.metadata().await) else {
        return false;
    };
    (now.dev(), now.ino()) != (open.dev(), open.ino())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn cri_lines_parse_and_bad_ones_are_skipped() {
        let l = parse_cri_line(b"2016-10-06T00:17:09.669794202Z stdout F hello world").unwrap();
        assert_eq!(l.time, "2016-10-06T00:17:09.669794202Z");
        assert_eq!(l.stream, "stdout");
        assert!(!l.partial);
        assert_eq!(l.message, b"hello world");
        let l = parse_cri_line(b"2016-10-06T00:17:09Z stderr P part").unwrap();
        assert!(l.partial);
        assert_eq!(
            parse_cri_line(b"2016-10-06T00:17:09Z stdout F")
                .unwrap()
                .message,
            b""
        );
        assert!(parse_cri_line(b"not a log line").is_none());
        assert!(parse_cri_line(b"2016-10-06T00:17:09Z stdin F x").is_none());
    }

    #[test]
    fn partial_lines_are_joined_under_the_first_time() {
        let mut options = LogOptions {
            timestamps: true,
            ..LogOptions::default()
        };
        let mut d = Decoder::new(options.clone());
        assert_eq!(d.line(b"2024-01-01T00:00:01Z stdout P abc"), None);
        assert_eq!(
            d.line(b"2024-01-01T00:00:02Z stdout F def").unwrap(),
            "2024-01-01T00:00:01Z abcdef\n"
        );
        options.timestamps = false;
        options.since = Some("2024-01-01T00:00:02Z".parse().unwrap());
        let mut d = Decoder::new(options);
        assert_eq!(d.line(b"2024-01-01T00:00:01Z stdout F old"), None);
        assert_eq!(
            d.line(b"2024-01-01T00:00:02Z stderr F new").unwrap(),
            "new\n"
        );
    }

    #[test]
    fn limit_bytes_cuts_the_output() {
        let mut d = Decoder::new(LogOptions {
            limit_bytes: Some(5),
            ..LogOptions::default()
        });
        assert_eq!(
            d.line(b"2024-01-01T00:00:01Z stdout F abc").unwrap(),
            "abc\n"
        );
        assert_eq!(d.line(b"2024-01-01T00:00:01Z stdout F xyz").unwrap(), "x");
        assert!(d.done());
    }

    #[test]
    fn options_are_validated_as_upstream() {
        let now: Timestamp = "2024-01-01T00:01:00Z".parse().unwrap();
        let o = LogOptions::from_query(
            &q(&[
                ("follow", "true"),
                ("tailLines", "3"),
                ("timestamps", "1"),
                ("sinceSeconds", "60"),
            ]),
            now,
        )
        .unwrap();
        assert!(o.follow && o.timestamps && !o.previous);
        assert_eq!(o.tail_lines, Some(3));
        assert_eq!(o.since, Some("2024-01-01T00:00:00Z".parse().unwrap()));
        for (query, error) in [
            (
                q(&[("tailLines", "-1")]),
                "tailLines: Invalid value: must be greater than or equal to 0",
            ),
            (
                q(&[("limitBytes", "0")]),
                "limitBytes: Invalid value: must be greater than 0",
            ),
            (
                q(&[("sinceSeconds", "0")]),
                "sinceSeconds: Invalid value: must be greater than 0",
            ),
            (
                q(&[("sinceSeconds", "1"), ("sinceTime", "2024-01-01T00:00:00Z")]),
                "at most one of `sinceTime` or `sinceSeconds` may be specified",
            ),
        ] {
            assert_eq!(LogOptions::from_query(&query, now).unwrap_err(), error);
        }
    }

    async fn read_all(path: PathBuf, options: LogOptions) -> String {
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(stream(path, options, tx, || async { Next::End }));
        let mut out = Vec::new();
        while let Some(b) = rx.recv().await {
            out.extend_from_slice(&b);
        }
        task.await.unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn tail_lines_count_file_lines_from_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let text: String = (1..=5)
            .map(|i| format!("2024-01-01T00:00:0{i}Z stdout F line {i}\n"))
            .collect();
        std::fs::write(&path, text).unwrap();
        let tail = |n| LogOptions {
            tail_lines: Some(n),
            ..LogOptions::default()
        };
        assert_eq!(read_all(path.clone(), tail(2)).await, "line 4\nline 5\n");
        assert_eq!(read_all(path.clone(), tail(0)).await, "");
        assert_eq!(read_all(path.clone(), tail(9)).await.lines().count(), 5);
    }

    #[tokio::test]
    async fn follow_reads_what_is_written_later_and_across_a_rotation() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2024-01-01T00:00:01Z stdout F one\n").unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ended.clone();
        let options = LogOptions {
            follow: true,
            ..LogOptions::default()
        };
        let task = tokio::spawn(stream(path.clone(), options, tx, move || {
            let end = flag.load(std::sync::atomic::Ordering::SeqCst);
            async move { if end { Next::End } else { Next::Wait } }
        }));
        assert_eq!(rx.recv().await.unwrap(), "one\n");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"2024-01-01T00:00:02Z stdout P tw").unwrap();
        f.write_all(b"\n2024-01-01T00:00:02Z stdout F o\n").unwrap();
        assert_eq!(rx.recv().await.unwrap(), "two\n");
        // Rotated: renamed away, a new file at the path.
        std::fs::rename(&path, dir.path().join("0.log.1")).unwrap();
        std::fs::write(&path, "2024-01-01T00:00:03Z stdout F three\n").unwrap();
        assert_eq!(rx.recv().await.unwrap(), "three\n");
        ended.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(rx.recv().await, None, "the follow ends with the container");
        task.await.unwrap();
    }
}
