//! The STOMP frame as the decoder yields it: a command, headers and a body, all views of the
//! connection's read buffer (`Bytes`), so decoding copies nothing unless a header needs
//! unescaping.

use bytes::Bytes;

/// STOMP protocol versions. Ordered, so the highest common version is a `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V1_0,
    V1_1,
    V1_2,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1_0 => "1.0",
            Version::V1_1 => "1.1",
            Version::V1_2 => "1.2",
        }
    }
}

/// Client and server frame commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    // client frames
    Connect,
    Stomp,
    Send,
    Subscribe,
    Unsubscribe,
    Ack,
    Nack,
    Begin,
    Commit,
    Abort,
    Disconnect,
    // server frames
    Connected,
    Message,
    Receipt,
    Error,
}

impl Command {
    /// Parses a command line (without its EOL). Commands are case-sensitive (spec).
    pub fn parse(line: &[u8]) -> Option<Command> {
        Some(match line {
            b"CONNECT" => Command::Connect,
            b"STOMP" => Command::Stomp,
            b"SEND" => Command::Send,
            b"SUBSCRIBE" => Command::Subscribe,
            b"UNSUBSCRIBE" => Command::Unsubscribe,
            b"ACK" => Command::Ack,
            b"NACK" => Command::Nack,
            b"BEGIN" => Command::Begin,
            b"COMMIT" => Command::Commit,
            b"ABORT" => Command::Abort,
            b"DISCONNECT" => Command::Disconnect,
            b"CONNECTED" => Command::Connected,
            b"MESSAGE" => Command::Message,
            b"RECEIPT" => Command::Receipt,
            b"ERROR" => Command::Error,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Connect => "CONNECT",
            Command::Stomp => "STOMP",
            Command::Send => "SEND",
            Command::Subscribe => "SUBSCRIBE",
            Command::Unsubscribe => "UNSUBSCRIBE",
            Command::Ack => "ACK",
            Command::Nack => "NACK",
            Command::Begin => "BEGIN",
            Command::Commit => "COMMIT",
            Command::Abort => "ABORT",
            Command::Disconnect => "DISCONNECT",
            Command::Connected => "CONNECTED",
            Command::Message => "MESSAGE",
            Command::Receipt => "RECEIPT",
            Command::Error => "ERROR",
        }
    }

    /// CONNECT, STOMP and CONNECTED headers are never escaped (spec 1.2, "Value Encoding").
    pub fn escapes_headers(self) -> bool {
        !matches!(self, Command::Connect | Command::Stomp | Command::Connected)
    }
}

/// Decoded (already unescaped) headers in wire order. Repeated names are kept; lookups return
/// the first occurrence, as the spec says ("first wins").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(Bytes, Bytes)>);

impl Headers {
    pub fn get(&self, name: &[u8]) -> Option<&Bytes> {
        self.0.iter().find(|(n, _)| n.as_ref() == name).map(|(_, v)| v)
    }
    pub fn get_str(&self, name: &[u8]) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }
    pub fn iter(&self) -> impl Iterator<Item = &(Bytes, Bytes)> {
        self.0.iter()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One inbound frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub command: Command,
    pub headers: Headers,
    pub body: Bytes,
}
