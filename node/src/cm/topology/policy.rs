//! The topology manager's hint merge and its four policies (upstream
//! `pkg/kubelet/cm/topologymanager/policy.go`, `policy_none.go`, `policy_best_effort.go`,
//! `policy_restricted.go`, `policy_single_numa_node.go`).
//!
//! The trick: every provider (CPU manager, memory manager, device manager) gives, per
//! resource, the NUMA masks that could satisfy it, each marked preferred when it is as
//! narrow as it can be. The merge takes one hint of every provider in every combination
//! (the cross product), ANDs their masks with the all-nodes mask, and the result is preferred
//! only when every hint was preferred and every mask was the same. A provider that has no
//! preference (no hints at all, or `nil` for a resource) is a don't-care, `{nil, preferred}`:
//! it leaves the AND alone. Only a resource with an empty (non-nil) list, "no NUMA placement
//! can satisfy this", contributes `{nil, not preferred}`. Reading "no answer" as a zero mask
//! would make every merge empty and reject every pod.

use std::collections::BTreeMap;

use super::bitmask::BitMask;

/// One NUMA placement a provider proposes (`TopologyHint`): `None` is "any node".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopologyHint {
    pub affinity: Option<BitMask>,
    pub preferred: bool,
}

/// A provider's hints by resource name (upstream `map[string][]TopologyHint`): an empty map
/// or a `None` list is "no preference"; `Some(vec![])` is "no placement possible".
pub type HintMap = BTreeMap<String, Option<Vec<TopologyHint>>>;

/// `--topology-manager-policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

impl Policy {
    /// The flag's value (`PolicyNone` ... `PolicySingleNumaNode`).
    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::BestEffort => "best-effort",
            Policy::Restricted => "restricted",
            Policy::SingleNumaNode => "single-numa-node",
        }
    }

    /// Parses the flag, with upstream's error (`NewManager`'s "unknown policy").
    pub fn parse(s: &str) -> Result<Policy, String> {
        Ok(match s {
            "none" => Policy::None,
            "best-effort" => Policy::BestEffort,
            "restricted" => Policy::Restricted,
            "single-numa-node" => Policy::SingleNumaNode,
            _ => return Err(format!("unknown policy: \"{s}\"")),
        })
    }

    /// Merges the providers' hints over the machine's NUMA nodes `numa_nodes`; gives the best
    /// hint and whether the pod may be admitted (each policy's `Merge`).
    pub fn merge(self, numa_nodes: &[u32], providers: &[HintMap]) -> (TopologyHint, bool) {
        match self {
            // `policyNone.Merge`: `TopologyHint{}`, always admitted.
            Policy::None => (
                TopologyHint {
                    affinity: None,
                    preferred: false,
                },
                true,
            ),
            Policy::BestEffort => (merge(numa_nodes, &filter_providers_hints(providers)), true),
            Policy::Restricted => {
                let best = merge(numa_nodes, &filter_providers_hints(providers));
                (best, best.preferred)
            }
            Policy::SingleNumaNode => {
                let single = filter_single_numa_hints(&filter_providers_hints(providers));
                let mut best = merge(numa_nodes, &single);
                if best.affinity == Some(default_affinity(numa_nodes)) {
                    best.affinity = None;
                }
                (best, best.preferred)
            }
        }
    }
}

/// The mask of every NUMA node (`DefaultAffinityMask`).
pub fn default_affinity(numa_nodes: &[u32]) -> BitMask {
    numa_nodes.iter().fold(BitMask::EMPTY, |m, &n| m.with(n))
}

/// `filterProvidersHints`: one list per (provider, resource); no preference is a single
/// preferred don't-care, no possible placement a single non-preferred one.
pub fn filter_providers_hints(providers: &[HintMap]) -> Vec<Vec<TopologyHint>> {
    let any = |preferred| {
        vec![TopologyHint {
            affinity: None,
            preferred,
        }]
    };
    let mut all = Vec::new();
    for hints in providers {
        if hints.is_empty() {
            all.push(any(true));
            continue;
        }
        for list in hints.values() {
            match list {
                None => all.push(any(true)),
                Some(l) if l.is_empty() => all.push(any(false)),
                Some(l) => all.push(l.clone()),
            }
        }
    }
    all
}

