//! AMQP terminus address → KubeMQ (pattern, channel), and the server link role that results
//! (seed 002, "Address Mapping"). Pure functions; the front-end calls [`judge_attach`] once per
//! ATTACH and [`route_to`] once per message on an anonymous (null-target) link.
//!
//! The rules, in the order they apply (each names the seed section it comes from):
//! 1. *Address grammar*: at most one leading `/` is stripped; a null or empty address is not an
//!    error in itself (dynamic terminus → mint a node; peer sender → anonymous terminus).
//! 2. *Longest-prefix discipline*: the prefixes, each with its trailing `/`, are tried in the
//!    seed's fixed order `events-store/`, `queues/`, `events/`, `commands/`, `queries/`,
//!    `responses/`. No match and a `/` left → unknown prefix → `amqp:not-found`.
//! 3. *Bare address* (no `/`): the JMS node-capability hint picks the pattern (`queue` → queues,
//!    `topic` → events), else the configured DefaultPattern.
//! 4. *Channel validation*: [`check_amqp_channel`] → `amqp:not-found`. The `responses/` token is
//!    opaque: only an empty one is refused (*Special rows*, "Responses token").
//! 5. *Server role and authorization*: the server role is the inverse of the peer's; a peer
//!    receiver needs Read, a peer sender Write, `responses/` and dynamic nodes nothing, and an
//!    anonymous sender a Write per message. A receiver on `responses/` → `amqp:not-allowed`.
//!
//! Where AMQP differs from the STOMP router (`route::destination`), by the seed: `*` and `>` are
//! refused in every channel, also on an events consume link (no wildcard subscriptions); `;` and
//! `:` are refused; the channel is capped at 255 bytes; the channel is the text after the prefix
//! as is (no `/` → `.` rewriting, so `queues/a/b` is channel `a/b`); and the DefaultPattern
//! values are KubeMQ's AMQP set (queues, events, events-store, commands, queries; default
//! queues, §3.1), not STOMP's (events, queues, store, none): `Pattern::from_amqp_setting`,
//! which config uses to refuse anything else at start-up.
//!
//! Open points, decided here and not by the seed: its grammar says `channel = 1*255 VCHAR`,
//! but its validation table (which the code follows) refuses only the six listed faults, so
//! non-ASCII and control characters pass as they do on STOMP; and a dynamic node's address is
//! recognised only in a message's `to` (where the seed says so), while a fixed ATTACH to a bare
//! `_amqp10.tmp.…` address is an ordinary bare channel.

use super::error::AmqpError;
use crate::model::{Channel, Pattern};
use crate::route::{check_channel, ChannelError};
use bytes::Bytes;
use std::fmt;
use std::str::FromStr;

/// The longest channel the connector accepts, in bytes (seed 002, *Channel validation*).
pub const MAX_CHANNEL_LEN: usize = 255;

/// The prefix of every dynamic node's address: `_amqp10.tmp.<conn>.<uuid>` (connector-extra.md §3.6).
pub const DYNAMIC_PREFIX: &str = "_amqp10.tmp.";

/// The peer's role on the link, as its ATTACH states it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerRole {
    /// The peer writes; the server reads the ATTACH's target.
    #[default]
    Sender,
    /// The peer reads; the server reads the ATTACH's source.
    Receiver,
}

/// The server's end of the link: always the inverse of the peer's (seed 002, master table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerRole {
    Sender,
    Receiver,
}

impl PeerRole {
    pub fn server_role(self) -> ServerRole {
        match self {
            PeerRole::Sender => ServerRole::Receiver,
            PeerRole::Receiver => ServerRole::Sender,
        }
    }
}

/// A JMS node-capability hint on the terminus (the `capabilities` symbols Qpid JMS sends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHint {
    /// `queue` → queues.
    Queue,
    /// `topic` → events.
    Topic,
}

