//! `StreamQueueMessage`: KubeMQ's legacy single-message transactional queue stream, still
//! what kubemq-js's `QueuesClient.transaction()` uses (kubemq-grpc.md §7).
//!
//! One message at a time per stream: `ReceiveMessage` reserves the next message of a queue
//! (a pull in `Reserve` mode under the stream's own holder) and starts its visibility timer;
//! `ModifyVisibility` restarts the timer; `AckMessage` (with the message's `RefSequence`)
//! removes it, `RejectMessage` returns it to the queue (counting toward its receive limit),
//! `ResendMessage` moves it to another queue and `SendModifiedMessage` replaces it with a new
//! message — each of those four ends the transaction and the stream. A timer that expires
//! returns the message to the queue (as a reject) and answers error 129; a receive that finds
//! nothing within `WaitTimeSeconds` answers error 138 and the stream stays usable. When the
//! stream ends otherwise, the owner takes back what it still held (to the head of the queue).
//! With `--authz-file`, a receive takes Read on its queue, a resend or modified send Write on
//! the target.
use super::auth::{StreamAuthz, ACCESS_DENIED};
use super::bridge::{Bridge, HOLDER_CORE};
use super::stream::ChannelStream;
use super::{pb, queues, validate, BoxStream};
use crate::auth::Access;
use crate::mesh::msg::{CoreMsg, Mailbox, PullMode, PullRequest, PullResult, Settle, SettleArgs, SubNo, SubRef};
use crate::model::{Channel, Pattern};
use crate::wire::convert;
use crate::wire::kind::stream as kind;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Streaming;

/// `VisibilitySeconds` 0 on a receive: KubeMQ's default visibility.
const DEFAULT_VISIBILITY: Duration = Duration::from_secs(60);
/// The longest visibility KubeMQ allows (12 hours).
const MAX_VISIBILITY_SECONDS: i32 = 43_200;
/// `WaitTimeSeconds` 0 on a receive: KubeMQ's default wait.
const DEFAULT_WAIT: Duration = Duration::from_secs(1);

/// The message this stream holds.
struct Active {
    channel: Channel,
    seq: u64,
    tag: u64,
    visible_until: Instant,
}

/// What a handled request leaves the stream to do.
enum Next {
    Continue,
    End,
}

struct QueueStream {
    b: Arc<Bridge>,
    holder: SubRef,
    out: mpsc::Sender<pb::StreamQueueMessagesResponse>,
    answers: Mailbox<PullResult>,
    /// A receive sent to the owner and not answered yet: its RequestID, queue and visibility.
    receiving: Option<(String, Channel, Duration)>,
    active: Option<Active>,
    /// The queues this stream reserved from (the owners release the holder when it ends).
    channels: Vec<Channel>,
    authz: StreamAuthz,
}

fn reply(request_id: &str, kind: i32) -> pb::StreamQueueMessagesResponse {
    pb::StreamQueueMessagesResponse { request_id: request_id.to_string(), stream_request_type_data: kind, ..Default::default() }
}

fn error(request_id: &str, kind: i32, error: impl Into<String>) -> pb::StreamQueueMessagesResponse {
    pb::StreamQueueMessagesResponse { is_error: true, error: error.into(), ..reply(request_id, kind) }
}

fn visibility_of(seconds: i32, zero: Option<Duration>) -> Result<Duration, String> {
    match (seconds, zero) {
        (0, Some(default)) => Ok(default),
        (s, _) if (1..=MAX_VISIBILITY_SECONDS).contains(&s) => Ok(Duration::from_secs(s as u64)),
        _ => Err(format!("Error 127: visibility seconds must be between 1 and {MAX_VISIBILITY_SECONDS}")),
    }
}

impl QueueStream {
    async fn send(&self, r: pb::StreamQueueMessagesResponse) {
        let _ = self.out.send(r).await;
    }

