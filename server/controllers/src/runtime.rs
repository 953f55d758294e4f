//! The loop every controller runs: workers take keys from a [`WorkQueue`], call the
//! controller's `sync`, and re-queue with the rate limiter on failure — client-go's
//! `processNextWorkItem`, once, for all of skerry's controllers.

use std::future::Future;
use std::sync::Arc;

use skerry_client::workqueue::WorkQueue;
use tokio_util::sync::CancellationToken;

/// Retries of one key before it is dropped from the queue (and left to the next event or
/// resync): client-go controllers use 15 for most loops — with the per-item exponential
/// limiter starting at 5 ms that is about 80 s of retrying before giving up.
pub const MAX_RETRIES: u32 = 15;

/// A controller's reconciliation of one key.
pub trait Reconciler: Send + Sync + 'static {
    /// The controller's name (logs, metrics).
    fn name(&self) -> &'static str;
    /// Brings the object at `key` towards its desired state. An error re-queues the key with
    /// backoff.
    fn sync(&self, key: &str) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Runs `workers` workers over `queue` until `stop`, then shuts the queue down and drains it.
pub async fn run_workers<R: Reconciler>(
    reconciler: Arc<R>,
    queue: WorkQueue<String>,
    workers: usize,
    stop: CancellationToken,
) {
    let mut tasks = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let reconciler = reconciler.clone();
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(key) = queue.get().await {
                process(&*reconciler, &queue, key).await;
            }
        }));
    }
    stop.cancelled().await;
    queue.shut_down_with_drain().await;
    for t in tasks {
        let _ = t.await;
    }
}

/// One key: sync, then `forget` on success or `add_rate_limited` on failure, and `done`.
pub async fn process<R: Reconciler>(reconciler: &R, queue: &WorkQueue<String>, key: String) {
    match reconciler.sync(&key).await {
        Ok(()) => queue.forget(&key),
        Err(e) => {
            let retries = queue.num_requeues(&key);
            if retries < MAX_RETRIES {
                tracing::debug!(controller = reconciler.name(), %key, error = %e, retries, "sync failed; re-queued");
                queue.add_rate_limited(key.clone());
            } else {
                tracing::warn!(controller = reconciler.name(), %key, error = %e, "sync failed {MAX_RETRIES} times; dropped until the next change");
                queue.forget(&key);
            }
        }
    }
    queue.done(&key);
}
