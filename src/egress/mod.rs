//! Remote array mode (`--array grpc://HOST:PORT`): one egress thread per core.
//!
//! Each pinned core gets a dedicated OS thread (`stompgate-egress-<cpu>`, pinned to the same
//! CPU) running a current-thread tokio runtime that owns the core's own HTTP/2 connection to
//! the array. The core hands it array work (`Publish`, `QueueSend`, `Subscribe`,
//! `Unsubscribe`, `QueueSettle`, `QueuePrefetch`, `RpcRequest`, `Barrier`) over a lock-free tokio channel and
//! never waits on it; the egress answers with the same `CoreMsg`s the embedded array produces
//! (`Deliver`, `QueueDeliver`, `RpcReply`, `Done`, `Failed`) through the core's array-API
//! channel. So sessions and connections behave identically in both modes.
//!
//! | Work | Over the array's gRPC API |
//! |---|---|
//! | events / events-store publish | one long-lived `SendEventsStream` per core ([`publish`]) |
//! | queue SEND | one long-lived `QueuesUpstream` per core; RECEIPT only after the array's result |
//! | events / events-store SUBSCRIBE | `SubscribeToEvents`; a core's subscriptions to the same events channel and group share one ([`subscribe`]) |
//! | queue SUBSCRIBE, ACK, NACK | `QueuesDownstream` per subscription: Get up to the free prefetch, AckRange / NAckRange; a receipted ACK/NACK is confirmed by an ActiveOffsets reply after it ([`consume`]) |
//! | command / query | `SendRequest` with the effective timeout ([`rpc`]) |
//!
//! Failure: every stream reconnects by itself with capped exponential backoff and jitter
//! ([`backoff`]); subscriptions are re-established (an events-store one resumes after the last
//! sequence it delivered); unconfirmed queue SENDs and store publishes are sent again, and
//! after [`GIVE_UP`] without confirmation a receipted one fails with ERROR `internal error`.
//! Queue messages a consumer held when its stream broke return to the queue on the array's
//! side; their late ACKs are ignored.
pub mod backlog;
pub mod backoff;
pub mod consume;
pub mod publish;
pub mod rpc;
pub mod subscribe;

use crate::config::{Config, RemoteArray};
use crate::mesh::handle::ArrayHandle;
use crate::mesh::msg::{CoreId, CoreMsg, SettleArgs, SubscribeArgs, Ticket};
use crate::wire::pb::kubemq_client::KubemqClient;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// How long an unconfirmed queue SEND or store publish is retried before it fails.
pub const GIVE_UP: Duration = Duration::from_secs(60);

/// The array client every egress task uses (cheap to clone: one shared HTTP/2 connection).
pub type Client = KubemqClient<InterceptedService<Channel, Auth>>;

/// Adds KubeMQ's `authorization` metadata (the raw token, no `Bearer`) to every call.
#[derive(Clone)]
pub struct Auth(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            req.metadata_mut().insert("authorization", token.clone());
        }
        Ok(req)
    }
}

/// The core's end: forwards array work to the egress thread. Dropping it stops the thread.
pub struct Link {
    tx: mpsc::UnboundedSender<CoreMsg>,
    backlog: backlog::Backlog,
}

impl Link {
    /// Never blocks. A stopped egress (shutdown) drops the work.
    pub fn forward(&self, msg: CoreMsg) {
        self.backlog.add(backlog::Backlog::weight(&msg));
        let _ = self.tx.send(msg);
    }

    /// Whether this core's readers must pause until the egress catches up (see [`backlog`]).
    pub fn backed_up(&self) -> bool {
        self.backlog.over()
    }
}

/// Whether the array refused this gateway's credentials (a missing or wrong `--array-token`).
/// Work waiting on such a stream fails at once instead of after [`GIVE_UP`]: retrying cannot
/// help until the operator fixes the token, and a client should not hang meanwhile.
pub fn refused(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied)
}

/// Whether a message is work for the array (as opposed to a delivery or confirmation coming
/// back from it).
pub fn is_array_work(msg: &CoreMsg) -> bool {
    matches!(
        msg,
        CoreMsg::Publish { .. }
            | CoreMsg::QueueSend { .. }
            | CoreMsg::Subscribe(_)
            | CoreMsg::Unsubscribe { .. }
            | CoreMsg::QueueSettle(_)
            | CoreMsg::QueuePrefetch { .. }
            | CoreMsg::RpcRequest(_)
            | CoreMsg::Barrier(_)
    )
}

/// Builds the lazy connection to the array: it connects on first use and reconnects by itself
/// after a failure.
pub fn client(remote: &RemoteArray) -> Result<Client, String> {
    let mut endpoint = Endpoint::from_shared(remote.uri())
        .map_err(|e| format!("invalid array address {}: {e}", remote.authority))?
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    if remote.tls {
        let mut tls = ClientTlsConfig::new().with_webpki_roots();
        if let Some(path) = &remote.ca_file {
            let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| format!("TLS setup for the array failed: {e}"))?;
    }
    let token = match &remote.token {
        Some(t) => Some(t.parse().map_err(|_| "the array token is not valid header text".to_string())?),
        None => None,
    };
    let channel = endpoint.connect_lazy();
    Ok(KubemqClient::with_interceptor(channel, Auth(token))
        .max_decoding_message_size(crate::wire::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(crate::wire::MAX_MESSAGE_BYTES))
}

/// Starts core `core`'s egress thread, pinned to `cpu`. Returns once the thread has its
/// runtime and client (or with the reason it could not build them).
pub fn spawn(core: CoreId, cpu: usize, remote: &RemoteArray, cfg: Arc<Config>, back: ArrayHandle) -> Result<Link, String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let backlog = backlog::Backlog::default();
    let worker_backlog = backlog.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let remote = remote.clone();
    std::thread::Builder::new()
        .name(format!("stompgate-egress-{cpu}"))
        .spawn(move || {
            core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("cannot start the egress runtime: {e}")));
                    return;
                }
            };
            // The lazy connection registers with the runtime that creates it.
            let client = {
                let _guard = runtime.enter();
                client(&remote)
            };
            let client = match client {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, Worker::new(core, client, back, cfg, worker_backlog).run(rx));
        })
        .map_err(|e| format!("cannot start the egress thread: {e}"))?;
    ready_rx.recv().map_err(|_| "the egress thread died while starting".to_string())??;
    Ok(Link { tx, backlog })
}