impl NodeHint {
    /// The first `queue` or `topic` among a terminus' capability symbols (exact match; the seed
    /// names only these two, so e.g. `temporary-queue` is no hint).
    pub fn from_capabilities<'a>(capabilities: impl IntoIterator<Item = &'a str>) -> Option<NodeHint> {
        capabilities.into_iter().find_map(|c| match c {
            "queue" => Some(NodeHint::Queue),
            "topic" => Some(NodeHint::Topic),
            _ => None,
        })
    }

    fn pattern(self) -> Pattern {
        match self {
            NodeHint::Queue => Pattern::Queues,
            NodeHint::Topic => Pattern::Events,
        }
    }
}

/// What the server reads from one ATTACH to judge it: the peer's role and the terminus on the
/// server's side of the link (the source when the peer is a receiver, the target when it is a
/// sender).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attach<'a> {
    pub role: PeerRole,
    /// The terminus address; `None` for a null terminus or a null address.
    pub address: Option<&'a str>,
    /// The terminus' `dynamic` flag.
    pub dynamic: bool,
    /// From the terminus' capabilities ([`NodeHint::from_capabilities`]).
    pub hint: Option<NodeHint>,
    /// The source asks for `distribution-mode = copy` (peer receivers only).
    pub copy_distribution: bool,
    /// The source carries a selector filter (`apache.org:selector-filter:string`; peer receivers only).
    pub selector: bool,
}

/// The node a link or message reaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// A KubeMQ channel of one of the five patterns (never `Pattern::Reply`).
    Channel { pattern: Pattern, channel: Channel },
    /// The connection-scoped RPC reply token `responses/<RequestID>`; the RPC layer checks the
    /// id against its pending replies.
    Responses { request_id: Bytes },
    /// A dynamic terminus: the front-end mints the node's address ([`DynamicAddress`]) and
    /// echoes it in the reply ATTACH. Only from [`judge_attach`].
    MintDynamic,
    /// A null-target sender: each message is routed by its `to` ([`route_to`]). Only from
    /// [`judge_attach`].
    Anonymous,
    /// An existing dynamic node named by a message's `to`. Only from [`route_to`]; whether the
    /// node exists (else `amqp:precondition-failed`) is the front-end's to check.
    Dynamic(DynamicAddress),
}

/// The permission the server must check before it lets the link (or message) through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    /// Read on the node's (pattern, channel), at attach.
    Read,
    /// Write on the node's (pattern, channel), at attach (or per message on an anonymous link).
    Write,
    /// Deferred: Write on each message's resolved `to`.
    WritePerMessage,
    /// Nothing: a `responses/` token or a dynamic node (connection-private by its address).
    None,
}

/// One ATTACH, judged: the server's role, the node, and the check the front-end still owes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkPlan {
    pub server_role: ServerRole,
    pub node: Node,
    pub permission: Permission,
}

/// A channel that breaks the connector charset rule (seed 002, *Channel validation*). Each one
/// is `amqp:not-found`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelFault {
    Empty,
    TooLong,
    TrailingDot,
    Whitespace,
    Wildcard,
    /// `;` or `:`.
    Separator,
}

/// Why an address, attach or message `to` is refused. Each maps to one condition of the
/// closed set and a fixed description that never repeats the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressError {
    Channel(ChannelFault),
    /// A `/` remains but no pattern prefix matched.
    UnknownPrefix,
    /// `responses/` with nothing after it.
    EmptyRequestId,
    /// A peer receiver attached to `responses/…`, which is write-only.
    ReceiverOnResponses,
    /// A peer receiver with a null or empty source address that is not dynamic.
    NoSourceAddress,
    /// A dynamic terminus that also names an address (AMQP 1.0 §3.5.3/§3.5.4: the address is
    /// not set when `dynamic` is; the seed only describes the empty-address form).
    DynamicWithAddress,
    /// `copy` distribution on a queue: queues are move-only (master table, Queues row).
    CopyOnQueue,
    /// A selector on a link that is not an events or events-store consume (master table,
    /// Queues row; connector-extra.md §3.8: "events and events-store only").
    SelectorNotSupported,
    /// An anonymous link's message without a `to`.
    MissingTo,
    /// An anonymous link's message whose `to` resolves to nothing.
    BadTo,
}

