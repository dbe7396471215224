//! The record format of the per-core log: what one queue message, one settlement or one
//! Events-Store message (or deletion) looks like on disk.
//!
//! ```text
//! offset  size  field
//!      0     4  magic  b"SGR1" (the scanner's resync mark, see segment.rs)
//!      4     4  crc    CRC-32C (Castagnoli) of bytes 8.. (length, version, kind, stamp, fields), LE
//!      8     4  length bytes after this field: version + kind + stamp + fields, LE, ≥ 6
//!     12     1  version (2)
//!     13     1  kind
//!     14     4  stamp  the low 32 bits of the id of the segment the record was written to, LE
//!     18     …  fields of that kind
//! ```
//!
//! Version 1 records (written before segments were recycled) have no stamp: their fields
//! start at 14. They are still read; [`frame`] reports them without a stamp.
//!
//! # Why a stamp
//! A segment file whose records are all settled is reused as a later segment
//! (`segment.rs`, "Recycled segments"), overwritten from its start: past the new records'
//! end, the file still holds the old ones, intact, checksums and all. The stamp tells them
//! apart: a record belongs to the segment it sits in only when its stamp is that segment's id.
//! PostgreSQL's recycled WAL segments do the same with the page address in each page header.
//! The stamp is covered by the checksum, so a record cannot change segments by a flipped bit.
//!
//! Fields are little-endian integers and length-prefixed byte strings (`u32` length, then the
//! bytes); an optional string is a `u8` flag (0 absent, 1 present) before it; tags are a `u32`
//! count, then key and value strings. The CRC covers the length, so a flipped length is caught
//! by the checksum rather than trusted.
//!
//! Encoding appends to a caller's `Vec<u8>` (a batch buffer reused across group commits), so a
//! record costs no allocation beyond that buffer's growth. Its stamp is the segment the caller
//! expects it to land in; when a batch lands in a later one (the segment filled up),
//! [`restamp`] rewrites the stamps and checksums in place. Decoding borrows from the input:
//! every length is checked against the bytes that remain before it is used, the record length
//! against [`MAX_RECORD_BYTES`], and the tag count against the bytes that remain before the tag
//! vector (the one allocation) is sized. Decoding returns an error, never panics.
//!
//! A settlement names its message by (queue channel, per-queue sequence): the sequence the
//! queue assigns on arrival (`array::queue`), unique within a queue for the process's life and,
//! once recovery restores `next_seq`, across restarts.

use std::fmt;

/// The first four bytes of every record.
pub const MAGIC: [u8; 4] = *b"SGR1";
/// Bytes before a record's fields: magic, crc, length, version, kind, stamp.
pub const HEADER_BYTES: usize = 18;
/// The format version this build writes.
pub const VERSION: u8 = 2;
/// The version without a stamp, which this build still reads.
const VERSION_1: u8 = 1;
/// Bytes before a version 1 record's fields.
const HEADER_BYTES_V1: usize = 14;
/// Where the stamp sits.
const STAMP_AT: usize = 14;
/// Largest record (header included) encode writes and decode accepts: bounds what a corrupt
/// length can make the scanner consider. Room for a message at the default `--max-body-size`
/// (100 MiB) with its headers; a larger `--max-body-size` with persistence on must be refused
/// at start, or such a message refused by its SEND ([`TooLarge`]).
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// Bytes of the magic, crc and length fields (what `length` does not count).
const PREFIX_BYTES: usize = 12;

/// The stamp of records written to segment `id` (its low 32 bits: a stale record would have to
/// come from a segment 2^32 segments older to pass for a current one).
pub fn stamp_of(id: u64) -> u32 {
    id as u32
}

/// A record's extent as [`frame`] checked it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Bytes the record takes, header included.
    pub len: usize,
    /// The segment it was written to ([`stamp_of`]); `None` for a version 1 record, which
    /// has none (and for an intact record of another version: [`decode`] reports those).
    pub stamp: Option<u32>,
}

