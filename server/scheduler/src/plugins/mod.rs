//! The in-tree filter and score plugins (Kubernetes 1.32's `framework/plugins`), and the
//! default profile that lists them per extension point in Kubernetes' order.
//!
//! Each plugin parses what it needs from the pod once per cycle (PreFilter / PreScore into
//! the [`CycleState`](crate::framework::CycleState)) so that Filter and Score, which run
//! per node over thousands of nodes, only compare numbers and labels on the snapshot's
//! shared `NodeInfo`s — the snapshot the cache never locks (`docs/tricks.md` #1).
//!
//! A plugin returning `Skip` from PreFilter has nothing to check for this pod: the framework
//! must not run its Filter; `Skip` from PreScore means: do not run its Score (the node's
//! score from that plugin is 0).

pub mod helper;
pub mod imagelocality;
pub mod interpodaffinity;
pub mod nodeaffinity;
pub mod nodename;
pub mod nodeports;
pub mod noderesources;
pub mod nodeunschedulable;
pub mod podtopologyspread;
pub mod tainttoleration;

#[cfg(test)]
mod testing;

use std::sync::Arc;

use crate::framework::{FilterPlugin, PreFilterPlugin, PreScorePlugin, ScorePlugin};

// Score weights of Kubernetes' default profile (`pkg/scheduler/apis/config/v1/
// default_plugins.go`). The weights were tuned upstream so that the "hard-ish" preferences
// a user expresses (PreferNoSchedule taints, preferred node and pod affinity, spreading)
// outweigh the resource heuristics, which only break ties among otherwise equal nodes.

/// TaintToleration: 3, the highest, because a `PreferNoSchedule` taint is an operator's
/// explicit "keep off unless you must".
pub const TAINT_TOLERATION_WEIGHT: i64 = 3;
/// NodeAffinity: 2, the user's preferred node affinity.
pub const NODE_AFFINITY_WEIGHT: i64 = 2;
/// NodeResourcesFit (LeastAllocated): 1.
pub const FIT_WEIGHT: i64 = 1;
/// NodeResourcesBalancedAllocation: 1.
pub const BALANCED_ALLOCATION_WEIGHT: i64 = 1;
/// ImageLocality: 1.
pub const IMAGE_LOCALITY_WEIGHT: i64 = 1;
/// InterPodAffinity: 2, the user's preferred pod (anti-)affinity.
pub const INTER_POD_AFFINITY_WEIGHT: i64 = 2;
/// PodTopologySpread: 2, raised from 1 in Kubernetes 1.24 so default spreading beats
/// resource heuristics.
pub const POD_TOPOLOGY_SPREAD_WEIGHT: i64 = 2;

