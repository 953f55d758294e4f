//! client-go's retry of answers that carry `Retry-After` (429 or 5xx: the server did not
//! process the request), against a canned HTTP/1.1 server on loopback that counts requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use skerry_client::Client;
use skerry_client::api::{RETRY_AFTER_RETRIES_MAX, http_method::Method};
use skerry_client::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The answer to request number `n` (0-based): status line and extra headers.
type Script = fn(usize) -> (&'static str, &'static str);

/// Serves `script` on a loopback port; returns its URL and the request counter.
async fn serve(script: Script) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // Requests here have no body: each ends at its blank line.
                    while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        buffer.drain(..end + 4);
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        let (status, headers) = script(n);
                        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure"}"#;
                        let response = format!(
                            "HTTP/1.1 {status}\r\n{headers}Content-Type: application/json\r\n\
                             Content-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (url, count)
}

fn client(url: &str) -> Client {
    let mut config = Config::new(url);
    config.qps = 0.0;
    Client::new(config).expect("client")
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_until_it_succeeds() {
    let (url, count) = serve(|n| {
        if n < 2 {
            ("429 Too Many Requests", "Retry-After: 0\r\n")
        } else {
            ("200 OK", "")
        }
    })
    .await;
    let (code, _) = client(&url)
        .request_raw(Method::Post, "/api/v1/namespaces/d/pods/p/binding", None)
        .await
        .expect("request");
    assert_eq!(code, 200);
    assert_eq!(
        count.load(Ordering::SeqCst),
        3,
        "two refusals, then the answer"
    );
}

#[tokio::test]
async fn retries_stop_after_client_gos_ten() {
    let (url, count) = serve(|_| ("503 Service Unavailable", "Retry-After: 0\r\n")).await;
    let (code, _) = client(&url)
        .request_raw(Method::Get, "/api/v1/pods", None)
        .await
        .expect("request");
    assert_eq!(code, 503);
    let expected = 1 + usize::try_from(RETRY_AFTER_RETRIES_MAX).expect("small");
    assert_eq!(count.load(Ordering::SeqCst), expected);
}

#[tokio::test]
async fn an_error_without_retry_after_is_returned_at_once() {
    // A 5xx without the header may have been applied: resending a POST could apply it twice.
    let (url, count) = serve(|_| ("500 Internal Server Error", "")).await;
    let (code, _) = client(&url)
        .request_raw(Method::Post, "/api/v1/namespaces/d/configmaps", None)
        .await
        .expect("request");
    assert_eq!(code, 500);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}