    fn receive(&mut self, r: &pb::StreamQueueMessagesRequest) -> Option<pb::StreamQueueMessagesResponse> {
        let kind = kind::RECEIVE;
        if self.active.is_some() || self.receiving.is_some() {
            return Some(error(&r.request_id, kind, "Error 128: the stream already has an active receive"));
        }
        let checked = validate::client_id(&r.client_id).and_then(|()| validate::queue(&r.channel)).map_err(|e| e.message());
        let visibility = checked.and_then(|()| visibility_of(r.visibility_seconds, Some(DEFAULT_VISIBILITY)));
        let wait = match r.wait_time_seconds {
            0 => Ok(DEFAULT_WAIT),
            s if (1..=validate::MAX_WAIT_SECONDS).contains(&s) => Ok(Duration::from_secs(s as u64)),
            _ => Err(validate::BAD_WAIT.message()),
        };
        let (visibility, wait) = match (visibility, wait) {
            (Ok(v), Ok(w)) => (v, w),
            (Err(e), _) | (_, Err(e)) => return Some(error(&r.request_id, kind, e)),
        };
        if !self.authz.allows(&r.client_id, Pattern::Queues, &r.channel, Access::Read) {
            return Some(error(&r.request_id, kind, ACCESS_DENIED));
        }
        let channel = convert::channel_of(&r.channel);
        if !self.channels.contains(&channel) {
            self.channels.push(channel.clone());
        }
        let owner = self.b.owner_of(Pattern::Queues, &channel);
        let pull = PullRequest { channel: channel.clone(), holder: self.holder, max: 1, wait, mode: PullMode::Reserve, token: 0, reply: self.answers.clone() };
        if !self.b.array.send(owner, CoreMsg::QueuePull(Box::new(pull))) {
            return Some(error(&r.request_id, kind, "Error 405: the array is shutting down"));
        }
        self.receiving = Some((r.request_id.clone(), channel, visibility));
        None
    }

    /// The owner's answer to the receive.
    fn got(&mut self, result: PullResult) -> Option<pb::StreamQueueMessagesResponse> {
        let (request_id, channel, visibility) = self.receiving.take()?;
        let Some(m) = result.messages.first() else {
            return Some(error(&request_id, kind::RECEIVE, "Error 138: no new message in queue, wait time expired"));
        };
        let message = convert::queue_message(m);
        self.active = Some(Active { channel, seq: m.seq, tag: m.tag, visible_until: Instant::now() + visibility });
        Some(pb::StreamQueueMessagesResponse { message: Some(message), ..reply(&request_id, kind::RECEIVE) })
    }

    /// Settles the active message and forgets it.
    fn settle(&mut self, action: Settle) {
        if let Some(a) = self.active.take() {
            let owner = self.b.owner_of(Pattern::Queues, &a.channel);
            self.b
                .array
                .send(owner, CoreMsg::QueueSettle(Box::new(SettleArgs { channel: a.channel, sub: self.holder, tags: vec![a.tag], action, done: None })));
        }
    }

