//! STOMP over WebSocket (RFC 6455): the handshake ([`handshake`]) and the transport
//! ([`WsStream`]) that carries STOMP bytes in WebSocket messages. The WebSocket protocol
//! itself (frames, masking, fragmentation, ping/pong, close) is `tungstenite`'s, driven by
//! `async-tungstenite` over the connection's futures-io stream on the accepting core; the
//! HTTP request head is read and checked here because tungstenite's own accept answers a
//! refused handshake with nothing at all, where a client deserves 400, 403, 404 or 426.
//!
//! Choices (README, "STOMP over WebSocket"):
//! - Subprotocols `v12.stomp`, `v11.stomp`, `v10.stomp`: the highest one offered is answered,
//!   never one not offered; a client offering none (or only others) gets no subprotocol and
//!   still works. The STOMP version is CONNECT's `accept-version`, as over TCP.
//! - Text and binary messages both carry STOMP bytes: a frame may span messages and a message
//!   may hold several frames (the STOMP decoder sees one byte stream).
//! - Each write of the connection (one or more whole server frames, or a heart-beat) is one
//!   message: text when it is valid UTF-8, else binary.
//! - No permessage-deflate (the extension is not offered back, so clients send uncompressed).
//! - Sizes: a WebSocket frame or message larger than `--max-body-size` plus
//!   [`HEADERS_ALLOWANCE`] is refused by tungstenite before it is buffered, and the STOMP
//!   client gets ERROR `frame too large` (then the connection closes). What tungstenite holds
//!   of a message still arriving counts, as it grows, in the same process-wide
//!   `--partial-frames-budget` as the STOMP decoder's partial frames ([`BudgetGate`]), so many
//!   WebSockets each trickling a large message are bounded together as TCP connections are.
pub mod handshake;
mod stream;

pub use stream::{is_over_budget, is_too_large, BudgetGate, WsStream};

/// Room for a STOMP frame's command and headers on top of the largest body, in one message:
/// the decoder's header limit (64 KiB) and 1 KiB for the command and EOLs.
pub const HEADERS_ALLOWANCE: usize = 65 * 1024;

/// What every WebSocket listener checks, from the configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The path handshakes must ask for (`--ws-path`).
    pub path: String,
    /// Allowed `Origin`s, lower case without a trailing '/'; empty = any (`--ws-allowed-origins`).
    pub allowed_origins: Vec<String>,
    /// The largest WebSocket frame and message accepted.
    pub max_message: usize,
}

impl Settings {
    pub fn from_config(cfg: &crate::config::Config) -> Settings {
        Settings {
            path: cfg.ws_path.clone(),
            allowed_origins: cfg.ws_allowed_origins.clone(),
            max_message: cfg.max_body_size.saturating_add(HEADERS_ALLOWANCE),
        }
    }

    /// tungstenite's limits for one connection. A small read buffer: an idle connection
    /// should not hold tungstenite's default 128 KiB.
    fn websocket_config(&self) -> tungstenite::protocol::WebSocketConfig {
        tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(16 * 1024)
            .max_message_size(Some(self.max_message))
            .max_frame_size(Some(self.max_message))
    }
}
