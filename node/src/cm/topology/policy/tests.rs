//! Tables after upstream's `policy_test.go`, `policy_best_effort_test.go`,
//! `policy_restricted_test.go`, `policy_single_numa_node_test.go`, with the machines given as
//! data (2 and 4 NUMA nodes).

use super::*;

fn m(bits: &[u32]) -> BitMask {
    BitMask::new(bits).expect("mask")
}

fn h(bits: &[u32], preferred: bool) -> TopologyHint {
    TopologyHint {
        affinity: Some(m(bits)),
        preferred,
    }
}

/// One provider with one resource.
fn one(resource: &str, hints: Option<Vec<TopologyHint>>) -> HintMap {
    HintMap::from([(resource.to_string(), hints)])
}

const TWO: &[u32] = &[0, 1];
const FOUR: &[u32] = &[0, 1, 2, 3];

struct Case {
    name: &'static str,
    nodes: &'static [u32],
    providers: Vec<HintMap>,
    /// Expected (hint, admit) for best-effort, restricted, single-numa-node.
    best_effort: TopologyHint,
    restricted_admits: bool,
    single: (TopologyHint, bool),
}

fn cases() -> Vec<Case> {
    let any = |preferred| TopologyHint {
        affinity: None,
        preferred,
    };
    vec![
        Case {
            name: "no provider: every node, preferred",
            nodes: TWO,
            providers: vec![],
            best_effort: h(&[0, 1], true),
            restricted_admits: true,
            single: (any(true), true),
        },
        Case {
            name: "providers with no preference (empty maps) are no signal",
            nodes: TWO,
            providers: vec![HintMap::new(), HintMap::new()],
            best_effort: h(&[0, 1], true),
            restricted_admits: true,
            single: (any(true), true),
        },
        Case {
            name: "a nil list for a resource is no signal either",
            nodes: TWO,
            providers: vec![one("cpu", None)],
            best_effort: h(&[0, 1], true),
            restricted_admits: true,
            single: (any(true), true),
        },
        Case {
            name: "no preference beside a real hint: the hint wins, not a zero",
            nodes: TWO,
            providers: vec![
                one("cpu", Some(vec![h(&[1], true), h(&[0, 1], false)])),
                HintMap::new(),
                one("memory", None),
            ],
            best_effort: h(&[1], true),
            restricted_admits: true,
            single: (h(&[1], true), true),
        },
        Case {
            name: "an empty list: no placement possible, not preferred",
            nodes: TWO,
            providers: vec![one("gpu", Some(vec![]))],
            best_effort: h(&[0, 1], false),
            restricted_admits: false,
            single: (any(false), false),
        },
        Case {
            name: "one provider: the narrowest preferred, lower node on a tie",
            nodes: TWO,
            providers: vec![one(
                "cpu",
                Some(vec![h(&[1], true), h(&[0], true), h(&[0, 1], false)]),
            )],
            best_effort: h(&[0], true),
            restricted_admits: true,
            single: (h(&[0], true), true),
        },
        Case {
            name: "two providers AND to their common node",
            nodes: TWO,
            providers: vec![
                one(
                    "cpu",
                    Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ),
                one("memory", Some(vec![h(&[1], true), h(&[0, 1], false)])),
            ],
            best_effort: h(&[1], true),
            restricted_admits: true,
            single: (h(&[1], true), true),
        },
        Case {
            name: "disjoint preferred nodes: the AND is empty, only a wider non-preferred merge",
            nodes: TWO,
            providers: vec![
                one("cpu", Some(vec![h(&[0], true), h(&[0, 1], false)])),
                one("memory", Some(vec![h(&[1], true), h(&[0, 1], false)])),
            ],
            best_effort: h(&[0], false),
            restricted_admits: false,
            single: (any(false), false),
        },
        Case {
            name: "disjoint and nothing wider: every node, not preferred",
            nodes: TWO,
            providers: vec![
                one("cpu", Some(vec![h(&[0], true)])),
                one("memory", Some(vec![h(&[1], true)])),
            ],
            best_effort: h(&[0, 1], false),
            restricted_admits: false,
            single: (any(false), false),
        },
        Case {
            name: "four nodes: a two-node request meets a provider on nodes 2 and 3",
            nodes: FOUR,
            providers: vec![
                one(
                    "cpu",
                    Some(vec![
                        h(&[0, 1], true),
                        h(&[2, 3], true),
                        h(&[0, 1, 2], false),
                        h(&[0, 1, 2, 3], false),
                    ]),
                ),
                one(
                    "memory",
                    Some(vec![h(&[2, 3], true), h(&[0, 1, 2, 3], false)]),
                ),
            ],
            best_effort: h(&[2, 3], true),
            restricted_admits: true,
            // Single-node hints only: nothing of either provider is left.
            single: (any(false), false),
        },
        Case {
            name: "four nodes: equal masks from both providers stay preferred",
            nodes: FOUR,
            providers: vec![
                one("cpu", Some(vec![h(&[3], true), h(&[2], true)])),
                one("memory", Some(vec![h(&[3], true)])),
                HintMap::new(),
            ],
            best_effort: h(&[3], true),
            restricted_admits: true,
            single: (h(&[3], true), true),
        },
        Case {
            name: "four nodes, all non-preferred: the count the widest provider needs, narrowest",
            nodes: FOUR,
            providers: vec![
                one(
                    "cpu",
                    Some(vec![
                        h(&[2, 3], false),
                        h(&[0, 1], false),
                        h(&[0, 1, 2, 3], false),
                    ]),
                ),
                one(
                    "memory",
                    Some(vec![h(&[0, 1, 2], false), h(&[0, 1, 2, 3], false)]),
                ),
            ],
            // maxOfMinAffinityCounts = 3 (memory needs three nodes at least): the merges
            // climb {2} -> {2,3} -> {0,1} (as wide, lower) -> {0,1,2}, which has exactly 3,
            // and the whole machine, wider, does not replace it.
            best_effort: h(&[0, 1, 2], false),
            restricted_admits: false,
            single: (any(false), false),
        },
        Case {
            name: "four nodes, resource per provider: hints of every resource are ANDed",
            nodes: FOUR,
            providers: vec![HintMap::from([
                ("cpu".to_string(), Some(vec![h(&[1], true), h(&[2], true)])),
                (
                    "hugepages-2Mi".to_string(),
                    Some(vec![h(&[2], true), h(&[1, 2], false)]),
                ),
            ])],
            best_effort: h(&[2], true),
            restricted_admits: true,
            single: (h(&[2], true), true),
        },
    ]
}

