//! Events wildcard filters: `*` matches one token, `>` one or more trailing tokens (NATS subject
//! semantics, which KubeMQ uses natively).
//!
//! Tokens are the '.'-separated pieces of the dotted channel, split exactly as `<[u8]>::split`
//! does (so `a..b` has an empty middle token; the router never rejects those, and matching
//! treats an empty token like any other).
use bytes::Bytes;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Filter {
    raw: Bytes,
    /// No `*` / `>` token: matching is plain equality. Derived from `raw`, so the derived
    /// `Eq`/`Hash` stay consistent.
    literal: bool,
}

impl Filter {
    /// `filter` is the dotted form, e.g. `orders.*.eu` or `orders.>`.
    pub fn new(filter: Bytes) -> Self {
        let literal = !filter.split(|&b| b == b'.').any(|t| t == b"*" || t == b">");
        Filter { raw: filter, literal }
    }

    /// The dotted filter as given.
    pub fn as_bytes(&self) -> &[u8] {
        &self.raw
    }

    /// True when the filter has no wildcard token, i.e. it matches exactly one channel.
    pub fn is_literal(&self) -> bool {
        self.literal
    }

    /// Does `channel` (dotted) match? Allocation-free: both sides are walked token by token.
    ///
    /// A `>` that is not the final filter token is compared literally. The router never builds
    /// such a filter (it rejects it as `invalid destination`); treating it literally keeps this
    /// function total without guessing at a meaning.
    pub fn matches(&self, channel: &[u8]) -> bool {
        if self.literal {
            return self.raw.as_ref() == channel;
        }
        let mut f = self.raw.split(|&b| b == b'.').peekable();
        let mut c = channel.split(|&b| b == b'.');
        loop {
            match (f.next(), c.next()) {
                (None, None) => return true,
                // Tail match: this channel token exists, so ">" has its "one or more".
                (Some(b">"), Some(_)) if f.peek().is_none() => return true,
                (Some(b"*"), Some(_)) => {}
                (Some(ft), Some(ct)) if ft == ct => {}
                _ => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &'static str) -> Filter {
        Filter::new(Bytes::from_static(s.as_bytes()))
    }

    #[test]
    fn star_matches_exactly_one_token() {
        let x = f("a.*");
        assert!(x.matches(b"a.b"));
        assert!(x.matches(b"a.anything"));
        assert!(!x.matches(b"a"));
        assert!(!x.matches(b"a.b.c"));
        assert!(!x.matches(b"b.c"));
        let mid = f("orders.*.eu");
        assert!(mid.matches(b"orders.x.eu"));
        assert!(!mid.matches(b"orders.eu"));
        assert!(!mid.matches(b"orders.x.y.eu"));
        assert!(!mid.matches(b"orders.x.us"));
        let lead = f("*.b");
        assert!(lead.matches(b"a.b"));
        assert!(!lead.matches(b"b"));
        let only = f("*");
        assert!(only.matches(b"a"));
        assert!(!only.matches(b"a.b"));
    }

    #[test]
    fn gt_matches_one_or_more_trailing_tokens() {
        let x = f("a.>");
        assert!(x.matches(b"a.b"));
        assert!(x.matches(b"a.b.c"));
        assert!(!x.matches(b"a"));
        assert!(!x.matches(b"b.c"));
        let all = f(">");
        assert!(all.matches(b"a"));
        assert!(all.matches(b"a.b.c"));
        let mix = f("*.x.>");
        assert!(mix.matches(b"q.x.y"));
        assert!(mix.matches(b"q.x.y.z"));
        assert!(!mix.matches(b"q.x"));
        assert!(!mix.matches(b"q.y.z"));
    }

    #[test]
    fn seed_rows() {
        // `/topic/orders/*` subscriber receives on `orders.eu` (seed 000 callout).
        assert!(f("orders.*").matches(b"orders.eu"));
        assert!(f("orders.>").matches(b"orders.eu.de"));
        assert!(f("a.*.c").matches(b"a.b.c"));
        assert!(!f("a.*.c").matches(b"a.b.d"));
    }

    #[test]
    fn literal_filters() {
        let x = f("a.b");
        assert!(x.is_literal());
        assert!(x.matches(b"a.b"));
        assert!(!x.matches(b"a.b.c"));
        assert!(!x.matches(b"a"));
        // '*' inside a token is not a wildcard token.
        assert!(f("a*.b").is_literal());
        assert!(!f("a.*").is_literal());
        assert!(!f("a.>").is_literal());
        assert_eq!(f("a.>").as_bytes(), b"a.>");
    }

    #[test]
    fn non_final_gt_is_literal() {
        let x = f("a.>.b");
        assert!(!x.matches(b"a.x.b"));
        assert!(!x.matches(b"a.x.y.b"));
        assert!(x.matches(b"a.>.b"));
    }

    #[test]
    fn empty_tokens_are_tokens() {
        assert!(f("a.*.b").matches(b"a..b"));
        assert!(!f("a.*").matches(b"a"));
        assert!(f("a.>").matches(b"a."));
    }
}
