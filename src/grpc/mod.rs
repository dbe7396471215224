//! The KubeMQ gRPC API (service `kubemq.kubemq`, `proto/kubemq.proto`), served by tonic on a
//! dedicated tokio runtime beside the glommio cores.
//!
//! Why a separate runtime: the cores are glommio executors pinned to CPUs and never run tokio
//! futures. gRPC traffic reaches the array through [`ArrayHandle`], which sends `CoreMsg`s from
//! any thread, so the gRPC side needs no core of its own.
//!
//! Each RPC is served by the module of its pattern ([`service`] has the table); [`bridge`]
//! holds what they share (ids, the confirmer of array operations). The wire types and their
//! conversions are in [`crate::wire`], which the egress client uses too. The STOMP cores never
//! wait on gRPC: every hand-off from a core to a gRPC stream is a non-blocking channel send.
// `tonic::Status` (176 bytes) is the error type the generated service trait fixes; boxing it
// in the helpers would only move the allocation to the error path of every handler.
#![allow(clippy::result_large_err)]
pub mod auth;
pub mod bridge;
pub mod channels;
pub mod events;
pub mod queue_stream;
pub mod queues;
pub mod rpc;
pub mod service;
pub mod stream;
pub mod validate;

pub use bridge::Limits;

/// A server stream of `T`.
pub type BoxStream<T> = std::pin::Pin<Box<dyn futures_lite::Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;

use crate::wire::pb;
use crate::wire::MAX_MESSAGE_BYTES;

use crate::mesh::handle::ArrayHandle;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a graceful shutdown waits for open calls and connections before abandoning them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A running gRPC server; stopped (gracefully, then joined) by [`GrpcServer::shutdown`] or drop.
pub struct GrpcServer {
    local_addr: SocketAddr,
    stop_tx: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Binds `addr` and serves the KubeMQ API on a multi-thread tokio runtime with `threads`
/// workers (at least one), driven from a std thread named `stompgate-grpc`.
///
/// # Errors
/// Binding the listener, building the runtime or spawning the thread fails. All three happen
/// before this returns, so a taken port is reported here rather than logged later.
pub fn start(addr: SocketAddr, threads: usize, array: ArrayHandle) -> std::io::Result<GrpcServer> {
    start_with(addr, threads, array, Limits::default())
}

/// How the listener is secured: TLS (PEM certificate chain and key), a required token, and
/// JWT authentication with per-channel authorization ([`auth`]).
#[derive(Clone, Default)]
pub struct Security {
    pub tls: Option<tonic::transport::Identity>,
    pub token: Option<String>,
    pub auth: crate::auth::Auth,
}

impl Security {
    /// From the gateway settings; reads the PEM files.
    ///
    /// # Errors
    /// A certificate or key file cannot be read, or they do not make a usable TLS identity.
    pub fn from_config(tls: Option<&crate::config::ServerTls>, token: Option<&str>) -> Result<Security, String> {
        let tls = match tls {
            Some(t) => {
                let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
                let identity = tonic::transport::Identity::from_pem(read(&t.cert_file)?, read(&t.key_file)?);
                // Fail at start-up, not on the first handshake.
                tonic::transport::Server::builder()
                    .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity.clone()))
                    .map_err(|e| format!("unusable gRPC TLS certificate or key: {e}"))?;
                Some(identity)
            }
            None => None,
        };
        Ok(Security { tls, token: token.map(str::to_string), auth: crate::auth::Auth::default() })
    }
}

/// [`start`] with explicit limits.
///
/// # Errors
/// As [`start`].
pub fn start_with(addr: SocketAddr, threads: usize, array: ArrayHandle, limits: Limits) -> std::io::Result<GrpcServer> {
    start_secured(addr, threads, array, limits, Security::default())
}

/// [`start_with`] behind TLS and/or a required token.
///
/// # Errors
/// As [`start`]; also an unusable certificate or key.
pub fn start_secured(addr: SocketAddr, threads: usize, array: ArrayHandle, limits: Limits, security: Security) -> std::io::Result<GrpcServer> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local_addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(threads.max(1)).thread_name("stompgate-grpc-worker").enable_all().build()?;
    let listener = {
        // Registering with the reactor needs the runtime's context.
        let _guard = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new().name("stompgate-grpc".into()).spawn(move || {
        runtime.block_on(serve(listener, array, limits, security, stop_rx));
        // Whatever the grace period abandoned (a stuck handler) must not hold up the join.
        runtime.shutdown_timeout(Duration::from_millis(500));
    })?;
    tracing::info!(%local_addr, "kubemq gRPC API listening");
    Ok(GrpcServer { local_addr, stop_tx: Some(stop_tx), thread: Some(thread) })
}

impl GrpcServer {
    /// The bound address (the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, lets open calls finish for up to 2 s (`SHUTDOWN_GRACE`), and joins the thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("kubemq gRPC thread panicked");
            }
        }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves until `stop_rx` fires (or its sender is dropped), then drains for at most
/// [`SHUTDOWN_GRACE`].
async fn serve(listener: tokio::net::TcpListener, array: ArrayHandle, limits: Limits, security: Security, stop_rx: oneshot::Receiver<()>) {
    let incoming = match tonic::transport::server::TcpIncoming::from_listener(listener, true, None) {
        Ok(incoming) => incoming,
        Err(e) => {
            tracing::error!(error = %e, "kubemq gRPC listener unusable");
            return;
        }
    };
    let svc = pb::kubemq_server::KubemqServer::new(service::KubemqService::new(array, limits, security.auth.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let svc = tonic::service::interceptor::InterceptedService::new(svc, auth::Authenticate { token: security.token.map(Into::into), auth: security.auth });
    let mut builder = tonic::transport::Server::builder();
    if let Some(identity) = security.tls {
        builder = match builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity)) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "kubemq gRPC TLS setup failed");
                return;
            }
        };
    }
    // The stop signal is awaited once, by tonic; `grace_rx` tells the deadline it has started.
    let (grace_tx, grace_rx) = oneshot::channel::<()>();
    let signal = async move {
        let _ = stop_rx.await;
        let _ = grace_tx.send(());
    };
    let server = async {
        if let Err(e) = builder.add_service(svc).serve_with_incoming_shutdown(incoming, signal).await {
            tracing::error!(error = %e, "kubemq gRPC server failed");
        }
    };
    let deadline = async {
        match grace_rx.await {
            Ok(()) => tokio::time::sleep(SHUTDOWN_GRACE).await,
            // The signal future was dropped: the server already returned.
            Err(_) => std::future::pending().await,
        }
    };
    futures_lite::future::or(server, deadline).await;
}