    async fn handle(&mut self, r: pb::StreamQueueMessagesRequest) -> Next {
        let kind = r.stream_request_type_data;
        if kind == kind::RECEIVE {
            if let Some(answer) = self.receive(&r) {
                self.send(answer).await;
            }
            return Next::Continue;
        }
        if !(kind::ACK..=kind::SEND_MODIFIED).contains(&kind) {
            self.send(error(&r.request_id, kind, format!("Error 132: invalid stream request type {kind}"))).await;
            return Next::Continue;
        }
        let Some(active) = &self.active else {
            let what = match kind {
                kind::ACK => "Error 124: no active message to ack",
                kind::REJECT => "Error 137: no active message to reject",
                kind::MODIFY_VISIBILITY => "Error 124: no active message to modify its visibility",
                _ => "Error 126: no active message to resend",
            };
            self.send(error(&r.request_id, kind, what)).await;
            return Next::Continue;
        };
        match kind {
            kind::ACK => {
                if r.ref_sequence == 0 {
                    self.send(error(&r.request_id, kind, "Error 125: ack sequence must be positive")).await;
                    return Next::Continue;
                }
                if r.ref_sequence != active.seq {
                    self.send(error(&r.request_id, kind, format!("Error 123: sequence {} is not the active message ({})", r.ref_sequence, active.seq))).await;
                    return Next::Continue;
                }
                self.settle(Settle::Ack);
            }
            kind::REJECT => self.settle(Settle::Nack),
            kind::MODIFY_VISIBILITY => {
                match visibility_of(r.visibility_seconds, None) {
                    Ok(v) => {
                        if let Some(a) = &mut self.active {
                            a.visible_until = Instant::now() + v;
                        }
                        self.send(reply(&r.request_id, kind)).await;
                    }
                    Err(e) => self.send(error(&r.request_id, kind, e)).await,
                }
                return Next::Continue;
            }
            kind::RESEND => {
                if let Err(e) = validate::queue(&r.channel) {
                    self.send(error(&r.request_id, kind, e.message())).await;
                    return Next::Continue;
                }
                if !self.authz.allows(&r.client_id, Pattern::Queues, &r.channel, Access::Write) {
                    self.send(error(&r.request_id, kind, ACCESS_DENIED)).await;
                    return Next::Continue;
                }
                self.settle(Settle::Requeue(Box::new(convert::channel_of(&r.channel))));
            }
            _ => {
                let Some(modified) = r.modified_message.clone() else {
                    self.send(error(&r.request_id, kind, "Error 131: no modified message to send")).await;
                    return Next::Continue;
                };
                if !self.authz.allows(&modified.client_id, Pattern::Queues, &modified.channel, Access::Write) {
                    self.send(error(&r.request_id, kind, ACCESS_DENIED)).await;
                    return Next::Continue;
                }
                let sent = queues::send_one(&self.b, modified).await;
                if sent.is_error {
                    // The original stays active: nothing replaced it.
                    self.send(error(&r.request_id, kind, sent.error)).await;
                    return Next::Continue;
                }
                self.settle(Settle::Ack);
            }
        }
        self.send(reply(&r.request_id, kind)).await;
        Next::End
    }

    /// The visibility timer of the active message ran out: back to the queue, error 129.
    async fn expired(&mut self) {
        self.settle(Settle::Nack);
        self.send(error("", kind::RECEIVE, "Error 129: visibility timer expired, message returned to the queue")).await;
    }

    /// The stream is over: the owners take back what the holder still has reserved.
    fn release(&self) {
        self.b.release_holder(self.holder, &self.channels);
    }
}

/// `StreamQueueMessage` (see the module doc).
pub fn stream(b: Arc<Bridge>, mut inbound: Streaming<pb::StreamQueueMessagesRequest>, authz: StreamAuthz) -> BoxStream<pb::StreamQueueMessagesResponse> {
    let (out, rx) = mpsc::channel(16);
    let (answers, answered) = Mailbox::new();
    let holder = SubRef { core: HOLDER_CORE, conn: b.new_conn(), sub: SubNo(0) };
    let mut qs = QueueStream { b, holder, out, answers, receiving: None, active: None, channels: Vec::new(), authz };
    tokio::spawn(async move {
        loop {
            let visible_until = qs.active.as_ref().map(|a| a.visible_until);
            tokio::select! {
                next = inbound.message() => match next {
                    Ok(Some(r)) => {
                        if let Next::End = qs.handle(r).await {
                            break;
                        }
                    }
                    _ => break,
                },
                Ok(result) = answered.recv_async() => {
                    if let Some(answer) = qs.got(result) {
                        qs.send(answer).await;
                    }
                }
                () = async { tokio::time::sleep_until(visible_until.unwrap_or_else(Instant::now)).await }, if visible_until.is_some() => {
                    qs.expired().await;
                    break;
                }
                () = qs.out.closed() => break,
            }
        }
        qs.release();
    });
    Box::pin(ChannelStream::new(rx, Ok, ()))
}