/// The kind byte of each record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    QueueMessage = 1,
    QueueAck = 2,
    QueueRequeue = 3,
    QueueDeadLetter = 4,
    StoreMessage = 5,
    StoreDelete = 6,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::QueueMessage,
            2 => Kind::QueueAck,
            3 => Kind::QueueRequeue,
            4 => Kind::QueueDeadLetter,
            5 => Kind::StoreMessage,
            6 => Kind::StoreDelete,
            _ => return None,
        })
    }
}

/// A message's content, as `model::Message` holds it (sequence and channel apart).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Content<'a> {
    pub id: &'a [u8],
    pub client_id: &'a [u8],
    pub metadata: &'a [u8],
    pub body: &'a [u8],
    /// In insertion order, as `model::Tags`.
    pub tags: Vec<(&'a [u8], &'a [u8])>,
    /// Unix ns the array accepted the message.
    pub timestamp_ns: i64,
}

/// A message a queue accepted, with the sender's policy (`mesh::msg::QueueMeta`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueMessage<'a> {
    pub channel: &'a [u8],
    /// The queue's sequence for it.
    pub seq: u64,
    pub content: Content<'a>,
    /// Unix ns after which it is discarded; 0 = never.
    pub expires_at_ns: i64,
    /// Unix ns before which it is not delivered; 0 = at once.
    pub delayed_to_ns: i64,
    /// Deliveries allowed before dead-lettering; 0 = the array default.
    pub max_receive: u32,
    /// Where it goes past `max_receive`; none = discarded.
    pub dead_letter: Option<&'a [u8]>,
    /// Set on a dead-lettered copy: the queue it came from.
    pub rerouted_from: Option<&'a [u8]>,
}

/// What happened to a queue message after it was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement<'a> {
    /// Acknowledged (or removed by a pull): gone for good.
    Ack,
    /// Back in the queue after `receive_count` deliveries (NACK, release, ack timeout).
    Requeue { receive_count: u32 },
    /// Past its receive limit: moved to `target` (whose copy is its own `QueueMessage`
    /// record), or discarded when there is none.
    DeadLetter { target: Option<&'a [u8]> },
}

/// A settlement of the message `seq` of queue `channel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSettle<'a> {
    pub channel: &'a [u8],
    pub seq: u64,
    pub settlement: Settlement<'a>,
}

/// An Events-Store message with the channel sequence it got (timestamp in its content).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreMessage<'a> {
    pub channel: &'a [u8],
    /// 1-based channel sequence.
    pub sequence: u64,
    pub content: Content<'a>,
}

/// One log record, borrowing its bytes from the buffer it was decoded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    QueueMessage(QueueMessage<'a>),
    QueueSettle(QueueSettle<'a>),
    StoreMessage(StoreMessage<'a>),
    /// An Events-Store channel was deleted: its messages are gone, and its next message is
    /// sequence 1 again.
    StoreDelete {
        channel: &'a [u8],
    },
}

/// Why bytes are not a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header or the record's length says: a torn write at a tail.
    Truncated,
    /// The first four bytes are not [`MAGIC`].
    BadMagic,
    /// The length is below the minimum or above [`MAX_RECORD_BYTES`].
    BadLength,
    /// The checksum does not match the bytes.
    BadChecksum,
    /// Checksum good, but written by a format version this build does not read.
    UnknownVersion(u8),
    /// Checksum good, but a kind this build does not know.
    UnknownKind(u8),
    /// Checksum good, but the fields do not parse or leave bytes over.
    Malformed,
}

impl DecodeError {
    /// True when the framing itself (magic, length, checksum) is damaged, so the record's
    /// extent cannot be trusted; false when the record is intact but unreadable here.
    pub fn is_framing(self) -> bool {
        matches!(self, DecodeError::Truncated | DecodeError::BadMagic | DecodeError::BadLength | DecodeError::BadChecksum)
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("truncated record"),
            DecodeError::BadMagic => f.write_str("no record magic"),
            DecodeError::BadLength => f.write_str("record length out of bounds"),
            DecodeError::BadChecksum => f.write_str("record checksum mismatch"),
            DecodeError::UnknownVersion(v) => write!(f, "unknown record version {v}"),
            DecodeError::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            DecodeError::Malformed => f.write_str("malformed record fields"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The record would be larger than [`MAX_RECORD_BYTES`]; nothing was appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge;

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "record larger than {MAX_RECORD_BYTES} bytes")
    }
}

