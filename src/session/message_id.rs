//! `q<owner>-<tag>`: the `message-id` (and 1.2 `ack`) of a queue delivery. It names the core
//! that delivered it and that core's delivery tag, which is all an ACK or NACK needs.
use crate::mesh::msg::CoreId;
use crate::stomp::frame::decimal;

/// Longest id [`write_queue`] writes (two 20-digit numbers, `q` and `-`).
pub const MAX_LEN: usize = 48;

/// Writes the id of delivery `tag` from core `owner` into `buf`; returns the written part.
pub fn write_queue(buf: &mut [u8; MAX_LEN], owner: CoreId, tag: u64) -> &[u8] {
    let mut n = itoa::Buffer::new();
    let mut len = 0;
    let mut put = |part: &[u8]| {
        buf[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    };
    put(b"q");
    put(n.format(owner.index()).as_bytes());
    put(b"-");
    put(n.format(tag).as_bytes());
    &buf[..len]
}

/// Parses `q<owner>-<tag>` back; `None` for any other id (events ids, garbage).
pub fn parse_queue(id: &[u8]) -> Option<(CoreId, u64)> {
    let rest = id.strip_prefix(b"q")?;
    let dash = memchr::memchr(b'-', rest)?;
    let owner = CoreId(usize::try_from(decimal(&rest[..dash])?).ok()?);
    Some((owner, decimal(&rest[dash + 1..])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_message_id_round_trips() {
        let mut buf = [0u8; MAX_LEN];
        let id = write_queue(&mut buf, CoreId(3), 12345).to_vec();
        assert_eq!(id, b"q3-12345");
        assert_eq!(parse_queue(&id), Some((CoreId(3), 12345)));
        let mut buf = [0u8; MAX_LEN];
        let id = write_queue(&mut buf, CoreId(usize::MAX), u64::MAX).to_vec();
        assert_eq!(parse_queue(&id), Some((CoreId(usize::MAX), u64::MAX)));
        assert_eq!(parse_queue(b"x3-1"), None);
        assert_eq!(parse_queue(b"q3"), None);
        assert_eq!(parse_queue(b"q-1"), None);
        assert_eq!(parse_queue(b"q3-+1"), None, "digits only");
        assert_eq!(parse_queue(b"q3-18446744073709551616"), None);
    }
}
