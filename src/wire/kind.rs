//! `QueuesDownstreamRequestType` values as they travel (the generated enum, as `i32`): the
//! server dispatches on them, the egress's queue consumers send them.
use super::pb::QueuesDownstreamRequestType as T;

pub const GET: i32 = T::Get as i32;
pub const ACK_ALL: i32 = T::AckAll as i32;
pub const ACK_RANGE: i32 = T::AckRange as i32;
pub const NACK_ALL: i32 = T::NAckAll as i32;
pub const NACK_RANGE: i32 = T::NAckRange as i32;
pub const REQUEUE_ALL: i32 = T::ReQueueAll as i32;
pub const REQUEUE_RANGE: i32 = T::ReQueueRange as i32;
pub const ACTIVE_OFFSETS: i32 = T::ActiveOffsets as i32;
pub const TRANSACTION_STATUS: i32 = T::TransactionStatus as i32;
pub const CLOSE_BY_CLIENT: i32 = T::CloseByClient as i32;

/// `StreamRequestType` values of the legacy `StreamQueueMessage` stream, as they travel.
pub mod stream {
    use crate::wire::pb::StreamRequestType as S;

    pub const RECEIVE: i32 = S::ReceiveMessage as i32;
    pub const ACK: i32 = S::AckMessage as i32;
    pub const REJECT: i32 = S::RejectMessage as i32;
    pub const MODIFY_VISIBILITY: i32 = S::ModifyVisibility as i32;
    pub const RESEND: i32 = S::ResendMessage as i32;
    pub const SEND_MODIFIED: i32 = S::SendModifiedMessage as i32;
}
