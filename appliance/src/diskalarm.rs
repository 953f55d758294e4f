//! The slow-disk alarm as the box's owner sees it: a `Warning` Event `SlowDiskSync` on this
//! box's Node, which `kubectl describe node` and `kubectl get events` show.
//!
//! The store counts every log `fdatasync` of [`SLOW_SYNC_WARN`] or more
//! (`skerry_disk_wal_slow_fsyncs_total`, a warning in the log) and keeps the longest since the
//! alarm last looked (`skerry_store::metrics::take_slowest_sync`). Every [`ALARM_INTERVAL`]
//! this task takes it and, when a sync was slow, records one Event naming the longest sync,
//! the threshold and the slow syncs so far. The log is the single store's write-ahead log or
//! a member's Raft log: both sync through `Wal::append`, so the alarm runs in both modes.
//!
//! The trick: one Event per interval, not per sync, through the shared [`EventRecorder`],
//! whose correlator is client-go's. A disk that stays slow sends one Event every ten seconds
//! with a new message each (the figures change); the correlator writes nine of them as they
//! are, folds the tenth and every later one within ten minutes of the last into one
//! `(combined from similar events): ...` Event whose `count` and message are patched, and
//! the spam filter thins the writes past its burst, so a box with a bad SD card carries
//! [`skerry_client::events::AGGREGATE_EVENTS_MAX`] such Events, never thousands.
//!
//! The writer is the node's own identity (`system:node:<name>` in `system:nodes`), whose
//! Node authorizer rules (`bootstrappolicy.NodeRules()`) allow creating and patching events;
//! a Node is cluster-scoped, so its Events go to `default`, as the kubelet's do. A member with
//! `--disable-agent` still has a disk and a name: the Event refers to the Node it would
//! register, and `kubectl get events` shows it.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use skerry_client::Client;
// A Raft leader whose log sync stalls this long hands leadership to another member.
use skerry_client::events::{EVENT_TYPE_WARNING, EventRecorder, RecorderOptions};
use skerry_raft::core::LEADER_DISK_STALL_MAX as LEADER_DISK_STALL;
use skerry_store::metrics::SLOW_SYNC_WARN;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tracing::info;

/// How often the alarm looks at the slowest sync: the kubelet's `nodeStatusUpdateFrequency`
/// (10 s, `pkg/kubelet/apis/config/v1beta1/defaults.go`), the pace the Node's own status is
/// refreshed at. At most one Event per interval keeps a disk that stays slow to six writes a
/// minute before the recorder's spam filter thins them: every Event is itself a write that
/// waits on the slow disk.
pub const ALARM_INTERVAL: Duration = Duration::from_secs(10);

/// The Event's reason (UpperCamelCase, as the kubelet's `FreeDiskSpaceFailed`).
pub const REASON_SLOW_DISK_SYNC: &str = "SlowDiskSync";

/// The Event's `source.component`: the store, whose log the slow disk holds up. Not
/// `kubelet` (the node agent may be off, and the spam filter counts per source and object,
/// so a slow disk's Events never use up the kubelet's budget for `NodeNotReady` and
/// `NodeHasDiskPressure`), nor `etcd`, which records no Kubernetes Events upstream.
pub const EVENT_COMPONENT: &str = "skerry-store";

/// Which log the member syncs: the message says what the slowness costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Log {
    /// A single store's write-ahead log (no `--initial-cluster`).
    Single,
    /// A cluster member's Raft log.
    Raft,
}

/// What the alarm records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alarm {
    pub type_: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The Event for what `take_slowest_sync` returned: `(slow syncs so far, longest since the
/// last look)`, `None` when no sync was slow since, which records nothing.
pub fn alarm(slowest: Option<(u64, Duration)>, log: Log) -> Option<Alarm> {
    let (slow_so_far, longest) = slowest?;
    let took_ms = longest.as_millis();
    let alarm_ms = SLOW_SYNC_WARN.as_millis();
    let message = match log {
        Log::Raft => format!(
            "the raft log's fdatasync took {took_ms} ms (alarm at {alarm_ms} ms, {slow_so_far} \
             slow so far): writes through this member wait on its disk; a stall over {} s \
             hands leadership to another box",
            LEADER_DISK_STALL.as_secs()
        ),
        Log::Single => format!(
            "the write-ahead log's fdatasync took {took_ms} ms (alarm at {alarm_ms} ms, \
             {slow_so_far} slow so far): every write to the cluster waits on this disk"
        ),
    };
    Some(Alarm {
        type_: EVENT_TYPE_WARNING,
        reason: REASON_SLOW_DISK_SYNC,
        message,
    })
}

/// This box's Node as an Event's involvedObject: the kubelet's `nodeRef`, whose UID is the
/// node's name (the Node may not exist yet, or ever with `--disable-agent`).
pub fn node_reference(node_name: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node_name.to_string()),
        uid: Some(node_name.to_string()),
        ..ObjectReference::default()
    }
}

/// Starts the alarm on the current runtime: Events about `node_name`, written with
/// `client` (the node's identity), until `stop` turns true.
pub fn start(client: Client, node_name: &str, log: Log, stop: watch::Receiver<bool>) {
    let mut options = RecorderOptions::new(EVENT_COMPONENT);
    options.host = Some(node_name.to_string());
    let (recorder, writer) = EventRecorder::with_options(client, options);
    tokio::spawn(writer.run());
    info!(
        node = node_name,
        threshold_ms = SLOW_SYNC_WARN.as_millis() as u64,
        "slow-disk alarm on"
    );
    tokio::spawn(run(recorder, node_reference(node_name), log, stop));
}

/// Every [`ALARM_INTERVAL`], the slowest sync since the last look, as an Event on `node`.
async fn run(
    recorder: EventRecorder,
    node: ObjectReference,
    log: Log,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(ALARM_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        if let Some(a) = alarm(skerry_store::metrics::take_slowest_sync(), log) {
            recorder.event(&node, a.type_, a.reason, &a.message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_slow_sync_records_nothing() {
        assert_eq!(alarm(None, Log::Raft), None);
        assert_eq!(alarm(None, Log::Single), None);
    }

    #[test]
    fn a_slow_sync_is_a_warning_naming_the_sync_the_threshold_and_the_count() {
        let a = alarm(Some((7, Duration::from_micros(512_400))), Log::Raft).expect("an alarm");
        assert_eq!(a.type_, "Warning");
        assert_eq!(a.reason, "SlowDiskSync");
        assert_eq!(
            a.message,
            "the raft log's fdatasync took 512 ms (alarm at 100 ms, 7 slow so far): writes \
             through this member wait on its disk; a stall over 1 s hands leadership to \
             another box"
        );
        let a = alarm(Some((1, Duration::from_millis(100))), Log::Single).expect("an alarm");
        assert_eq!(a.type_, "Warning");
        assert_eq!(a.reason, "SlowDiskSync");
        assert_eq!(
            a.message,
            "the write-ahead log's fdatasync took 100 ms (alarm at 100 ms, 1 slow so far): \
             every write to the cluster waits on this disk"
        );
    }

    #[test]
    fn the_involved_object_is_the_node_as_the_kubelet_names_it() {
        let r = node_reference("box-a");
        assert_eq!(r.kind.as_deref(), Some("Node"));
        assert_eq!(r.name.as_deref(), Some("box-a"));
        assert_eq!(r.uid.as_deref(), Some("box-a"));
        assert_eq!(r.namespace, None);
    }
}
