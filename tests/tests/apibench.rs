//! Smoke test of the apiserver benchmark at tiny sizes (debug build): the harness starts a
//! real apiserver over TLS, both fan-out levels run, and the serialize-once invariant holds
//! (each run fails inside the harness unless the cache's serialization count grew by exactly
//! the number of events; this test checks the reported counts too).

use skerry_tests::apibench::list::{LIST_WAYS, ListWay};
use skerry_tests::apibench::{self, Level, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apibench_smoke() {
    let options = Options {
        cache_watchers: vec![20],
        // 250 watchers need two HTTP/2 connections: the multiplexing path is exercised.
        http_watchers: vec![20, 250],
        updates: 5,
        // Paced, so the pacing path runs too; 5 ms keeps the test fast.
        update_interval: std::time::Duration::from_millis(5),
        list_pods: 30,
        runs: 2,
    };
    let report = apibench::run(&options).await.expect("the benchmark runs");

    assert_eq!(report.fanout.len(), 3);
    for scenario in &report.fanout {
        assert_eq!(scenario.runs.len(), 2);
        for run in &scenario.runs {
            assert_eq!(
                run.serializations,
                5,
                "{} with {} watchers: one serialization per event, not per watcher",
                scenario.level.name(),
                scenario.watchers
            );
            assert_eq!(run.events_delivered, 5 * scenario.watchers as u64);
            assert_eq!(run.watchers_cut, 0);
            assert!(run.latency_p50 <= run.latency_p99);
            assert!(run.latency_p99 <= run.latency_max);
            assert!(run.events_per_second() > 0.0);
        }
    }
    let http: Vec<_> = report
        .fanout
        .iter()
        .filter(|f| f.level == Level::Http)
        .map(|f| (f.watchers, f.connections))
        .collect();
    assert_eq!(http, vec![(20, Some(1)), (250, Some(2))]);

    let list = report.list.as_ref().expect("the LIST benchmark ran");
    assert_eq!(list.pods, 30);
    for way in LIST_WAYS {
        assert!(list.median(way).is_some(), "{} was timed", way.name());
    }
    assert!(list.ratio(ListWay::Store, ListWay::CacheAny).is_some());

    let json = report.to_json();
    assert_eq!(
        json["fanout"][0]["serializations_per_run"],
        serde_json::json!([5, 5])
    );
    assert_eq!(json["list"]["pods"], 30);
    let table = report.table();
    assert!(table.contains("5 = events"), "{table}");
    assert!(table.contains("store/cache ratio"), "{table}");
}

#[test]
fn options_are_bounded() {
    assert!(Options::default().validate().is_ok());
    let too_many_updates = Options {
        updates: skerry_apiserver::watch_cache::WATCHER_QUEUE_EVENTS_MAX + 1,
        ..Options::default()
    };
    assert!(too_many_updates.validate().is_err());
    let too_many_http_watchers = Options {
        http_watchers: vec![apibench::HTTP_WATCHERS_MAX + 1],
        ..Options::default()
    };
    assert!(too_many_http_watchers.validate().is_err());
    let no_runs = Options {
        runs: 0,
        ..Options::default()
    };
    assert!(no_runs.validate().is_err());
}
