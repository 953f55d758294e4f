//! The cut-link failover in CI (issue 21): `skerry_tests::torture::failover` over a real
//! three-member cluster of the debug `skerry` binary in network namespaces, three rounds of
//! cutting the leader's link to both peers with nft drop rules. Each round must show a new
//! leader among the survivors, a write acknowledged through a survivor, the old leader stepping
//! down by itself while still cut off (check-quorum), the old leader rejoining as a follower
//! after the heal, and every acknowledged write present on the leader and on the old leader.
//!
//! No time bound is asserted (the figures are a benchmark's, `skerry-failover`); the outages are
//! printed. Needs root, `ip` and `nft`: without them the test skips with a line, and fails under
//! `CI=true`. The skerry binary is `target/debug/skerry`, built with `cargo build -p skerry`
//! when missing (as `tests/torture.rs` does). Members' logs land in
//! `target/torture/ci-failover-cut/`.

use std::process::{Command, Stdio};

use skerry_tests::torture::Target;
use skerry_tests::torture::failover::{self, FailoverConfig};

/// Rounds in CI: enough to cut more than one member in turn, short enough for the file to take
/// well under a minute on a debug build.
const ROUNDS: usize = 3;

/// Whether a prerequisite is missing (`ok` false): under `CI=true` a failure saying `why`,
/// otherwise a skip with that line.
fn missing(why: &str, ok: bool) -> bool {
    if !ok {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipping: {why}");
    }
    !ok
}

fn tool_runs(tool: &str) -> bool {
    Command::new(tool)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[test]
fn a_cut_off_leader_is_replaced_steps_down_and_rejoins_without_losing_writes() {
    let ok = rustix::process::geteuid().is_root() && tool_runs("ip") && tool_runs("nft");
    if missing(
        "the cut-link failover needs root, `ip` and `nft` (apt-get install -y iproute2 nftables)",
        ok,
    ) {
        return;
    }
    let out = skerry_tests::torture::target_dir()
        .join("torture")
        .join("ci-failover-cut");
    let _ = std::fs::remove_dir_all(&out);
    let config = FailoverConfig {
        target: Target::Skerry,
        bin: skerry_tests::torture::debug_skerry_bin(),
        rounds: ROUNDS,
        out_dir: out.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let run = runtime
        .block_on(failover::measure(&config))
        .unwrap_or_else(|e| panic!("the measurement could not run: {e:#}"));
    let text = run.text();
    println!("{text}logs in {}", out.display());
    assert_eq!(run.error, None, "{text}");
    assert_eq!(run.rounds.len(), ROUNDS, "{text}");
    for (i, round) in run.rounds.iter().enumerate() {
        let round_no = i + 1;
        assert_ne!(
            round.new_leader, round.old_leader,
            "round {round_no}: no new leader among the survivors\n{text}"
        );
        // The write before the cut, the first one after it (through a survivor), and the
        // writes through the new leader while the old one was cut off.
        assert!(
            round.acknowledged >= 3,
            "round {round_no}: writes were not acknowledged through a survivor\n{text}"
        );
        assert!(
            round.step_down.is_some(),
            "round {round_no}: the cut-off leader did not step down by itself\n{text}"
        );
        assert!(
            round.rejoin.is_some(),
            "round {round_no}: the old leader did not rejoin after the heal\n{text}"
        );
        assert!(
            round
                .leader_after_heal
                .as_deref()
                .is_some_and(|leader| leader != round.old_leader),
            "round {round_no}: the old leader did not rejoin as a follower\n{text}"
        );
        assert!(
            round.lost.is_empty(),
            "round {round_no}: acknowledged writes lost: {:?}\n{text}",
            round.lost
        );
    }
    assert!(run.is_valid(), "{text}");
}
