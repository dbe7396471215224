//! The `rpc` scenario's responder: a native KubeMQ gRPC client (`stompgate::wire::pb`) on a
//! small tokio runtime of its own (one worker thread). It subscribes to the run's Commands or
//! Queries channel with SubscribeToRequests and answers every request at once with
//! SendResponse: `Executed`, the request's body echoed, the time. Each answer is its own task,
//! so answers overlap on the one HTTP/2 connection as the requests do.

use std::error::Error;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stompgate::wire::pb;
use stompgate::wire::pb::kubemq_client::KubemqClient;
use tonic::transport::{Channel, Endpoint};

use crate::conn::LoadError;
use crate::rpc::Kind;

pub const CLIENT_ID: &str = "stompgate-load-responder";
/// Connecting and subscribing, each.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

struct State {
    /// Set before the runtime is shut down: the stream ending then is no failure.
    stopping: AtomicBool,
    /// The first thing that went wrong (stream ended or broke, a SendResponse failed).
    failure: Mutex<Option<String>>,
}

impl State {
    fn fail(&self, what: String) {
        if self.stopping.load(Ordering::Relaxed) {
            return;
        }
        let mut f = self.failure.lock().expect("responder state lock");
        if f.is_none() {
            *f = Some(what);
        }
    }
}

/// A running responder; stopped when dropped.
pub struct Responder {
    rt: Option<tokio::runtime::Runtime>,
    state: Arc<State>,
}

impl Responder {
    /// Connects to the KubeMQ gRPC API at `grpc` (HOST:PORT), subscribes to `channel`'s
    /// requests of `kind`, and starts answering. The subscription may reach the array a
    /// little after this returns: the caller probes until an answer comes back.
    ///
    /// # Errors
    /// Connect failure, or SubscribeToRequests refused or unanswered within 10 s.
    pub fn start(grpc: &str, kind: Kind, channel: &str) -> Result<Responder, LoadError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rpc-responder")
            .enable_all()
            .build()
            .map_err(|e| LoadError::io("starting the responder's tokio runtime", e))?;
        let endpoint = Endpoint::from_shared(format!("http://{grpc}"))
            .map_err(|e| LoadError::Setup(format!("--grpc {grpc}: {}", chain(&e))))?
            .connect_timeout(SETUP_TIMEOUT)
            .tcp_nodelay(true);
        let sub = pb::Subscribe { subscribe_type_data: kind.subscribe_type(), client_id: CLIENT_ID.into(), channel: channel.into(), ..Default::default() };
        let context = format!("SubscribeToRequests on {grpc}");
        let (client, stream) = rt.block_on(async {
            let connection = endpoint.connect().await.map_err(|e| LoadError::Connect { addr: grpc.to_owned(), source: io::Error::other(chain(&e)) })?;
            let mut client = KubemqClient::new(connection)
                .max_decoding_message_size(stompgate::wire::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(stompgate::wire::MAX_MESSAGE_BYTES);
            let stream = match tokio::time::timeout(SETUP_TIMEOUT, client.subscribe_to_requests(sub)).await {
                Ok(Ok(r)) => r.into_inner(),
                Ok(Err(status)) => return Err(LoadError::Server { context, text: status.to_string() }),
                Err(_) => return Err(LoadError::Protocol { context, text: format!("no answer within {SETUP_TIMEOUT:?}") }),
            };
            Ok((client, stream))
        })?;
        let state = Arc::new(State { stopping: AtomicBool::new(false), failure: Mutex::new(None) });
        rt.spawn(serve(client, stream, Arc::clone(&state)));
        Ok(Responder { rt: Some(rt), state })
    }

    pub fn failed(&self) -> bool {
        self.state.failure.lock().expect("responder state lock").is_some()
    }

    pub fn failure(&self) -> Option<String> {
        self.state.failure.lock().expect("responder state lock").clone()
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.state.stopping.store(true, Ordering::Relaxed);
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(500));
        }
    }
}

/// Answers every request of `stream` until it ends.
async fn serve(client: KubemqClient<Channel>, mut stream: tonic::Streaming<pb::Request>, state: Arc<State>) {
    loop {
        match stream.message().await {
            Ok(Some(req)) => {
                let response = pb::Response {
                    client_id: CLIENT_ID.into(),
                    request_id: req.request_id,
                    reply_channel: req.reply_channel,
                    body: req.body,
                    timestamp: unix_ns(),
                    executed: true,
                    ..Default::default()
                };
                let mut client = client.clone();
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    if let Err(status) = client.send_response(response).await {
                        state.fail(format!("SendResponse: {status}"));
                    }
                });
            }
            Ok(None) => {
                state.fail("the server ended the SubscribeToRequests stream".into());
                return;
            }
            Err(status) => {
                state.fail(format!("SubscribeToRequests stream: {status}"));
                return;
            }
        }
    }
}

fn unix_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// An error and its sources on one line (tonic's own text is only "transport error"); a
/// source that repeats its parent's text is left out.
fn chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut last = s.clone();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if text != last {
            s.push_str(": ");
            s.push_str(&text);
        }
        last = text;
        source = inner.source();
    }
    s
}
