//! The compactor, elected by a CAS on a magic key (`docs/tricks.md` #13).
//!
//! Every apiserver of the cluster runs this loop. Each round it tries one transaction: "if
//! the version of [`COMPACT_REV_KEY`] is still the one I saw last round, write the revision I
//! saw last round into it". The key's version is the cluster's logical clock: exactly one
//! apiserver's transaction succeeds per tick of it, and that one compacts the store to the
//! revision seen one interval ago — so history is kept for at least one interval and
//! compaction happens about once per interval however many apiservers run. The losers learn
//! the new version from the failed transaction and try again next round. No lease, no
//! leader election, no wall clock shared between machines: if clocks drift, rounds just
//! happen a little more or less often, and nothing else changes.

use std::time::Duration;

use bytes::Bytes;
use skerry_store::Store;
use skerry_store::pb::etcdserverpb::{
    Compare, PutRequest, RangeRequest, RequestOp, TxnRequest,
    compare::{CompareResult, CompareTarget, TargetUnion},
    request_op, response_op,
};

/// The magic key whose version orders the compactors (Kubernetes' `compact_rev_key`, at the
/// store's root, outside `/registry/`, so no watch cache sees it).
pub const COMPACT_REV_KEY: &str = "compact_rev_key";

/// Time between rounds (kube-apiserver's `--etcd-compaction-interval` default, 5 minutes):
/// history younger than one interval is always kept, which is how long a watcher may lag or
/// a paged LIST may take before it sees 410 Gone. Shorter keeps the store smaller and makes
/// clients relist more; longer the reverse.
pub const COMPACTION_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// One apiserver's view between rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactorState {
    /// The version of [`COMPACT_REV_KEY`] this compactor expects (its logical time).
    pub time: i64,
    /// The store revision seen at the last round: the next compaction target.
    pub revision: i64,
}

/// What one round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// This compactor won the CAS and compacted to this revision.
    Compacted(i64),
    /// This compactor won the CAS on its first round: nothing to compact yet (Kubernetes does
    /// not compact on bootstrap).
    WonWithoutTarget,
    /// Another compactor won this tick.
    Lost,
}

/// Runs one round: the CAS, and the compaction if won.
pub async fn round(
    store: &Store,
    state: CompactorState,
) -> Result<(CompactorState, Round), skerry_store::StoreError> {
    let key = Bytes::from_static(COMPACT_REV_KEY.as_bytes());
    let resp = store
        .txn(TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Version as i32,
                key: key.clone(),
                target_union: Some(TargetUnion::Version(state.time)),
                range_end: Bytes::new(),
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.clone(),
                    value: Bytes::from(state.revision.to_string()),
                    ..Default::default()
                })),
            }],
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestRange(RangeRequest {
                    key,
                    ..Default::default()
                })),
            }],
        })
        .await?;
    let current_revision = resp.header.as_ref().map_or(0, |h| h.revision);
    if !resp.succeeded {
        // Someone else moved the clock: adopt their time, try again next round.
        let time = resp
            .responses
            .first()
            .and_then(|r| match &r.response {
                Some(response_op::Response::ResponseRange(range)) => {
                    range.kvs.first().map(|kv| kv.version)
                }
                _ => None,
            })
            .unwrap_or(0);
        return Ok((
            CompactorState {
                time,
                revision: current_revision,
            },
            Round::Lost,
        ));
    }
    let next = CompactorState {
        time: state.time + 1,
        revision: current_revision,
    };
    if state.revision == 0 {
        return Ok((next, Round::WonWithoutTarget));
    }
    match store.compact(state.revision, false).await {
        Ok(_) => Ok((next, Round::Compacted(state.revision))),
        // Already compacted past it (an operator ran `etcdctl compact`): nothing to do.
        Err(skerry_store::StoreError::Compacted { .. }) => {
            Ok((next, Round::Compacted(state.revision)))
        }
        Err(e) => Err(e),
    }
}

/// The compactor loop; runs until the task is dropped.
pub async fn run(store: Store, interval: Duration) {
    let mut state = CompactorState::default();
    loop {
        tokio::time::sleep(interval).await;
        match round(&store, state).await {
            Ok((next, outcome)) => {
                if let Round::Compacted(revision) = outcome {
                    tracing::info!(revision, "compacted the store");
                }
                state = next;
            }
            Err(e) => tracing::warn!(error = %e, "compaction round failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skerry_store::StoreConfig;

    async fn put(store: &Store, key: &str) -> i64 {
        store
            .put(PutRequest {
                key: Bytes::from(key.to_string()),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            })
            .await
            .expect("put")
            .header
            .map_or(0, |h| h.revision)
    }

    #[tokio::test]
    async fn one_of_many_compactors_wins_each_tick_and_compacts_one_interval_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(StoreConfig::new(dir.path())).expect("open");
        put(&store, "/registry/a").await;
        // Three apiservers start together.
        let mut states = [CompactorState::default(); 3];
        // Round 1: the first to try wins (nothing to compact yet); the others lose and learn
        // the time.
        let mut outcomes = Vec::new();
        for s in &mut states {
            let (next, outcome) = round(&store, *s).await.expect("round");
            *s = next;
            outcomes.push(outcome);
        }
        assert_eq!(
            outcomes,
            vec![Round::WonWithoutTarget, Round::Lost, Round::Lost]
        );
        let seen_at_round_one = states[0].revision;
        for i in 0..5 {
            put(&store, &format!("/registry/b{i}")).await;
        }
        // Round 2: exactly one wins again, and compacts to what the winner saw a round ago.
        let mut outcomes = Vec::new();
        for s in &mut states {
            let (next, outcome) = round(&store, *s).await.expect("round");
            *s = next;
            outcomes.push(outcome);
        }
        let wins: Vec<_> = outcomes
            .iter()
            .filter(|o| matches!(o, Round::Compacted(_)))
            .collect();
        assert_eq!(wins.len(), 1, "{outcomes:?}");
        let Round::Compacted(rev) = wins[0] else {
            unreachable!()
        };
        assert!(
            *rev <= seen_at_round_one + 1,
            "compacted to {rev}, seen a round ago {seen_at_round_one}"
        );
        assert_eq!(store.compact_revision(), *rev);
        // Newer history stays readable.
        assert!(store.revision() > *rev);
    }
}