#[test]
fn the_policies_merge_as_upstream() {
    for c in cases() {
        let (hint, admit) = Policy::BestEffort.merge(c.nodes, &c.providers);
        assert_eq!(hint, c.best_effort, "best-effort: {}", c.name);
        assert!(admit, "best-effort admits everything: {}", c.name);
        let (hint, admit) = Policy::Restricted.merge(c.nodes, &c.providers);
        assert_eq!(hint, c.best_effort, "restricted: {}", c.name);
        assert_eq!(admit, c.restricted_admits, "restricted: {}", c.name);
        let got = Policy::SingleNumaNode.merge(c.nodes, &c.providers);
        assert_eq!(got, c.single, "single-numa-node: {}", c.name);
        let (hint, admit) = Policy::None.merge(c.nodes, &c.providers);
        assert_eq!((hint.affinity, admit), (None, true), "none: {}", c.name);
    }
}

#[test]
fn no_preference_is_a_dont_care_not_a_zero() {
    // The provider without a preference becomes one preferred "any" hint...
    let all = filter_providers_hints(&[HintMap::new(), one("cpu", None), one("x", Some(vec![]))]);
    let any = |preferred| TopologyHint {
        affinity: None,
        preferred,
    };
    assert_eq!(
        all,
        vec![vec![any(true)], vec![any(true)], vec![any(false)]]
    );
    // ...so the merge with it is the other provider's answer. Were it a zero mask, the AND
    // would be empty and restricted would reject the pod.
    let cpu = one("cpu", Some(vec![h(&[1], true)]));
    assert_eq!(
        Policy::Restricted.merge(TWO, &[cpu.clone(), HintMap::new()]),
        (h(&[1], true), true)
    );
    let zero = one("memory", Some(vec![h(&[], true)]));
    assert_eq!(
        Policy::Restricted.merge(TWO, &[cpu, zero]),
        (h(&[0, 1], false), false),
        "a real zero mask vetoes"
    );
}

#[test]
fn policy_names_as_the_flag() {
    for p in [
        Policy::None,
        Policy::BestEffort,
        Policy::Restricted,
        Policy::SingleNumaNode,
    ] {
        assert_eq!(Policy::parse(p.name()), Ok(p));
    }
    assert_eq!(
        Policy::parse("numa"),
        Err("unknown policy: \"numa\"".to_string())
    );
}