impl std::error::Error for TooLarge {}

/// The bytes [`encode`] appends for `record` (header included).
pub fn encoded_len(record: &Record<'_>) -> usize {
    let bytes = |b: &[u8]| 4 + b.len();
    let opt = |b: Option<&[u8]>| 1 + b.map_or(0, bytes);
    let content = |c: &Content<'_>| {
        bytes(c.id) + bytes(c.client_id) + bytes(c.metadata) + bytes(c.body) + 4 + c.tags.iter().map(|(k, v)| bytes(k) + bytes(v)).sum::<usize>() + 8
    };
    HEADER_BYTES
        + match record {
            Record::QueueMessage(m) => bytes(m.channel) + 8 + content(&m.content) + 8 + 8 + 4 + opt(m.dead_letter) + opt(m.rerouted_from),
            Record::QueueSettle(s) => {
                bytes(s.channel)
                    + 8
                    + match s.settlement {
                        Settlement::Ack => 0,
                        Settlement::Requeue { .. } => 4,
                        Settlement::DeadLetter { target } => opt(target),
                    }
            }
            Record::StoreMessage(m) => bytes(m.channel) + 8 + content(&m.content),
            Record::StoreDelete { channel } => bytes(channel),
        }
}

/// Appends `record` to `buf`, stamped as written to the segment of stamp `stamp`
/// ([`stamp_of`]). A record over [`MAX_RECORD_BYTES`] is refused before anything is written,
/// and `buf` is left as it was.
pub fn encode(record: &Record<'_>, stamp: u32, buf: &mut Vec<u8>) -> Result<(), TooLarge> {
    let total = encoded_len(record);
    if total > MAX_RECORD_BYTES {
        return Err(TooLarge);
    }
    buf.reserve(total);
    let start = buf.len();
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&[0; 8]); // crc and length, filled in below
    buf.push(VERSION);
    buf.push(kind_of(record) as u8);
    put_u32(buf, stamp);
    match record {
        Record::QueueMessage(m) => {
            put_bytes(buf, m.channel);
            put_u64(buf, m.seq);
            put_content(buf, &m.content);
            put_i64(buf, m.expires_at_ns);
            put_i64(buf, m.delayed_to_ns);
            put_u32(buf, m.max_receive);
            put_opt_bytes(buf, m.dead_letter);
            put_opt_bytes(buf, m.rerouted_from);
        }
        Record::QueueSettle(s) => {
            put_bytes(buf, s.channel);
            put_u64(buf, s.seq);
            match s.settlement {
                Settlement::Ack => {}
                Settlement::Requeue { receive_count } => put_u32(buf, receive_count),
                Settlement::DeadLetter { target } => put_opt_bytes(buf, target),
            }
        }
        Record::StoreMessage(m) => {
            put_bytes(buf, m.channel);
            put_u64(buf, m.sequence);
            put_content(buf, &m.content);
        }
        Record::StoreDelete { channel } => put_bytes(buf, channel),
    }
    debug_assert_eq!(buf.len() - start, total, "encoded_len matches encode");
    // Bounded by MAX_RECORD_BYTES above, so the length fits a u32.
    let length = (total - PREFIX_BYTES) as u32;
    buf[start + 8..start + 12].copy_from_slice(&length.to_le_bytes());
    seal(&mut buf[start..]);
    Ok(())
}

fn kind_of(record: &Record<'_>) -> Kind {
    match record {
        Record::QueueMessage(_) => Kind::QueueMessage,
        Record::QueueSettle(s) => match s.settlement {
            Settlement::Ack => Kind::QueueAck,
            Settlement::Requeue { .. } => Kind::QueueRequeue,
            Settlement::DeadLetter { .. } => Kind::QueueDeadLetter,
        },
        Record::StoreMessage(_) => Kind::StoreMessage,
        Record::StoreDelete { .. } => Kind::StoreDelete,
    }
}

