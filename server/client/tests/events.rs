//! The event recorder against a real apiserver ([`TestServer`]): events land in the involved
//! object's namespace with client-go's fields, repeats become one event with a count,
//! similar events are combined, the per-object spam filter caps a burst, a full queue drops
//! without blocking the caller, an expired event is created again, and an unreachable
//! apiserver costs retries, not the controller.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Event, Node};
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::events::{
    AGGREGATE_EVENTS_MAX, AGGREGATE_MESSAGE_PREFIX, EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING,
    EventRecorder, RecorderOptions, SPAM_BURST, object_reference,
};
use skerry_client::{Api, Client, DeleteParams, ListParams, PostParams};

const COMPONENT: &str = "deployment-controller";

fn admin_config(server: &TestServer) -> Config {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    // Tests are not what the client's limiter is for.
    config.qps = 0.0;
    config
}

async fn start() -> (TestServer, Client) {
    let server = TestServer::start().await.unwrap();
    let client = Client::new(admin_config(&server)).unwrap();
    (server, client)
}

/// A ConfigMap `name` in `default`, created on the server (so it has a uid and an RV).
async fn involved(client: &Client, name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    client
        .api::<ConfigMap>(Some("default"))
        .create(&PostParams::default(), &cm)
        .await
        .unwrap()
}

/// The events of `namespace` about the object named `object`, oldest name first.
async fn events_about(client: &Client, namespace: &str, object: &str) -> Vec<Event> {
    let api: Api<Event> = client.api(Some(namespace));
    let mut events: Vec<Event> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(object))
        .collect();
    events.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    events
}

#[tokio::test]
async fn event_appears_with_the_right_fields() {
    let (_server, client) = start().await;
    let cm = involved(&client, "web").await;
    let recorder = EventRecorder::new(client.clone(), COMPONENT);

    recorder.event(
        &object_reference(&cm),
        EVENT_TYPE_NORMAL,
        "SuccessfulCreate",
        "Created pod: web-abc12",
    );
    recorder.flush().await;

    let events = events_about(&client, "default", "web").await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    let name = e.metadata.name.as_deref().unwrap();
    let suffix = name.strip_prefix("web.").unwrap();
    assert!(
        !suffix.is_empty() && suffix.chars().all(|c| c.is_ascii_hexdigit()),
        "event name {name:?} is not <object>.<hex nanos>"
    );
    assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert_eq!(e.reason.as_deref(), Some("SuccessfulCreate"));
    assert_eq!(e.message.as_deref(), Some("Created pod: web-abc12"));
    assert_eq!(e.count, Some(1));
    assert!(e.first_timestamp.is_some());
    assert_eq!(e.first_timestamp, e.last_timestamp);
    assert_eq!(
        e.source.as_ref().unwrap().component.as_deref(),
        Some(COMPONENT)
    );
    assert_eq!(e.reporting_component.as_deref(), Some(COMPONENT));
    let o = &e.involved_object;
    assert_eq!(o.api_version.as_deref(), Some("v1"));
    assert_eq!(o.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(o.namespace.as_deref(), Some("default"));
    assert_eq!(o.name.as_deref(), Some("web"));
    assert_eq!(o.uid, cm.metadata.uid);
    assert_eq!(o.resource_version, cm.metadata.resource_version);
}

#[tokio::test]
async fn cluster_scoped_objects_get_their_events_in_default() {
    let (_server, client) = start().await;
    let mut node = Node::default();
    node.metadata.name = Some("member-1".to_string());
    let recorder = EventRecorder::new(client.clone(), "node-controller");

    recorder.event(
        &object_reference(&node),
        EVENT_TYPE_WARNING,
        "NodeNotReady",
        "Node member-1 status is now: NodeNotReady",
    );
    recorder.flush().await;

    let events = events_about(&client, "default", "member-1").await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(events[0].involved_object.namespace, None);
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
}

#[tokio::test]
async fn the_same_event_three_times_is_one_event_with_count_three() {
    let (_server, client) = start().await;
    let cm = involved(&client, "web").await;
    let recorder = EventRecorder::new(client.clone(), COMPONENT);
    let object = object_reference(&cm);

    for _ in 0..3 {
        recorder.event(
            &object,
            EVENT_TYPE_NORMAL,
            "ScalingReplicaSet",
            "Scaled up replica set web-5d8f to 3",
        );
        // Let each write reach the server before the next, so the later ones are PATCHes
        // of a stored event rather than of one still in flight (the writer is sequential
        // anyway; this only makes lastTimestamp move).
        recorder.flush().await;
    }

    let events = events_about(&client, "default", "web").await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].count, Some(3));
    assert_eq!(
        events[0].message.as_deref(),
        Some("Scaled up replica set web-5d8f to 3")
    );
    assert!(events[0].last_timestamp >= events[0].first_timestamp);
}