impl AddressError {
    pub fn condition(self) -> AmqpError {
        match self {
            AddressError::Channel(_) | AddressError::UnknownPrefix | AddressError::EmptyRequestId | AddressError::NoSourceAddress => AmqpError::NotFound,
            AddressError::ReceiverOnResponses => AmqpError::NotAllowed,
            AddressError::DynamicWithAddress | AddressError::CopyOnQueue => AmqpError::InvalidField,
            AddressError::SelectorNotSupported => AmqpError::NotImplemented,
            AddressError::MissingTo | AddressError::BadTo => AmqpError::PreconditionFailed,
        }
    }

    /// Fixed text for the error's description (the seed's "Reason" column where it has one).
    pub fn description(self) -> &'static str {
        match self {
            AddressError::Channel(ChannelFault::Empty) => "empty channel",
            AddressError::Channel(ChannelFault::TooLong) => "channel exceeds 255 bytes",
            AddressError::Channel(ChannelFault::TrailingDot) => "channel has trailing '.'",
            AddressError::Channel(ChannelFault::Whitespace) => "channel contains whitespace",
            AddressError::Channel(ChannelFault::Wildcard) => "channel contains wildcard",
            AddressError::Channel(ChannelFault::Separator) => "channel contains ';' or ':'",
            AddressError::UnknownPrefix => "unknown address prefix",
            AddressError::EmptyRequestId => "empty request id",
            AddressError::ReceiverOnResponses => "responses/ is write-only",
            AddressError::NoSourceAddress => "source address required",
            AddressError::DynamicWithAddress => "dynamic terminus must not carry an address",
            AddressError::CopyOnQueue => "copy distribution is not supported on queues",
            AddressError::SelectorNotSupported => "selectors are supported on events and events-store only",
            AddressError::MissingTo => "message has no 'to' address",
            AddressError::BadTo => "message 'to' address is not routable",
        }
    }
}

impl fmt::Display for AddressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.condition().symbol(), self.description())
    }
}

/// The connector charset rule (seed 002, *Channel validation*): not empty, ≤ 255 bytes, no
/// trailing `.`, no whitespace, no `*` or `>`, no `;` or `:`. The first four of those are the
/// crate's one channel rule ([`check_channel`] without wildcards), so a channel that passes here
/// also passes the gRPC validation, as the seed requires ("stricter than the array layer").
/// `check_channel` refuses every Unicode whitespace, a superset of the seed's space/tab/CR/LF.
pub fn check_amqp_channel(name: &str) -> Result<(), ChannelFault> {
    // Length first: it bounds the scans below.
    if name.len() > MAX_CHANNEL_LEN {
        return Err(ChannelFault::TooLong);
    }
    check_channel(name, false).map_err(|e| match e {
        ChannelError::Empty => ChannelFault::Empty,
        ChannelError::Whitespace => ChannelFault::Whitespace,
        ChannelError::TrailingDot => ChannelFault::TrailingDot,
        ChannelError::Wildcard => ChannelFault::Wildcard,
    })?;
    if name.contains([';', ':']) {
        return Err(ChannelFault::Separator);
    }
    Ok(())
}

/// The authorization resource a pattern is checked against (seed 002, *Server role and
/// authorization*): `events-store` is `events_store`. `None` for the STOMP-only reply sink.
pub fn authz_resource(pattern: Pattern) -> Option<&'static str> {
    match pattern {
        Pattern::Queues => Some("queues"),
        Pattern::Events => Some("events"),
        Pattern::EventsStore => Some("events_store"),
        Pattern::Commands => Some("commands"),
        Pattern::Queries => Some("queries"),
        Pattern::Reply => None,
    }
}

/// Where a prefix leads.
#[derive(Clone, Copy)]
enum Prefixed {
    Pattern(Pattern),
    Responses,
}

/// Seed 002, *Longest-prefix discipline*: this order, `events-store/` first.
const PREFIXES: [(&str, Prefixed); 6] = [
    ("events-store/", Prefixed::Pattern(Pattern::EventsStore)),
    ("queues/", Prefixed::Pattern(Pattern::Queues)),
    ("events/", Prefixed::Pattern(Pattern::Events)),
    ("commands/", Prefixed::Pattern(Pattern::Commands)),
    ("queries/", Prefixed::Pattern(Pattern::Queries)),
    ("responses/", Prefixed::Responses),
];