/// The plugins of a profile, per extension point, each list in the order the framework runs
/// it (Kubernetes' `config.Plugins`, resolved to instances).
#[derive(Clone, Default)]
pub struct Plugins {
    /// PreFilter, run once per pod before Filter.
    pub pre_filter: Vec<Arc<dyn PreFilterPlugin>>,
    /// Filter, run per node; the first rejection wins.
    pub filter: Vec<Arc<dyn FilterPlugin>>,
    /// PreScore, run once per pod over the feasible nodes.
    pub pre_score: Vec<Arc<dyn PreScorePlugin>>,
    /// Score, run per feasible node; weighted sum.
    pub score: Vec<Arc<dyn ScorePlugin>>,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugins")
            .field(
                "pre_filter",
                &self.pre_filter.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .field(
                "filter",
                &self.filter.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .field(
                "pre_score",
                &self.pre_score.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .field(
                "score",
                &self.score.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A plugin that knows which extension points it implements, so a profile can list it once
/// (Kubernetes' `multiPoint`) and [`Plugins::with`] appends it to each of them.
pub trait MultiPoint: Send + Sync + 'static {
    /// Appends `self` to every extension point list it implements.
    fn register(self: Arc<Self>, plugins: &mut Plugins);
}

impl Plugins {
    /// Appends `plugin` to each extension point it implements (in call order, so calling
    /// `with` in Kubernetes' plugin order gives Kubernetes' order at every point).
    pub fn with<P: MultiPoint>(mut self, plugin: P) -> Plugins {
        Arc::new(plugin).register(&mut self);
        self
    }

    /// Appends a PreFilter plugin.
    pub fn with_pre_filter(mut self, plugin: Arc<dyn PreFilterPlugin>) -> Plugins {
        self.pre_filter.push(plugin);
        self
    }

    /// Appends a Filter plugin.
    pub fn with_filter(mut self, plugin: Arc<dyn FilterPlugin>) -> Plugins {
        self.filter.push(plugin);
        self
    }

    /// Appends a PreScore plugin.
    pub fn with_pre_score(mut self, plugin: Arc<dyn PreScorePlugin>) -> Plugins {
        self.pre_score.push(plugin);
        self
    }

    /// Appends a Score plugin.
    pub fn with_score(mut self, plugin: Arc<dyn ScorePlugin>) -> Plugins {
        self.score.push(plugin);
        self
    }
}

/// Registers a plugin type at the listed extension points (`pre_filter`, `filter`,
/// `pre_score`, `score`).
macro_rules! multi_point {
    ($plugin:ty: $($point:ident),+) => {
        impl MultiPoint for $plugin {
            fn register(self: Arc<Self>, plugins: &mut Plugins) {
                $( plugins.$point.push(self.clone()); )+
            }
        }
    };
}

multi_point!(nodeunschedulable::NodeUnschedulable: filter);
multi_point!(nodename::NodeName: filter);
multi_point!(tainttoleration::TaintToleration: filter, pre_score, score);
multi_point!(nodeaffinity::NodeAffinity: pre_filter, filter, pre_score, score);
multi_point!(nodeports::NodePorts: pre_filter, filter);
multi_point!(noderesources::Fit: pre_filter, filter, pre_score, score);
multi_point!(noderesources::BalancedAllocation: pre_score, score);
multi_point!(imagelocality::ImageLocality: pre_score, score);
multi_point!(interpodaffinity::InterPodAffinity: pre_filter, filter, pre_score, score);
multi_point!(podtopologyspread::PodTopologySpread: pre_filter, filter, pre_score, score);

/// Kubernetes' default profile (`getDefaultPlugins`, 1.32), restricted to the plugins
/// skerry has: NodeUnschedulable, NodeName, TaintToleration, NodeAffinity, NodePorts,
/// NodeResourcesFit, [PodTopologySpread, InterPodAffinity], BalancedAllocation,
/// ImageLocality. (Volume plugins, SchedulingGates, PrioritySort, DefaultPreemption and
/// DefaultBinder are the scheduler's own business or absent.)
///
/// PodTopologySpread and InterPodAffinity belong between NodeResourcesFit and
/// NodeResourcesBalancedAllocation: they are added there by their module's author (they
/// need the cluster's Namespace labels, so the scheduler may instead append them with
/// [`Plugins::with`] when it builds its profile).
pub fn default_plugins() -> Plugins {
    Plugins::default()
        .with(nodeunschedulable::NodeUnschedulable)
        .with(nodename::NodeName)
        .with(tainttoleration::TaintToleration::default())
        .with(nodeaffinity::NodeAffinity::default())
        .with(nodeports::NodePorts)
        .with(noderesources::Fit::default())
        // PodTopologySpread and InterPodAffinity go here.
        .with(noderesources::BalancedAllocation::default())
        .with(imagelocality::ImageLocality::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_profile_order_and_weights() {
        let plugins = default_plugins();
        let names = |v: Vec<&'static str>| v;
        assert_eq!(
            format!("{plugins:?}").matches("NodeResourcesFit").count(),
            4,
            "Fit is at all four extension points"
        );
        assert_eq!(
            names(plugins.pre_filter.iter().map(|p| p.name()).collect()),
            vec!["NodeAffinity", "NodePorts", "NodeResourcesFit"]
        );
        assert_eq!(
            names(plugins.filter.iter().map(|p| p.name()).collect()),
            vec![
                "NodeUnschedulable",
                "NodeName",
                "TaintToleration",
                "NodeAffinity",
                "NodePorts",
                "NodeResourcesFit"
            ]
        );
        assert_eq!(
            names(plugins.pre_score.iter().map(|p| p.name()).collect()),
            vec![
                "TaintToleration",
                "NodeAffinity",
                "NodeResourcesFit",
                "NodeResourcesBalancedAllocation",
                "ImageLocality"
            ]
        );
        let weights: Vec<(&str, i64)> = plugins
            .score
            .iter()
            .map(|p| (p.name(), p.weight()))
            .collect();
        assert_eq!(
            weights,
            vec![
                ("TaintToleration", 3),
                ("NodeAffinity", 2),
                ("NodeResourcesFit", 1),
                ("NodeResourcesBalancedAllocation", 1),
                ("ImageLocality", 1)
            ]
        );
    }
}