/// `filterSingleNumaHints`: only don't-cares and preferred single-node hints.
fn filter_single_numa_hints(all: &[Vec<TopologyHint>]) -> Vec<Vec<TopologyHint>> {
    all.iter()
        .map(|hints| {
            hints
                .iter()
                .filter(|h| h.preferred && h.affinity.is_none_or(|a| a.count() == 1))
                .copied()
                .collect()
        })
        .collect()
}

/// `mergePermutation`: the AND of the masks given; preferred only when every hint is and
/// every mask is the same.
fn merge_permutation(default: BitMask, permutation: &[TopologyHint]) -> TopologyHint {
    let mut preferred = true;
    let mut merged = default;
    let mut first: Option<BitMask> = None;
    for hint in permutation {
        if let Some(a) = hint.affinity {
            match first {
                None => first = Some(a),
                Some(f) if f != a => preferred = false,
                Some(_) => {}
            }
            merged = merged.and(a);
        }
        if !hint.preferred {
            preferred = false;
        }
    }
    TopologyHint {
        affinity: Some(merged),
        preferred,
    }
}

/// `iterateAllProviderTopologyHints`: every combination of one hint per list (none when a
/// list is empty).
fn iterate_permutations(all: &[Vec<TopologyHint>], f: &mut dyn FnMut(&[TopologyHint])) {
    fn rec(
        all: &[Vec<TopologyHint>],
        i: usize,
        acc: &mut Vec<TopologyHint>,
        f: &mut dyn FnMut(&[TopologyHint]),
    ) {
        if i == all.len() {
            f(acc);
            return;
        }
        for h in &all[i] {
            acc.push(*h);
            rec(all, i + 1, acc, f);
            acc.pop();
        }
    }
    rec(all, 0, &mut Vec::new(), f);
}

/// `maxOfMinAffinityCounts`: the widest of the providers' narrowest masks, the size a
/// non-preferred answer should aim at.
fn max_of_min_affinity_counts(all: &[Vec<TopologyHint>]) -> u32 {
    all.iter()
        .filter_map(|hints| {
            hints
                .iter()
                .filter_map(|h| h.affinity)
                .reduce(|a, b| if b.is_narrower_than(a) { b } else { a })
        })
        .map(BitMask::count)
        .max()
        .unwrap_or(0)
}

/// `HintMerger.compare` with `Narrowest` as the mask comparison (no `prefer-closest-numa-nodes`).
fn compare(
    best_non_preferred: u32,
    current: Option<TopologyHint>,
    candidate: TopologyHint,
) -> Option<TopologyHint> {
    let Some(ca) = candidate.affinity.filter(|a| a.count() > 0) else {
        return current;
    };
    let Some(cur) = current else {
        return Some(candidate);
    };
    let cu = cur.affinity.unwrap_or(BitMask::EMPTY);
    let narrowest = || {
        if ca == cu || !ca.is_narrower_than(cu) {
            Some(cur)
        } else {
            Some(candidate)
        }
    };
    match (cur.preferred, candidate.preferred) {
        (false, true) => return Some(candidate),
        (true, false) => return Some(cur),
        (true, true) => return narrowest(),
        (false, false) => {}
    }
    let (cc, nc, best) = (cu.count(), ca.count(), best_non_preferred);
    if cc > best {
        return narrowest();
    }
    if cc == best {
        return if nc != best { Some(cur) } else { narrowest() };
    }
    if nc > best {
        return Some(cur);
    }
    if nc == best {
        return Some(candidate);
    }
    if nc > cc {
        return Some(candidate);
    }
    if nc < cc {
        return Some(cur);
    }
    narrowest()
}

/// `HintMerger.Merge`: the best merged permutation, or the all-nodes mask not preferred.
pub fn merge(numa_nodes: &[u32], all: &[Vec<TopologyHint>]) -> TopologyHint {
    let default = default_affinity(numa_nodes);
    let best_non_preferred = max_of_min_affinity_counts(all);
    let mut best = None;
    iterate_permutations(all, &mut |p| {
        best = compare(best_non_preferred, best, merge_permutation(default, p));
    });
    best.unwrap_or(TopologyHint {
        affinity: Some(default),
        preferred: false,
    })
}

#[cfg(test)]
mod tests;
