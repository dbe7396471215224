//! The AMQP 1.0 front-end (issue 16), in progress. So far only its pure pieces: how a terminus
//! address maps to a KubeMQ (pattern, channel) and which server link role results (seed 002,
//! [`address`]), and the closed set of error conditions ([`error`], connector-extra.md §3.3).
//! No I/O, no runtime; nothing else in the crate depends on this module yet.
pub mod address;
pub mod frame;
pub mod error;

pub use address::{
    authz_resource, check_amqp_channel, judge_attach, parse_default_pattern, route_to, AddressError, Attach, ChannelFault, DynamicAddress, LinkPlan, Node,
    NodeHint, PeerRole, Permission, ServerRole, DYNAMIC_PREFIX, MAX_CHANNEL_LEN,
};
pub use error::AmqpError;
