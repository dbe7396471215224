//! The AMQP 1.0 front-end (issue 16), first slice: a second session ring on the same array
//! interface as STOMP. Pure pieces: the address mapping ([`address`], seed 002), the closed
//! error set ([`error`], connector-extra.md §3.3), the bounded frame layer ([`frame`]), the
//! message mapping ([`mapping`]) and the connection state machine ([`machine`]); I/O and the
//! core's [`crate::engine::endpoint::Endpoint`] in [`serve`], accepted on `--amqp-addr`.
//! What works and what does not yet is listed in `machine`'s doc and README's "AMQP 1.0".
pub mod address;
pub mod durable;
pub mod envelope;
pub mod error;
pub mod frame;
pub mod machine;
pub mod mapping;
pub mod selector;
pub mod serve;

pub use address::{
    authz_resource, check_amqp_channel, judge_attach, route_to, AddressError, Attach, ChannelFault, DynamicAddress, LinkPlan, Node, NodeHint, PeerRole,
    Permission, ServerRole, DYNAMIC_PREFIX, MAX_CHANNEL_LEN,
};
pub use error::AmqpError;