#[tokio::test]
async fn twelve_similar_events_are_combined() {
    let (_server, client) = start().await;
    let cm = involved(&client, "web").await;
    let recorder = EventRecorder::new(client.clone(), COMPONENT);
    let object = object_reference(&cm);

    for i in 1..=12 {
        recorder.event(
            &object,
            EVENT_TYPE_WARNING,
            "FailedCreate",
            &format!("Error creating: pods \"web-{i}\" is forbidden: exceeded quota"),
        );
    }
    recorder.flush().await;

    let events = events_about(&client, "default", "web").await;
    let (combined, single): (Vec<&Event>, Vec<&Event>) = events.iter().partition(|e| {
        e.message
            .as_deref()
            .unwrap()
            .starts_with(AGGREGATE_MESSAGE_PREFIX)
    });
    // The first nine distinct messages are written as they are; the tenth, eleventh and
    // twelfth become one combined event counted three times, carrying the latest message.
    assert_eq!(single.len(), AGGREGATE_EVENTS_MAX - 1, "{events:#?}");
    assert!(single.iter().all(|e| e.count == Some(1)));
    assert_eq!(combined.len(), 1, "{events:#?}");
    assert_eq!(combined[0].count, Some(3));
    assert_eq!(combined[0].reason.as_deref(), Some("FailedCreate"));
    assert_eq!(
        combined[0].message.as_deref(),
        Some(
            format!(
                "{AGGREGATE_MESSAGE_PREFIX}Error creating: pods \"web-12\" is forbidden: exceeded quota"
            )
            .as_str()
        )
    );
}

#[tokio::test]
async fn the_spam_filter_drops_past_the_burst() {
    let (_server, client) = start().await;
    let cm = involved(&client, "web").await;
    let other = involved(&client, "api").await;
    let recorder = EventRecorder::new(client.clone(), COMPONENT);
    let object = object_reference(&cm);

    // Distinct reasons: neither deduplicated nor aggregated, only the per-object budget.
    let sent = SPAM_BURST as usize + 5;
    for i in 0..sent {
        recorder.event(&object, EVENT_TYPE_NORMAL, &format!("Step{i}"), "progress");
    }
    // The budget is per object: another object still gets its events.
    recorder.event(
        &object_reference(&other),
        EVENT_TYPE_NORMAL,
        "Step",
        "progress",
    );
    recorder.flush().await;

    assert_eq!(
        events_about(&client, "default", "web").await.len(),
        SPAM_BURST as usize
    );
    assert_eq!(events_about(&client, "default", "api").await.len(), 1);
    assert_eq!(recorder.stats().spam_filtered(), 5);
    assert_eq!(recorder.stats().queue_full_dropped(), 0);
}