/// The egress of one core: routes each piece of array work to the task that owns it.
pub struct Worker {
    pub core: CoreId,
    pub client: Client,
    pub back: ArrayHandle,
    pub cfg: Arc<Config>,
    /// This gateway's ClientID towards the array (`stompgate-<host>-<core>`).
    pub client_id: String,
    pub metrics: crate::telemetry::EgressMetrics,
    /// Confirms deliveries handed to the core, to pace subscription streams (see [`subscribe`]).
    pub confirmer: std::sync::Arc<crate::mesh::confirm::Confirmer>,
    /// The core's count of publish and queue-SEND bytes not yet out of this egress.
    backlog: backlog::Backlog,
    publisher: publish::Publisher,
    subscriptions: subscribe::Subscriptions,
    consumers: consume::Consumers,
}

impl Worker {
    fn new(core: CoreId, client: Client, back: ArrayHandle, cfg: Arc<Config>, backlog: backlog::Backlog) -> Rc<Worker> {
        let host = crate::wire::host_name().unwrap_or_else(|| "gateway".into());
        Rc::new_cyclic(|me| Worker {
            core,
            client_id: format!("stompgate-{host}-{core}"),
            metrics: crate::telemetry::EgressMetrics::new(core),
            confirmer: crate::mesh::confirm::Confirmer::attach(&back, [core]),
            publisher: publish::Publisher::new(me.clone()),
            subscriptions: subscribe::Subscriptions::new(me.clone()),
            consumers: consume::Consumers::new(me.clone()),
            client,
            back,
            cfg,
            backlog,
        })
    }

    async fn run(self: Rc<Self>, mut rx: mpsc::UnboundedReceiver<CoreMsg>) {
        tracing::info!(core = %self.core, "egress started");
        while let Some(msg) = rx.recv().await {
            self.handle(msg);
        }
        // The core stopped: dropping every task closes its streams, and the array takes back
        // what this core's consumers held.
        self.subscriptions.stop_all();
        self.consumers.stop_all();
        tracing::info!(core = %self.core, "egress stopped");
    }

    fn handle(self: &Rc<Self>, msg: CoreMsg) {
        // The bytes the core counted in for this message, given back when its work ends.
        let held = self.backlog.hold(backlog::Backlog::weight(&msg));
        match msg {
            CoreMsg::Publish { pattern, msg, done } => self.publisher.publish(pattern, msg, done, held),
            CoreMsg::QueueSend { msg, meta: _, done } => self.publisher.queue_send(msg, done, held),
            CoreMsg::Subscribe(args) => match *args {
                SubscribeArgs { pattern: crate::model::Pattern::Queues, channel, sub, prefetch, done, .. } => {
                    // Confirmed by the consumer once the array holds its first Get.
                    self.consumers.subscribe(channel, sub, prefetch, done);
                }
                SubscribeArgs { pattern, channel, wildcard, sub, group, start, done, .. } => {
                    self.subscriptions.subscribe(pattern, channel, wildcard, sub, group, start, done)
                }
            },
            CoreMsg::Unsubscribe { pattern: crate::model::Pattern::Queues, sub, done, .. } => {
                let unheld = self.consumers.unsubscribe(sub, done);
                self.done(unheld);
            }
            CoreMsg::Unsubscribe { pattern, channel, sub, done, .. } => {
                self.subscriptions.unsubscribe(pattern, &channel, sub);
                self.done(done);
            }
            CoreMsg::QueueSettle(args) => {
                let SettleArgs { sub, tags, action, done, .. } = *args;
                // Confirmed by the consumer once the array applied it (see [`consume`]).
                let unheld = self.consumers.settle(sub, tags, action, done);
                self.done(unheld);
            }
            CoreMsg::QueuePrefetch { sub, prefetch, .. } => self.consumers.set_prefetch(sub, prefetch),
            CoreMsg::RpcRequest(req) => rpc::request(Rc::clone(self), *req),
            // Work before the barrier has been handed to its tasks in order; receipts for
            // confirmed work are owed separately, so the barrier itself is done.
            CoreMsg::Barrier(t) => self.done(Some(t)),
            _ => {}
        }
    }

    /// Sends a confirmation back to the core.
    pub fn done(&self, ticket: Option<Ticket>) {
        if let Some(ticket) = ticket {
            self.back.send(ticket.core, CoreMsg::Done { ticket, more: 0 });
        }
    }

    /// The array refused a queue send at the queue's depth limit.
    pub fn queue_full(&self, ticket: Option<Ticket>) {
        if let Some(ticket) = ticket {
            self.back.send(ticket.core, CoreMsg::Refused { ticket, why: crate::mesh::msg::Refusal::QueueFull });
        }
    }

    pub fn failed(&self, ticket: Option<Ticket>) {
        self.metrics.failed.increment(1);
        if let Some(ticket) = ticket {
            self.back.send(ticket.core, CoreMsg::Failed { ticket });
        }
    }
}