/// What an address names, before the link role is considered.
enum Resolved {
    Channel(Pattern, Channel),
    Responses(Bytes),
}

impl From<Resolved> for Node {
    fn from(r: Resolved) -> Node {
        match r {
            Resolved::Channel(pattern, channel) => Node::Channel { pattern, channel },
            Resolved::Responses(request_id) => Node::Responses { request_id },
        }
    }
}

/// Resolves a non-empty address to a channel or a `responses/` token, whatever the link role.
fn resolve(address: &str, hint: Option<NodeHint>, default: Pattern) -> Result<Resolved, AddressError> {
    let path = address.strip_prefix('/').unwrap_or(address);
    let (prefixed, rest) = match PREFIXES.iter().find_map(|&(prefix, to)| path.strip_prefix(prefix).map(|rest| (to, rest))) {
        Some(found) => found,
        None if path.contains('/') => return Err(AddressError::UnknownPrefix),
        None => (Prefixed::Pattern(hint.map_or_else(|| effective_default(default), NodeHint::pattern)), path),
    };
    match prefixed {
        Prefixed::Responses if rest.is_empty() => Err(AddressError::EmptyRequestId),
        Prefixed::Responses => Ok(Resolved::Responses(Bytes::copy_from_slice(rest.as_bytes()))),
        Prefixed::Pattern(pattern) => {
            check_amqp_channel(rest).map_err(AddressError::Channel)?;
            Ok(Resolved::Channel(pattern, Channel(Bytes::copy_from_slice(rest.as_bytes()))))
        }
    }
}

/// A DefaultPattern that is not one of AMQP's five degrades to queues (seed 002, *Bare address*).
fn effective_default(default: Pattern) -> Pattern {
    match default {
        Pattern::Reply => Pattern::Queues,
        other => other,
    }
}

/// Judges one ATTACH in one call: the server role, the node, and the permission still to check;
/// or the refusal to DETACH with ([`AddressError::condition`]). `default` is the DefaultPattern
/// setting.
///
/// A peer receiver may attach to `commands/…` and `queries/…`: that is a responder consuming
/// requests (connector-extra.md §3.6); the seed's "—" in the master table's receive column means
/// a *requester* reads its replies from a dynamic node instead.
pub fn judge_attach(attach: &Attach<'_>, default: Pattern) -> Result<LinkPlan, AddressError> {
    let server_role = attach.role.server_role();
    let plan = |node, permission| Ok(LinkPlan { server_role, node, permission });
    // Seed 002, *Address grammar*: a null or empty address is not an error in itself.
    let address = attach.address.filter(|a| !a.is_empty());
    if attach.dynamic {
        return match address {
            None => plan(Node::MintDynamic, Permission::None),
            Some(_) => Err(AddressError::DynamicWithAddress),
        };
    }
    let Some(address) = address else {
        return match attach.role {
            PeerRole::Sender => plan(Node::Anonymous, Permission::WritePerMessage),
            PeerRole::Receiver => Err(AddressError::NoSourceAddress),
        };
    };
    // A malformed address is refused before the role is considered (so `responses/` alone, as a
    // receiver, is not-found rather than not-allowed).
    let resolved = resolve(address, attach.hint, default)?;
    match (&resolved, attach.role) {
        (Resolved::Responses(_), PeerRole::Receiver) => Err(AddressError::ReceiverOnResponses),
        (Resolved::Responses(_), PeerRole::Sender) => plan(resolved.into(), Permission::None),
        (Resolved::Channel(..), PeerRole::Sender) => plan(resolved.into(), Permission::Write),
        (&Resolved::Channel(pattern, _), PeerRole::Receiver) => {
            // Source options the seed refuses (master table, Queues row; §3.8 for selectors).
            if attach.copy_distribution && pattern == Pattern::Queues {
                return Err(AddressError::CopyOnQueue);
            }
            if attach.selector && !matches!(pattern, Pattern::Events | Pattern::EventsStore) {
                return Err(AddressError::SelectorNotSupported);
            }
            plan(resolved.into(), Permission::Read)
        }
    }
}

