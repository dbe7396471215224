//! Pure STOMP protocol: bytes in, `Frame` out; server frames in, bytes out. No async, no
//! sockets, no runtime types.
pub mod decode;
pub mod encode;
pub mod error;
pub mod frame;
pub mod negotiate;
pub mod server;

pub use decode::{DecodeError, Decoded, Decoder, Limits, PartialFrames, PartialShare};
pub use encode::FrameWriter;
pub use error::WireError;
pub use frame::{Command, Frame, Headers, Version};
