//! What a core delivers to: one client connection of any protocol front-end (STOMP today; AMQP
//! and WebSocket use the same trait). The core calls these on its own thread; an endpoint
//! queues frames for its writer and never blocks.
use super::Core;
use crate::mesh::msg::{CoreId, RpcOutcome, SubNo, Ticket};
use crate::model::{Message, Pattern};
use bytes::Bytes;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// What became of one Events / Events-Store delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// In the write queue.
    Queued,
    /// Behind a full buffer (see [`crate::delivery`]): the endpoint owes the core
    /// [`Core::confirm_parked`] for its ticket once it is written or dropped.
    Parked,
    /// Lost for this subscriber (counted): its buffer stayed full.
    Dropped,
    /// No such subscription (any more), or the connection is closing.
    Gone,
}

pub trait Endpoint {
    /// An Events / Events-Store message for subscription `sub`.
    fn deliver_event(&self, core: &Rc<Core>, pattern: Pattern, msg: &Arc<Message>, sub: SubNo, ticket: Option<Ticket>) -> Delivery;
    /// A queue message for subscription `sub`, delivered by `owner` under `tag`, its
    /// `receive_count`-th delivery (1 = first). False when the subscription is gone: the core
    /// gives the message back to its queue.
    fn deliver_queue(&self, core: &Rc<Core>, msg: &Arc<Message>, sub: SubNo, owner: CoreId, tag: u64, receive_count: u32) -> bool;
    /// The outcome of a Commands/Queries request, for reply subscription `sub`.
    fn deliver_rpc_reply(&self, core: &Rc<Core>, sub: SubNo, pattern: Pattern, correlation_id: Option<Bytes>, outcome: RpcOutcome);
    /// The operation submitted with completion token `token` took effect.
    fn completed(&self, core: &Rc<Core>, token: u64);
    /// The operation behind `token` failed for good.
    fn failed(&self, core: &Rc<Core>, token: u64);
    /// The SEND behind `token` was refused (a queue at its depth limit, the store full).
    fn refused(&self, core: &Rc<Core>, token: u64, why: crate::mesh::msg::Refusal);
    /// Periodic duties (heart-beats, the slow-subscriber rule), every housekeeping tick.
    fn tick(&self, core: &Rc<Core>, now: Instant);
    /// The server is stopping: say so to the client and close.
    fn shut_down(&self, core: &Rc<Core>);
    /// Close at once, writing nothing more.
    fn kill(&self);
    /// This endpoint as the operator view shows it (`/api/stomp/connections`); `None` for
    /// endpoints that are not (yet) a connected STOMP session.
    fn view(&self) -> Option<crate::mesh::msg::ConnectionView> {
        None
    }
    /// This endpoint as `/api/amqp10/connections` shows it; `None` for endpoints that are not
    /// an AMQP 1.0 connection past its OPEN.
    fn amqp_view(&self) -> Option<crate::mesh::msg::AmqpConnectionView> {
        None
    }
}
