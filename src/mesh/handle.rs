//! The array API for code outside the cores (the gRPC server, tests): a cloneable handle that
//! sends `CoreMsg`s into any core from any thread.
//!
//! Why flume here and not the mesh: mesh rings connect executors only. A flume channel's async
//! receiver works inside glommio, and a send from a foreign thread wakes the core through its
//! waker (glommio turns foreign wakes into an eventfd write). This path carries gRPC traffic,
//! never the STOMP hot path, so flume's short internal lock is acceptable.
use super::msg::{CoreId, CoreMsg, Mailbox, RpcOutcome, RpcRequest};
use crate::model::{Channel, Pattern};
use bytes::Bytes;

#[derive(Clone)]
pub struct ArrayHandle {
    txs: Vec<flume::Sender<CoreMsg>>,
}

impl ArrayHandle {
    pub(crate) fn new(txs: Vec<flume::Sender<CoreMsg>>) -> Self {
        ArrayHandle { txs }
    }

    pub fn cores(&self) -> usize {
        self.txs.len()
    }

    /// The core that owns (pattern, channel).
    pub fn owner_of(&self, pattern: Pattern, channel: &Channel) -> CoreId {
        super::topology::owner_of(pattern, channel, self.txs.len())
    }

    /// Sends to one core. False if that core has stopped.
    pub fn send(&self, core: CoreId, msg: CoreMsg) -> bool {
        self.txs.get(core.index()).is_some_and(|tx| tx.send(msg).is_ok())
    }

    /// Attaches a responder to a Commands/Queries channel.
    pub fn register_responder(&self, pattern: Pattern, channel: Channel, responder_id: u64, group: Option<Bytes>, requests: Mailbox<RpcRequest>) -> bool {
        let owner = self.owner_of(pattern, &channel);
        self.send(owner, CoreMsg::RegisterResponder { pattern, channel, responder_id, group, requests })
    }

    pub fn unregister_responder(&self, pattern: Pattern, channel: Channel, responder_id: u64) -> bool {
        let owner = self.owner_of(pattern, &channel);
        self.send(owner, CoreMsg::UnregisterResponder { pattern, channel, responder_id })
    }

    /// A responder's answer to `request_id`.
    pub fn respond(&self, pattern: Pattern, channel: Channel, request_id: Bytes, outcome: RpcOutcome) -> bool {
        let owner = self.owner_of(pattern, &channel);
        self.send(owner, CoreMsg::RpcResponse { pattern, channel, request_id, outcome: Box::new(outcome), amqp: false })
    }
}
