//! The result accounting of one probe worker (upstream `pkg/kubelet/prober/worker.go`
//! `doProbe`), kept pure so the thresholds, the initial delay and the startup gating are
//! tested as tables: the worker task in [`super`] asks [`Accounting::before`] whether to
//! probe now, runs the probe, and hands the outcome to [`Accounting::after`], which says
//! whether the cached result changes.

use super::{ProbeKind, ProbeResult};

/// The container as a worker sees it before a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The runtime id of the newest instance.
    pub id: String,
    /// Whether it runs.
    pub running: bool,
    /// Seconds it has run (now - startedAt).
    pub running_for: i64,
    /// Whether its startup probe succeeded (or it has none).
    pub started: bool,
}

/// The probe's numbers, defaulted as the API does (`SetDefaults_Probe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// `initialDelaySeconds` (0).
    pub initial_delay: i64,
    /// `successThreshold` (1; liveness and startup must be 1).
    pub success: u32,
    /// `failureThreshold` (3).
    pub failure: u32,
}

/// What [`Accounting::before`] decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Before {
    /// Do not probe this tick; if `set`, the cached result for `id` becomes it (a new
    /// instance starts at the kind's initial result, a stopped one is not ready).
    Skip {
        /// The container instance the result is for, and the result.
        set: Option<(String, ProbeResult)>,
    },
    /// Probe the instance `id`.
    Probe,
}

/// One worker's state across ticks.
#[derive(Clone, Debug)]
pub struct Accounting {
    kind: ProbeKind,
    thresholds: Thresholds,
    /// The instance the counters are about.
    container_id: Option<String>,
    last: Option<ProbeResult>,
    run: u32,
    /// After a liveness or startup failure is set, the worker waits for a new instance
    /// (upstream's `onHold`): the old one is being killed.
    on_hold: bool,
}

impl Accounting {
    /// A worker's accounting for a probe of `kind`.
    pub fn new(kind: ProbeKind, thresholds: Thresholds) -> Accounting {
        Accounting {
            kind,
            thresholds,
            container_id: None,
            last: None,
            run: 0,
            on_hold: false,
        }
    }

    /// Whether to probe now (the first half of `doProbe`).
    pub fn before(&mut self, target: Option<&Target>) -> Before {
        let Some(t) = target else {
            return Before::Skip { set: None };
        };
        if self.container_id.as_deref() != Some(t.id.as_str()) {
            // A new instance: counters start over at the kind's initial value.
            self.container_id = Some(t.id.clone());
            self.last = None;
            self.run = 0;
            self.on_hold = false;
            if t.running {
                let initial = self.kind.initial();
                return match initial {
                    Some(r) => {
                        if self.ready_to_probe(t) {
                            Before::Probe
                        } else {
                            Before::Skip {
                                set: Some((t.id.clone(), r)),
                            }
                        }
                    }
                    None if self.ready_to_probe(t) => Before::Probe,
                    None => Before::Skip { set: None },
                };
            }
        }
        if !t.running {
            // An exited instance is not ready (upstream sets Failure for a terminated
            // container's readiness and stops counting).
            self.last = None;
            self.run = 0;
            return Before::Skip {
                set: (self.kind == ProbeKind::Readiness)
                    .then(|| (t.id.clone(), ProbeResult::Failure)),
            };
        }
        if self.on_hold {
            return Before::Skip { set: None };
        }
        if self.ready_to_probe(t) {
            Before::Probe
        } else {
            Before::Skip { set: None }
        }
    }

    fn ready_to_probe(&self, t: &Target) -> bool {
        match self.kind {
            // A started container's startup probe is done.
            ProbeKind::Startup => !t.started && t.running_for >= self.thresholds.initial_delay,
            // Liveness and readiness wait for the startup probe.
            _ => t.started && t.running_for >= self.thresholds.initial_delay,
        }
    }