#[tokio::test]
async fn a_full_queue_drops_without_blocking() {
    let (_server, client) = start().await;
    let cm = involved(&client, "web").await;
    let queue_events_max = 4;
    let options = RecorderOptions {
        queue_events_max,
        ..RecorderOptions::new(COMPONENT)
    };
    // The writer is not running yet: nothing drains the queue.
    let (recorder, writer) = EventRecorder::with_options(client.clone(), options);
    let object = object_reference(&cm);

    let started = Instant::now();
    for i in 0..100 {
        recorder.event(&object, EVENT_TYPE_NORMAL, &format!("Reason{i}"), "m");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "event() blocked: {took:?}");
    assert_eq!(
        recorder.stats().queue_full_dropped(),
        100 - queue_events_max as u64
    );

    // What was queued is written once the writer runs.
    tokio::spawn(writer.run());
    recorder.flush().await;
    let events = events_about(&client, "default", "web").await;
    let reasons: Vec<&str> = events
        .iter()
        .map(|e| e.reason.as_deref().unwrap())
        .collect();
    assert_eq!(events.len(), queue_events_max, "{reasons:?}");
    for i in 0..queue_events_max {
        assert!(
            reasons.contains(&format!("Reason{i}").as_str()),
            "{reasons:?}"
        );
    }
}

#[tokio::test]
async fn an_expired_event_is_created_again() {
    let (_server, client) = start().await;
    let cm = involved(&client, "web").await;
    let recorder = EventRecorder::new(client.clone(), COMPONENT);
    let object = object_reference(&cm);

    recorder.event(&object, EVENT_TYPE_NORMAL, "Sync", "synced");
    recorder.flush().await;
    let first = events_about(&client, "default", "web").await;
    assert_eq!(first.len(), 1);
    let name = first[0].metadata.name.clone().unwrap();
    // The server forgets it (as the event TTL does).
    client
        .api::<Event>(Some("default"))
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();

    // The repeat's PATCH answers 404, so it is created again under the same name.
    recorder.event(&object, EVENT_TYPE_NORMAL, "Sync", "synced");
    recorder.flush().await;
    let again = events_about(&client, "default", "web").await;
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_eq!(again[0].metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(again[0].count, Some(2));
    assert_eq!(recorder.stats().write_failed(), 0);
}

#[tokio::test]
async fn an_unreachable_apiserver_costs_retries_then_the_event() {
    // A port nothing listens on: every write is a transport error.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = Client::new(Config::new(&format!("http://{addr}"))).unwrap();
    let options = RecorderOptions {
        write_tries_max: 3,
        write_retry_sleep: Duration::from_millis(10),
        ..RecorderOptions::new(COMPONENT)
    };
    let (recorder, writer) = EventRecorder::with_options(client, options);
    let writer = tokio::spawn(writer.run());
    let mut node = Node::default();
    node.metadata.name = Some("member-1".to_string());

    recorder.event(&object_reference(&node), EVENT_TYPE_NORMAL, "R", "m");
    tokio::time::timeout(Duration::from_secs(30), recorder.flush())
        .await
        .unwrap();
    assert_eq!(recorder.stats().write_failed(), 1);

    // An invalid type is refused at the door.
    recorder.event(&object_reference(&node), "Critical", "R", "m");
    assert_eq!(recorder.stats().invalid_type_dropped(), 1);

    // Dropping the last recorder ends the writer.
    drop(recorder);
    tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn shutdown_stops_the_writer_mid_retry() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = Client::new(Config::new(&format!("http://{addr}"))).unwrap();
    // The default retry schedule would hold the writer for about two minutes.
    let (recorder, writer) = EventRecorder::with_options(client, RecorderOptions::new(COMPONENT));
    let writer = tokio::spawn(writer.run());
    let mut node = Node::default();
    node.metadata.name = Some("member-1".to_string());
    recorder.event(&object_reference(&node), EVENT_TYPE_NORMAL, "R", "m");

    tokio::time::sleep(Duration::from_millis(100)).await;
    let keep = recorder.clone();
    recorder.shutdown();
    tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .unwrap()
        .unwrap();
    // A flush after shutdown returns at once; events after it are dropped quietly.
    tokio::time::timeout(Duration::from_secs(1), keep.flush())
        .await
        .unwrap();
    keep.event(&object_reference(&node), EVENT_TYPE_NORMAL, "R", "m");
}
