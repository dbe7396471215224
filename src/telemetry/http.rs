//! The metrics listener: `GET /metrics` and the operator views (`GET /api/channels`,
//! `GET /api/stomp/connections`, `GET /api/amqp10/connections`, `GET /api/amqp10/links`: see
//! `views`), on its own thread and tokio runtime, off the STOMP cores. hyper (HTTP/1.1) does the HTTP; the exporter's handle renders the text.
//!
//! Bounds, so a scraper-shaped attacker costs a fixed, small amount: at most
//! [`MAX_CONCURRENT`] connections are served at once (a permit is taken before `accept`, so
//! the rest wait in the listen queue); a request's headers must arrive within
//! [`HEADER_READ_TIMEOUT`]; a connection serves one request and lives at most
//! [`CONNECTION_DEADLINE`] (a peer that never reads the response cannot hold it).
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Connections served at once.
pub const MAX_CONCURRENT: usize = 16;
/// A request's header block must be complete within this.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one connection (one request and its response) may take.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// How often the recorder's upkeep runs (the exporter's own default).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Serves `listener` forever.
pub(super) async fn serve(listener: std::net::TcpListener, handle: PrometheusHandle) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "metrics listener unusable; serving no metrics");
            return;
        }
    };
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_EVERY).await;
            upkeep.run_upkeep();
        }
    });
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    loop {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: never spin.
                tracing::debug!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let handle = handle.clone();
                async move { Ok::<_, Infallible>(respond(&req, &handle).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // Dropping the connection at the deadline closes it.
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, conn).await;
        });
    }
}

/// `GET /metrics` → the Prometheus text; `GET /api/channels`, `/api/stomp/connections`,
/// `/api/amqp10/connections` and `/api/amqp10/links` → JSON; another method on one of them → 405; any other path → 404.
async fn respond(req: &Request<Incoming>, handle: &PrometheusHandle) -> Response<Full<Bytes>> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut text = handle.render();
            super::latency::render(&mut text);
            let mut ok = Response::new(Full::new(Bytes::from(text)));
            ok.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            return ok;
        }
        (&Method::GET, "/api/channels") => {
            let json = super::views::channels(super::views::limit_of(req.uri().query())).await;
            let mut ok = Response::new(Full::new(Bytes::from(json)));
            ok.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return ok;
        }
        (&Method::GET, "/api/stomp/connections") => {
            let json = super::views::connections(super::views::limit_of(req.uri().query())).await;
            let mut ok = Response::new(Full::new(Bytes::from(json)));
            ok.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return ok;
        }
        (&Method::GET, path @ ("/api/amqp10/connections" | "/api/amqp10/links")) => {
            let limit = super::views::limit_of(req.uri().query());
            let json = if path == "/api/amqp10/links" { super::views::amqp_links(limit).await } else { super::views::amqp_connections(limit).await };
            let mut ok = Response::new(Full::new(Bytes::from(json)));
            ok.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return ok;
        }
        (_, "/metrics" | "/api/channels" | "/api/stomp/connections" | "/api/amqp10/connections" | "/api/amqp10/links") => {
            (StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        }
        _ => (StatusCode::NOT_FOUND, "not found\n"),
    };
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    if status == StatusCode::METHOD_NOT_ALLOWED {
        response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
    }
    response
}