/// Writes the checksum of the whole record `rec` (exactly one record's bytes).
fn seal(rec: &mut [u8]) {
    let crc = crc32c::crc32c(&rec[8..]);
    rec[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Rewrites the stamp (and checksum) of every record in `batch` — whole records that
/// [`encode`] appended — whose stamp is not `stamp`: the batch lands in another segment than
/// the one its records were encoded for. Version 1 records, which have no stamp, are left as
/// they are (only decoded records re-encoded by [`encode`] are ever appended again).
pub fn restamp(batch: &mut [u8], stamp: u32) {
    let mut at = 0;
    while at + HEADER_BYTES <= batch.len() {
        let len = PREFIX_BYTES + u32::from_le_bytes([batch[at + 8], batch[at + 9], batch[at + 10], batch[at + 11]]) as usize;
        debug_assert!(batch[at..].starts_with(&MAGIC) && at + len <= batch.len(), "restamp takes whole encoded records");
        let end = (at + len).min(batch.len());
        let rec = &mut batch[at..end];
        if rec[12] == VERSION && rec[STAMP_AT..STAMP_AT + 4] != stamp.to_le_bytes() {
            rec[STAMP_AT..STAMP_AT + 4].copy_from_slice(&stamp.to_le_bytes());
            seal(rec);
        }
        at += len;
    }
}

/// The extent of the record at the start of `buf` with its framing checked (magic, length
/// bounds, checksum), without reading its fields: the record's total size in bytes.
pub fn frame_len(buf: &[u8]) -> Result<usize, DecodeError> {
    frame(buf).map(|f| f.len)
}

/// [`frame_len`] with the record's stamp.
pub fn frame(buf: &[u8]) -> Result<Frame, DecodeError> {
    frame_checked(buf, |_| true)
}

/// [`frame`] of a record stamped `stamp` (or of version 1, without a stamp): any other is
/// refused before its checksum is computed, as `BadChecksum` — what the resync scan wants
/// past a recycled segment's end, where every old record is intact but not its own.
pub fn frame_stamped(buf: &[u8], stamp: u32) -> Result<Frame, DecodeError> {
    frame_checked(buf, |s| s.is_none_or(|s| s == stamp))
}

/// The stamp field of a record whose length is known to be in bounds (not yet checksummed).
fn stamp_field(buf: &[u8], length: usize) -> Option<u32> {
    (buf[12] == VERSION && length >= HEADER_BYTES - PREFIX_BYTES).then(|| u32::from_le_bytes([buf[14], buf[15], buf[16], buf[17]]))
}

fn frame_checked(buf: &[u8], wanted: impl Fn(Option<u32>) -> bool) -> Result<Frame, DecodeError> {
    if buf.len() < PREFIX_BYTES {
        // A torn prefix that is not even the magic is damage, not a short record.
        let n = buf.len().min(MAGIC.len());
        return Err(if buf[..n] == MAGIC[..n] { DecodeError::Truncated } else { DecodeError::BadMagic });
    }
    if buf[..4] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let length = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    if !(HEADER_BYTES_V1 - PREFIX_BYTES..=MAX_RECORD_BYTES - PREFIX_BYTES).contains(&length) {
        return Err(DecodeError::BadLength);
    }
    let total = PREFIX_BYTES + length;
    if buf.len() < total {
        return Err(DecodeError::Truncated);
    }
    let stamp = stamp_field(buf, length);
    if !wanted(stamp) {
        return Err(DecodeError::BadChecksum);
    }
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if crc32c::crc32c(&buf[8..total]) != crc {
        return Err(DecodeError::BadChecksum);
    }
    Ok(Frame { len: total, stamp })
}

/// Decodes the record at the start of `buf`: the record and the bytes it took.
pub fn decode(buf: &[u8]) -> Result<(Record<'_>, usize), DecodeError> {
    let total = frame_len(buf)?;
    let fields_at = match buf[12] {
        VERSION if total >= HEADER_BYTES => HEADER_BYTES,
        VERSION => return Err(DecodeError::Malformed),
        VERSION_1 => HEADER_BYTES_V1,
        version => return Err(DecodeError::UnknownVersion(version)),
    };
    let kind = Kind::from_byte(buf[13]).ok_or(DecodeError::UnknownKind(buf[13]))?;
    let mut r = Reader { rest: &buf[fields_at..total] };
    let record = match kind {
        Kind::QueueMessage => Record::QueueMessage(QueueMessage {
            channel: r.bytes()?,
            seq: r.u64()?,
            content: r.content()?,
            expires_at_ns: r.i64()?,
            delayed_to_ns: r.i64()?,
            max_receive: r.u32()?,
            dead_letter: r.opt_bytes()?,
            rerouted_from: r.opt_bytes()?,
        }),
        Kind::QueueAck | Kind::QueueRequeue | Kind::QueueDeadLetter => {
            let channel = r.bytes()?;
            let seq = r.u64()?;
            let settlement = match kind {
                Kind::QueueAck => Settlement::Ack,
                Kind::QueueRequeue => Settlement::Requeue { receive_count: r.u32()? },
                _ => Settlement::DeadLetter { target: r.opt_bytes()? },
            };
            Record::QueueSettle(QueueSettle { channel, seq, settlement })
        }
        Kind::StoreMessage => Record::StoreMessage(StoreMessage { channel: r.bytes()?, sequence: r.u64()?, content: r.content()? }),
        Kind::StoreDelete => Record::StoreDelete { channel: r.bytes()? },
    };
    if !r.rest.is_empty() {
        return Err(DecodeError::Malformed);
    }
    Ok((record, total))
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_i64(buf: &mut Vec<u8>, v: i64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

/// Lengths fit a u32: encode refused any record over MAX_RECORD_BYTES before writing.
fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(buf, bytes.len() as u32);
    buf.extend_from_slice(bytes);
}

fn put_opt_bytes(buf: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => buf.push(0),
        Some(b) => {
            buf.push(1);
            put_bytes(buf, b);
        }
    }
}

fn put_content(buf: &mut Vec<u8>, c: &Content<'_>) {
    put_bytes(buf, c.id);
    put_bytes(buf, c.client_id);
    put_bytes(buf, c.metadata);
    put_bytes(buf, c.body);
    put_u32(buf, c.tags.len() as u32);
    for (k, v) in &c.tags {
        put_bytes(buf, k);
        put_bytes(buf, v);
    }
    put_i64(buf, c.timestamp_ns);
}

/// Reads fields from a record's checked extent; every read is bounded by what remains.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.rest.len() {
            return Err(DecodeError::Malformed);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.bytes()?)),
            _ => Err(DecodeError::Malformed),
        }
    }

    fn content(&mut self) -> Result<Content<'a>, DecodeError> {
        let id = self.bytes()?;
        let client_id = self.bytes()?;
        let metadata = self.bytes()?;
        let body = self.bytes()?;
        let count = self.u32()? as usize;
        // Each tag takes at least its two length prefixes: a count the remaining bytes cannot
        // hold is corrupt, and must not size the vector.
        if count > self.rest.len() / 8 {
            return Err(DecodeError::Malformed);
        }
        let mut tags = Vec::with_capacity(count);
        for _ in 0..count {
            tags.push((self.bytes()?, self.bytes()?));
        }
        Ok(Content { id, client_id, metadata, body, tags, timestamp_ns: self.i64()? })
    }
}

