//! Events wildcard filters: `*` matches one token, `>` one or more trailing tokens (NATS subject
//! semantics, which KubeMQ uses natively).

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Filter {
    raw: bytes::Bytes,
}

impl Filter {
    /// `filter` is the dotted form, e.g. `orders.*.eu` or `orders.>`.
    pub fn new(filter: bytes::Bytes) -> Self {
        Filter { raw: filter }
    }
    pub fn matches(&self, channel: &[u8]) -> bool {
        let _ = channel;
        todo!("router helper")
    }
}
