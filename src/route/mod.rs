//! Destination routing and header ⇄ tag mapping (seeds 000/001). Pure functions.
pub mod channel;
pub mod destination;
pub mod tags;
pub mod wildcard;

pub use channel::{check_channel, ChannelError};
pub use destination::{parse_destination, write_egress_destination, DefaultPattern, Destination, DestinationError, Intent, MAX_DESTINATION_LEN};
pub use tags::{headers_to_tags, write_egress_tag_headers, TagError, MAX_CUSTOM_TAGS, MAX_TAG_VALUE_LEN};
pub use wildcard::Filter;
