//! The end of a run, read with faults healed and clients stopped: the final state, a
//! linearizable range over the key prefix, and the revision it was read at.
//!
//! The committed history is not read here: a compaction during the run would have removed its
//! start by now. The history readers (`reader`) record it while the run goes.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use skerry_store::pb::etcdserverpb::RangeRequest;
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use tokio::time::{Instant, sleep, timeout};

use super::client::{KeySpace, lazy_channel};
use crate::check::{FinalState, Versioned};

/// How long the final read may keep retrying across members. The cluster was just found
/// healthy, so one attempt normally does; the margin covers an election right after.
const FINAL_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on one attempt of the final read.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause between attempts.
const RETRY_INTERVAL: Duration = Duration::from_millis(200);

/// The final state of every key under the prefix and the revision it was read at.
pub async fn final_state(endpoints: &[String], keys: &KeySpace) -> Result<(FinalState, i64)> {
    let (start, end) = keys.range();
    let deadline = Instant::now() + FINAL_READ_TIMEOUT;
    let mut attempt = 0usize;
    loop {
        let endpoint = &endpoints[attempt % endpoints.len()];
        attempt += 1;
        let read = async {
            let request = RangeRequest {
                key: start.clone().into(),
                range_end: end.clone().into(),
                ..Default::default()
            };
            let response = KvClient::new(lazy_channel(endpoint)?)
                .range(request)
                .await
                .context("range")?
                .into_inner();
            let revision = response.header.context("no header")?.revision;
            let state: FinalState = response
                .kvs
                .iter()
                .map(|kv| {
                    let versioned = Versioned {
                        value: kv.value.to_vec(),
                        mod_revision: kv.mod_revision,
                    };
                    (kv.key.to_vec(), versioned)
                })
                .collect();
            anyhow::Ok((state, revision))
        };
        match timeout(ATTEMPT_TIMEOUT, read).await {
            Ok(Ok(read)) => return Ok(read),
            Ok(Err(e)) if Instant::now() > deadline => return Err(e),
            Err(_) if Instant::now() > deadline => bail!("final read timed out"),
            _ => sleep(RETRY_INTERVAL).await,
        }
    }
}
