//! Domain types shared by every ring: the five KubeMQ patterns, channel names, tags and the
//! message that travels through the array. Nothing here does I/O.

use bytes::Bytes;
use std::fmt;

/// The messaging pattern a destination selects. `Reply` is the connection-local RPC reply sink
/// (`/reply/…`): it is never routed to the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    Events,
    EventsStore,
    Queues,
    Commands,
    Queries,
    Reply,
}

impl Pattern {
    /// A pattern as KubeMQ's AMQP DefaultPattern setting names it (connector-extra.md §3.1):
    /// `queues`, `events`, `events-store`, `commands`, `queries`; not STOMP's DefaultPattern
    /// values (events, queues, store, none, `route::DefaultPattern`).
    pub fn from_amqp_setting(s: &str) -> Option<Pattern> {
        match s.trim() {
            "queues" => Some(Pattern::Queues),
            "events" => Some(Pattern::Events),
            "events-store" => Some(Pattern::EventsStore),
            "commands" => Some(Pattern::Commands),
            "queries" => Some(Pattern::Queries),
            _ => None,
        }
    }

    /// The primary (canonical) destination prefix, without slashes: egress always uses it.
    pub fn primary_prefix(self) -> &'static str {
        match self {
            Pattern::Events => "topic",
            Pattern::EventsStore => "topic-store",
            Pattern::Queues => "queue",
            Pattern::Commands => "command",
            Pattern::Queries => "query",
            Pattern::Reply => "reply",
        }
    }

    /// A small stable number, used when hashing (pattern, channel) to an owner core.
    pub fn index(self) -> u8 {
        self as u8
    }
}

/// A KubeMQ channel name in its dotted form (`orders.eu`). Cheap to clone (shared bytes).
/// Channels reach us from STOMP destinations (any bytes but `/`) and later from gRPC (UTF-8).
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Channel(pub Bytes);

impl Channel {
    pub fn from_static(s: &'static str) -> Self {
        Channel(Bytes::from_static(s.as_bytes()))
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

/// KubeMQ tags, in insertion order. Keys are unique (first wins on ingress).
/// A `Vec` rather than a map: messages carry a handful of tags, and order is kept for egress.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tags(pub Vec<(Bytes, Bytes)>);

impl Tags {
    pub fn get(&self, key: &[u8]) -> Option<&Bytes> {
        self.0.iter().find(|(k, _)| k.as_ref() == key).map(|(_, v)| v)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = &(Bytes, Bytes)> {
        self.0.iter()
    }
}

/// One message as the array stores and forwards it. Shared (`Arc`) between every delivery, so
/// a fan-out to N subscribers never copies the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// KubeMQ message / event id.
    pub id: Bytes,
    pub channel: Channel,
    /// Producer's client id.
    pub client_id: Bytes,
    /// Native KubeMQ `Metadata`; STOMP ingress never sets it (seed 000).
    pub metadata: Bytes,
    pub body: Bytes,
    pub tags: Tags,
    /// Wall-clock time the array accepted the message, Unix nanoseconds.
    pub timestamp_ns: i64,
    /// Events-Store sequence (1-based); 0 elsewhere.
    pub sequence: u64,
}

impl Message {
    /// The same message on `channel` (a copy of its name the caller keeps once, e.g. as a map
    /// key), with every other field in one allocation of its own. A message decoded from a
    /// connection shares that connection's read buffer (the STOMP decoder's views), so one
    /// kept for long (an Events-Store history) would pin the whole buffer, whatever else it
    /// held; this copy costs one allocation and pins only the message's own bytes.
    pub fn compacted(&self, channel: Channel) -> Message {
        self.compacted_with(Some(channel))
    }

    /// [`Message::compacted`] with the channel's name in the same allocation.
    pub fn compacted_whole(&self) -> Message {
        self.compacted_with(None)
    }

    fn compacted_with(&self, channel: Option<Channel>) -> Message {
        let tag_bytes: usize = self.tags.iter().map(|(k, v)| k.len() + v.len()).sum();
        let name: &[u8] = if channel.is_some() { &[] } else { &self.channel.0 };
        let fields: [&[u8]; 5] = [&self.id, name, &self.client_id, &self.metadata, &self.body];
        let mut all = Vec::with_capacity(fields.iter().map(|f| f.len()).sum::<usize>() + tag_bytes);
        for f in fields {
            all.extend_from_slice(f);
        }
        for (k, v) in self.tags.iter() {
            all.extend_from_slice(k);
            all.extend_from_slice(v);
        }
        let all = Bytes::from(all);
        let mut at = 0;
        let mut next = |len: usize| {
            at += len;
            if len == 0 {
                Bytes::new()
            } else {
                all.slice(at - len..at)
            }
        };
        let id = next(self.id.len());
        let channel = channel.unwrap_or_else(|| Channel(next(name.len())));
        Message {
            id,
            channel,
            client_id: next(self.client_id.len()),
            metadata: next(self.metadata.len()),
            body: next(self.body.len()),
            tags: Tags(self.tags.iter().map(|(k, v)| (next(k.len()), next(v.len()))).collect()),
            timestamp_ns: self.timestamp_ns,
            sequence: self.sequence,
        }
    }
}

/// Current wall-clock time in Unix nanoseconds.
pub fn now_unix_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}