/// `rec` (one version 2 record) as version 1 wrote it: no stamp (for tests of the logs an
/// earlier build left).
#[cfg(test)]
pub(crate) fn as_version_1(rec: &[u8]) -> Vec<u8> {
    let mut v1 = rec[..STAMP_AT].to_vec();
    v1.extend_from_slice(&rec[HEADER_BYTES..]);
    v1[12] = VERSION_1;
    let length = (v1.len() - PREFIX_BYTES) as u32;
    v1[8..12].copy_from_slice(&length.to_le_bytes());
    seal(&mut v1);
    v1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn content<'a>(body: &'a [u8]) -> Content<'a> {
        Content {
            id: b"msg-1",
            client_id: b"producer-7",
            metadata: b"meta",
            body,
            tags: vec![(b"a", b"1"), (b"k", b"")],
            timestamp_ns: 1_764_000_000_123_456_789,
        }
    }

    /// One record of every kind (and every settlement, both DeadLetter shapes).
    fn every_kind() -> Vec<Record<'static>> {
        vec![
            Record::QueueMessage(QueueMessage {
                channel: b"orders.eu",
                seq: 42,
                content: content(b"hello\0world"),
                expires_at_ns: 1_764_000_060_000_000_000,
                delayed_to_ns: 1_764_000_001_000_000_000,
                max_receive: 5,
                dead_letter: Some(b"orders.dlq"),
                rerouted_from: None,
            }),
            Record::QueueMessage(QueueMessage {
                channel: b"orders.dlq",
                seq: 1,
                content: Content { tags: vec![], ..content(b"") },
                rerouted_from: Some(b"orders.eu"),
                ..QueueMessage::default()
            }),
            Record::QueueSettle(QueueSettle { channel: b"orders.eu", seq: 42, settlement: Settlement::Ack }),
            Record::QueueSettle(QueueSettle { channel: b"q", seq: u64::MAX, settlement: Settlement::Requeue { receive_count: 3 } }),
            Record::QueueSettle(QueueSettle { channel: b"q", seq: 7, settlement: Settlement::DeadLetter { target: Some(b"q.dlq") } }),
            Record::QueueSettle(QueueSettle { channel: b"q", seq: 8, settlement: Settlement::DeadLetter { target: None } }),
            Record::StoreMessage(StoreMessage { channel: b"prices", sequence: 1_000_001, content: content(&[0xff; 300]) }),
            Record::StoreDelete { channel: b"prices" },
        ]
    }

    #[test]
    fn every_record_kind_round_trips() {
        for record in every_kind() {
            let mut buf = Vec::new();
            encode(&record, 1, &mut buf).unwrap();
            assert_eq!(buf.len(), encoded_len(&record), "{record:?}");
            assert_eq!(decode(&buf), Ok((record.clone(), buf.len())), "{record:?}");
        }
    }

    #[test]
    fn records_concatenate_and_decode_in_order() {
        let records = every_kind();
        let mut buf = Vec::new();
        for r in &records {
            encode(r, 1, &mut buf).unwrap();
        }
        let mut at = 0;
        for r in &records {
            let (got, used) = decode(&buf[at..]).unwrap();
            assert_eq!(&got, r);
            at += used;
        }
        assert_eq!(at, buf.len());
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let mut buf = Vec::new();
        encode(&every_kind()[0], 1, &mut buf).unwrap();
        for i in 0..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[i] ^= 1 << bit;
                let err = decode(&bad).unwrap_err();
                assert!(err.is_framing(), "byte {i} bit {bit}: {err:?}");
            }
        }
    }

    #[test]
    fn every_prefix_is_truncated() {
        let mut buf = Vec::new();
        encode(&every_kind()[6], 1, &mut buf).unwrap();
        for n in 0..buf.len() {
            assert_eq!(decode(&buf[..n]), Err(DecodeError::Truncated), "prefix of {n} bytes");
        }
    }

    #[test]
    fn intact_but_unknown_version_and_kind_are_reported_as_such() {
        let mut buf = Vec::new();
        encode(&every_kind()[2], 1, &mut buf).unwrap();
        let reseal = |buf: &mut Vec<u8>| {
            let crc = crc32c::crc32c(&buf[8..]);
            buf[4..8].copy_from_slice(&crc.to_le_bytes());
        };
        let mut v3 = buf.clone();
        v3[12] = 3;
        reseal(&mut v3);
        assert_eq!(decode(&v3), Err(DecodeError::UnknownVersion(3)));
        let mut k9 = buf.clone();
        k9[13] = 9;
        reseal(&mut k9);
        assert_eq!(decode(&k9), Err(DecodeError::UnknownKind(9)));
        assert!(!DecodeError::UnknownKind(9).is_framing());
    }

    #[test]
    fn version_1_records_without_a_stamp_are_still_read() {
        for record in every_kind() {
            let mut buf = Vec::new();
            encode(&record, 7, &mut buf).unwrap();
            let v1 = as_version_1(&buf);
            assert_eq!(v1.len(), buf.len() - 4);
            assert_eq!(decode(&v1), Ok((record.clone(), v1.len())), "{record:?}");
            assert_eq!(frame(&v1), Ok(Frame { len: v1.len(), stamp: None }));
            // Whatever segment it sits in, a record without a stamp is that segment's.
            assert_eq!(frame_stamped(&v1, 99), Ok(Frame { len: v1.len(), stamp: None }));
        }
    }

    #[test]
    fn the_stamp_is_the_segment_a_record_was_written_to_and_restamp_moves_it() {
        let records = every_kind();
        let mut batch = Vec::new();
        for r in &records {
            encode(r, stamp_of(5), &mut batch).unwrap();
        }
        assert_eq!(frame(&batch).unwrap().stamp, Some(5));
        assert_eq!(frame_stamped(&batch, 5).map(|f| f.len), frame_len(&batch));
        assert_eq!(frame_stamped(&batch, 6), Err(DecodeError::BadChecksum), "another segment's record is not this one's");
        // Restamped for segment 6: every record says 6, checksums good, contents unchanged.
        let before = batch.clone();
        restamp(&mut batch, stamp_of(6));
        let mut at = 0;
        for r in &records {
            let f = frame_stamped(&batch[at..], 6).unwrap();
            assert_eq!(f.stamp, Some(6));
            assert_eq!(decode(&batch[at..]), Ok((r.clone(), f.len)));
            at += f.len;
        }
        assert_eq!(at, batch.len());
        // Back to 5: the original bytes; already stamped 5: untouched.
        restamp(&mut batch, stamp_of(5));
        assert_eq!(batch, before);
        restamp(&mut batch, stamp_of(5));
        assert_eq!(batch, before);
        // Only the low 32 bits are stamped.
        assert_eq!(stamp_of((1 << 32) + 5), 5);
    }

    #[test]
    fn a_huge_tag_count_is_malformed_not_an_allocation() {
        let mut buf = Vec::new();
        let record = Record::StoreMessage(StoreMessage { channel: b"c", sequence: 1, content: Content::default() });
        encode(&record, 1, &mut buf).unwrap();
        // The tag count sits just before the trailing timestamp.
        let at = buf.len() - 8 - 4;
        buf[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&buf[8..]);
        buf[4..8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&buf), Err(DecodeError::Malformed));
    }

    #[test]
    fn a_record_one_byte_over_the_limit_is_refused_and_leaves_the_buffer() {
        // Zeroed pages are not touched (encode refuses before copying), so this costs no RSS.
        let channel = vec![0u8; MAX_RECORD_BYTES - HEADER_BYTES - 12 + 1];
        let record = Record::QueueSettle(QueueSettle { channel: &channel, seq: 1, settlement: Settlement::Ack });
        assert_eq!(encoded_len(&record), MAX_RECORD_BYTES + 1);
        let mut buf = b"earlier".to_vec();
        assert_eq!(encode(&record, 1, &mut buf), Err(TooLarge));
        assert_eq!(buf, b"earlier");
    }

    #[test]
    fn a_length_out_of_bounds_is_refused_before_it_is_used() {
        let header = |length: usize| {
            let mut h = MAGIC.to_vec();
            h.extend_from_slice(&[0; 4]);
            h.extend_from_slice(&(length as u32).to_le_bytes());
            h.extend_from_slice(&[VERSION, 1]);
            h
        };
        assert_eq!(frame_len(&header(MAX_RECORD_BYTES - 12 + 1)), Err(DecodeError::BadLength));
        assert_eq!(frame_len(&header(u32::MAX as usize)), Err(DecodeError::BadLength));
        assert_eq!(frame_len(&header(1)), Err(DecodeError::BadLength));
        // In bounds but longer than the bytes there: a torn record, not a bad one.
        assert_eq!(frame_len(&header(MAX_RECORD_BYTES - 12)), Err(DecodeError::Truncated));
    }

    /// Owned inputs for a generated record (proptest strategies cannot hand out borrows).
    #[derive(Debug, Clone)]
    struct Fields {
        kind: u8,
        strings: Vec<Vec<u8>>,
        tags: Vec<(Vec<u8>, Vec<u8>)>,
        numbers: (u64, i64, i64, u32, i64),
        options: (bool, bool),
    }

    fn fields() -> impl Strategy<Value = Fields> {
        let string = || proptest::collection::vec(any::<u8>(), 0..40);
        (
            0u8..6,
            proptest::collection::vec(string(), 7),
            proptest::collection::vec((string(), string()), 0..5),
            any::<(u64, i64, i64, u32, i64)>(),
            any::<(bool, bool)>(),
        )
            .prop_map(|(kind, strings, tags, numbers, options)| Fields { kind, strings, tags, numbers, options })
    }

    fn build(f: &Fields) -> Record<'_> {
        let s = |i: usize| f.strings[i].as_slice();
        let (seq, a, b, n, ts) = f.numbers;
        let content = Content {
            id: s(1),
            client_id: s(2),
            metadata: s(3),
            body: s(4),
            tags: f.tags.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect(),
            timestamp_ns: ts,
        };
        let settle = |settlement| Record::QueueSettle(QueueSettle { channel: s(0), seq, settlement });
        match f.kind {
            0 => Record::QueueMessage(QueueMessage {
                channel: s(0),
                seq,
                content,
                expires_at_ns: a,
                delayed_to_ns: b,
                max_receive: n,
                dead_letter: f.options.0.then(|| s(5)),
                rerouted_from: f.options.1.then(|| s(6)),
            }),
            1 => settle(Settlement::Ack),
            2 => settle(Settlement::Requeue { receive_count: n }),
            3 => settle(Settlement::DeadLetter { target: f.options.0.then(|| s(5)) }),
            4 => Record::StoreMessage(StoreMessage { channel: s(0), sequence: seq, content }),
            _ => Record::StoreDelete { channel: s(0) },
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
            let _ = frame_len(&bytes);
        }

        #[test]
        fn decode_never_panics_behind_a_valid_magic(rest in proptest::collection::vec(any::<u8>(), 0..512)) {
            // Arbitrary bytes rarely start with the magic; put it there so the length and
            // checksum paths are exercised too.
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&rest);
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_fields_behind_a_good_checksum(kind in 0u8..8, rest in proptest::collection::vec(any::<u8>(), 0..512)) {
            // A good checksum over garbage fields: reaches the field reader.
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&[0; 4]);
            bytes.extend_from_slice(&(2 + rest.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&[VERSION, kind]);
            bytes.extend_from_slice(&rest);
            // Also as version 1 (half the time), whose fields start four bytes earlier.
            if rest.first().is_some_and(|b| b & 1 == 1) {
                bytes[12] = VERSION_1;
            }
            let crc = crc32c::crc32c(&bytes[8..]);
            bytes[4..8].copy_from_slice(&crc.to_le_bytes());
            let _ = decode(&bytes);
        }

        #[test]
        fn encode_then_decode_is_the_identity(f in fields(), stamp in any::<u32>(), junk in proptest::collection::vec(any::<u8>(), 0..16)) {
            let record = build(&f);
            let mut buf = Vec::new();
            encode(&record, stamp, &mut buf).unwrap();
            prop_assert_eq!(frame(&buf).unwrap().stamp, Some(stamp));
            let len = buf.len();
            prop_assert_eq!(len, encoded_len(&record));
            // Bytes after the record (the next one) are not consumed.
            buf.extend_from_slice(&junk);
            prop_assert_eq!(decode(&buf), Ok((record, len)));
        }
    }
}