    /// Counts an outcome (the second half of `doProbe`): returns the result to cache, if
    /// the thresholds are met and it differs from what is known.
    pub fn after(&mut self, outcome: ProbeResult) -> Option<ProbeResult> {
        if self.last == Some(outcome) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(outcome);
            self.run = 1;
        }
        let needed = match outcome {
            ProbeResult::Success => self.thresholds.success.max(1),
            ProbeResult::Failure => self.thresholds.failure.max(1),
        };
        if self.run < needed {
            return None;
        }
        if outcome == ProbeResult::Failure && self.kind != ProbeKind::Readiness {
            // The container will be killed: stop probing it, and count afresh afterwards
            // (upstream resets `resultRun` and holds).
            self.on_hold = true;
            self.run = 0;
        }
        Some(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(id: &str, running_for: i64, started: bool) -> Target {
        Target {
            id: id.into(),
            running: true,
            running_for,
            started,
        }
    }

    const T: Thresholds = Thresholds {
        initial_delay: 0,
        success: 1,
        failure: 3,
    };

    #[test]
    fn failures_count_up_to_the_threshold() {
        let mut a = Accounting::new(ProbeKind::Liveness, T);
        assert_eq!(a.before(Some(&target("c1", 0, true))), Before::Probe);
        assert_eq!(a.after(ProbeResult::Success), Some(ProbeResult::Success));
        assert_eq!(a.after(ProbeResult::Failure), None);
        assert_eq!(a.after(ProbeResult::Failure), None);
        // A success in between starts the count over.
        assert_eq!(a.after(ProbeResult::Success), Some(ProbeResult::Success));
        assert_eq!(a.after(ProbeResult::Failure), None);
        assert_eq!(a.after(ProbeResult::Failure), None);
        assert_eq!(a.after(ProbeResult::Failure), Some(ProbeResult::Failure));
        // Liveness failed: the instance is on hold until a new one runs.
        assert_eq!(
            a.before(Some(&target("c1", 30, true))),
            Before::Skip { set: None }
        );
        assert_eq!(a.before(Some(&target("c2", 0, true))), Before::Probe);
    }

    #[test]
    fn readiness_needs_success_threshold_successes_and_keeps_probing() {
        let t = Thresholds {
            success: 2,
            failure: 1,
            ..T
        };
        let mut a = Accounting::new(ProbeKind::Readiness, t);
        assert_eq!(a.before(Some(&target("c1", 0, true))), Before::Probe);
        assert_eq!(a.after(ProbeResult::Success), None);
        assert_eq!(a.after(ProbeResult::Success), Some(ProbeResult::Success));
        assert_eq!(a.after(ProbeResult::Failure), Some(ProbeResult::Failure));
        // Readiness is never on hold.
        assert_eq!(a.before(Some(&target("c1", 9, true))), Before::Probe);
    }

    #[test]
    fn the_initial_delay_holds_the_first_probe_with_the_initial_result() {
        let t = Thresholds {
            initial_delay: 5,
            ..T
        };
        let mut r = Accounting::new(ProbeKind::Readiness, t);
        assert_eq!(
            r.before(Some(&target("c1", 2, true))),
            Before::Skip {
                set: Some(("c1".into(), ProbeResult::Failure))
            }
        );
        assert_eq!(
            r.before(Some(&target("c1", 4, true))),
            Before::Skip { set: None }
        );
        assert_eq!(r.before(Some(&target("c1", 5, true))), Before::Probe);
        let mut l = Accounting::new(ProbeKind::Liveness, t);
        assert_eq!(
            l.before(Some(&target("c1", 0, true))),
            Before::Skip {
                set: Some(("c1".into(), ProbeResult::Success))
            }
        );
    }

    #[test]
    fn liveness_and_readiness_wait_for_the_startup_probe() {
        let mut l = Accounting::new(ProbeKind::Liveness, T);
        let mut s = Accounting::new(ProbeKind::Startup, T);
        let not_started = target("c1", 60, false);
        assert_eq!(
            l.before(Some(&not_started)),
            Before::Skip {
                set: Some(("c1".into(), ProbeResult::Success))
            }
        );
        assert_eq!(s.before(Some(&not_started)), Before::Probe);
        assert_eq!(s.after(ProbeResult::Success), Some(ProbeResult::Success));
        let started = target("c1", 61, true);
        assert_eq!(l.before(Some(&started)), Before::Probe);
        // A started container's startup probe is not run again.
        assert_eq!(s.before(Some(&started)), Before::Skip { set: None });
    }

    #[test]
    fn an_exited_instance_is_not_ready_and_not_probed() {
        let mut r = Accounting::new(ProbeKind::Readiness, T);
        assert_eq!(r.before(Some(&target("c1", 0, true))), Before::Probe);
        assert_eq!(r.after(ProbeResult::Success), Some(ProbeResult::Success));
        let exited = Target {
            running: false,
            ..target("c1", 10, true)
        };
        assert_eq!(
            r.before(Some(&exited)),
            Before::Skip {
                set: Some(("c1".into(), ProbeResult::Failure))
            }
        );
        assert_eq!(r.before(None), Before::Skip { set: None });
    }
}