/// Routes one message on an anonymous (null-target) link by its `properties.to` (seed 002,
/// *Special rows*, "Anonymous terminus"): the full mapping table, `responses/` tokens and
/// dynamic node addresses included. A missing or unroutable `to` is `amqp:precondition-failed`.
/// The caller still checks [`Node::write_permission`] for this message, and that a `Dynamic`
/// node exists.
pub fn route_to(to: Option<&str>, default: Pattern) -> Result<Node, AddressError> {
    let to = to.filter(|t| !t.is_empty()).ok_or(AddressError::MissingTo)?;
    let path = to.strip_prefix('/').unwrap_or(to);
    // The dynamic prefix is reserved: a malformed dynamic address is unroutable, not a channel.
    if path.starts_with(DYNAMIC_PREFIX) {
        return path.parse().map(Node::Dynamic).map_err(|_| AddressError::BadTo);
    }
    resolve(to, None, default).map(Node::from).map_err(|_| AddressError::BadTo)
}

impl Node {
    /// The permission a message written to this node needs (an anonymous link's per-message
    /// check): Write on a channel; nothing on a `responses/` token or a dynamic node.
    pub fn write_permission(&self) -> Permission {
        match self {
            Node::Channel { .. } => Permission::Write,
            Node::Anonymous => Permission::WritePerMessage,
            Node::Responses { .. } | Node::MintDynamic | Node::Dynamic(_) => Permission::None,
        }
    }
}

/// A dynamic node's address, `_amqp10.tmp.<conn>.<uuid>` (connector-extra.md §3.6): `conn` is the
/// owning connection's id (decimal), `id` 128 bits shown as a hyphenated lowercase UUID. The
/// caller supplies `id` and must make it unguessable (random): the address is the node's only
/// protection (seed 002, *Special rows*, "Dynamic terminus").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DynamicAddress {
    pub conn: u64,
    pub id: u128,
}

impl fmt::Display for DynamicAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = format!("{:032x}", self.id);
        write!(f, "{DYNAMIC_PREFIX}{}.{}-{}-{}-{}-{}", self.conn, &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
    }
}

/// The address is not exactly what [`DynamicAddress`]'s `Display` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotDynamicAddress;

impl FromStr for DynamicAddress {
    type Err = NotDynamicAddress;

    /// Accepts only the canonical form (decimal `conn` without leading zeros, lowercase UUID), so
    /// every node has exactly one address.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s.strip_prefix(DYNAMIC_PREFIX).ok_or(NotDynamicAddress)?;
        let (conn, uuid) = rest.split_once('.').ok_or(NotDynamicAddress)?;
        if conn.is_empty() || !conn.bytes().all(|b| b.is_ascii_digit()) || uuid.len() != 36 {
            return Err(NotDynamicAddress);
        }
        let conn: u64 = conn.parse().map_err(|_| NotDynamicAddress)?;
        let hex: String = uuid.split('-').collect();
        if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(NotDynamicAddress);
        }
        let id = u128::from_str_radix(&hex, 16).map_err(|_| NotDynamicAddress)?;
        let parsed = DynamicAddress { conn, id };
        // Hyphen positions and leading zeros: the canonical form is the one Display writes.
        if parsed.to_string() != s {
            return Err(NotDynamicAddress);
        }
        Ok(parsed)
    }
}

/// 128 random bits for a [`DynamicAddress`]'s `id`, from the kernel's CSPRNG (`getrandom(2)`),
/// so a node's address cannot be guessed from another's. Never fails: should the call ever
/// come up short, the bits are mixed with the clock and a counter (still unique, less secret).
pub fn random_id() -> u128 {
    let mut buf = [0u8; 16];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    let mut id = u128::from_ne_bytes(buf);
    if n != buf.len() as isize {
        static FALLBACK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        id ^= nanos.rotate_left(64) ^ u128::from(FALLBACK.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    }
    id
}

#[cfg(test)]
mod tests;
