//! The server side of the WebSocket opening handshake (RFC 6455 section 4.2): read one HTTP
//! request head (bounded), check path, `Origin` and upgrade headers, answer 101 with the
//! chosen STOMP subprotocol, or a clean HTTP error and close.
use super::{Settings, WsStream};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tungstenite::handshake::machine::TryParse;
use tungstenite::handshake::server::{create_response, write_response, Request};
use tungstenite::http::{header, HeaderValue, Response, StatusCode};
use tungstenite::protocol::Role;

/// The largest request head accepted (browsers send well under 2 KiB).
const MAX_HEAD: usize = 8 * 1024;

/// The STOMP subprotocols, best first.
const SUBPROTOCOLS: [&str; 3] = ["v12.stomp", "v11.stomp", "v10.stomp"];

/// Why a handshake was refused; the status answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400: not a well-formed WebSocket upgrade request (or a head too large).
    BadRequest,
    /// 403: `Origin` not in `--ws-allowed-origins`.
    Forbidden,
    /// 404: another path than `--ws-path`.
    NotFound,
    /// 426: a plain HTTP request, without `Upgrade: websocket`.
    UpgradeRequired,
}

impl Refusal {
    fn status(self) -> StatusCode {
        match self {
            Refusal::BadRequest => StatusCode::BAD_REQUEST,
            Refusal::Forbidden => StatusCode::FORBIDDEN,
            Refusal::NotFound => StatusCode::NOT_FOUND,
            Refusal::UpgradeRequired => StatusCode::UPGRADE_REQUIRED,
        }
    }
}

/// Why a handshake did not complete.
#[derive(Debug)]
pub enum Failed {
    Refused(Refusal),
    Io(std::io::Error),
}

/// Runs the handshake on `stream`; on success the WebSocket, ready for STOMP. A refused
/// request gets its HTTP error (with `Connection: close`) before the error is returned.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, settings: &Settings) -> Result<WsStream<S>, Failed> {
    let (request, head_len, mut buf) = read_request(&mut stream).await?;
    let response = match respond(request.as_ref(), settings) {
        Ok(response) => response,
        Err(refusal) => {
            let _ = write_refusal(&mut stream, refusal).await;
            return Err(Failed::Refused(refusal));
        }
    };
    let mut head = Vec::with_capacity(256);
    write_response(&mut head, &response).map_err(|e| Failed::Io(std::io::Error::other(e)))?;
    stream.write_all(&head).await.map_err(Failed::Io)?;
    stream.flush().await.map_err(Failed::Io)?;
    // Bytes after the head (a client that did not wait for the 101) are the first frames.
    let rest = buf.split_off(head_len);
    let (stream, read) = super::stream::Metered::new(stream);
    let ws = async_tungstenite::WebSocketStream::from_partially_read(stream, rest, Role::Server, Some(settings.websocket_config())).await;
    Ok(WsStream::new(ws, read))
}

/// Reads until one whole request head is in; `None` if it does not parse as an HTTP request
/// (answered 400). Returns the head's length and everything read.
async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(Option<Request>, usize, Vec<u8>), Failed> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(Failed::Io)?;
        if n == 0 {
            return Err(Failed::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        buf.extend_from_slice(&chunk[..n]);
        match Request::try_parse(&buf) {
            Ok(Some((len, request))) => return Ok((Some(request), len, buf)),
            Ok(None) if buf.len() < MAX_HEAD => {}
            // Too large, or not HTTP (wrong method or version included).
            _ => return Ok((None, buf.len(), buf)),
        }
    }
}

/// The 101 response for an acceptable request, or why it is refused.
fn respond(request: Option<&Request>, settings: &Settings) -> Result<Response<()>, Refusal> {
    let request = request.ok_or(Refusal::BadRequest)?;
    if request.uri().path() != settings.path {
        return Err(Refusal::NotFound);
    }
    if !origin_allowed(request.headers().get(header::ORIGIN), &settings.allowed_origins) {
        return Err(Refusal::Forbidden);
    }
    let upgrade = request.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok());
    if !upgrade.is_some_and(|u| u.split(',').any(|p| p.trim().eq_ignore_ascii_case("websocket"))) {
        return Err(Refusal::UpgradeRequired);
    }
    let mut response = create_response(request).map_err(|_| Refusal::BadRequest)?;
    if let Some(chosen) = choose_subprotocol(request).and_then(|p| HeaderValue::from_str(p).ok()) {
        response.headers_mut().insert(header::SEC_WEBSOCKET_PROTOCOL, chosen);
    }
    Ok(response)
}

/// The highest STOMP subprotocol among those the client offered (in any of its
/// `Sec-WebSocket-Protocol` headers), if any, spelled exactly as the client offered it: the
/// match ignores ASCII case, but a browser fails a handshake whose answer is not, byte for
/// byte, one of its offers.
fn choose_subprotocol(request: &Request) -> Option<&str> {
    let offered: Vec<&str> =
        request.headers().get_all(header::SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim).collect();
    SUBPROTOCOLS.into_iter().find_map(|p| offered.iter().copied().find(|o| o.eq_ignore_ascii_case(p)))
}

/// No list: any origin. A request without `Origin` is not from a browser (browsers always
/// send it on WebSocket handshakes), so the cross-site check does not apply to it.
fn origin_allowed(origin: Option<&HeaderValue>, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let Some(origin) = origin else { return true };
    let Ok(origin) = origin.to_str() else { return false };
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    allowed.contains(&origin)
}

async fn write_refusal<S: AsyncWrite + Unpin>(stream: &mut S, refusal: Refusal) -> std::io::Result<()> {
    let mut response = Response::builder().status(refusal.status()).header(header::CONNECTION, "close").header(header::CONTENT_LENGTH, "0");
    if refusal == Refusal::UpgradeRequired {
        response = response.header(header::UPGRADE, "websocket").header(header::SEC_WEBSOCKET_VERSION, "13");
    }
    let response = response.body(()).map_err(std::io::Error::other)?;
    let mut head = Vec::with_capacity(128);
    write_response(&mut head, &response).map_err(std::io::Error::other)?;
    stream.write_all(&head).await?;
    stream.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(protocols: &[&str]) -> Request {
        let mut b = Request::builder().uri("/ws");
        for p in protocols {
            b = b.header(header::SEC_WEBSOCKET_PROTOCOL, *p);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn the_highest_offered_stomp_subprotocol_is_chosen() {
        assert_eq!(choose_subprotocol(&request(&["v10.stomp, v12.stomp, v11.stomp"])), Some("v12.stomp"));
        assert_eq!(choose_subprotocol(&request(&["v10.stomp", "v11.stomp"])), Some("v11.stomp"));
        assert_eq!(choose_subprotocol(&request(&["mqtt, v10.stomp"])), Some("v10.stomp"));
        // Answered as offered: never a spelling the client did not send.
        assert_eq!(choose_subprotocol(&request(&["V12.STOMP, v11.stomp"])), Some("V12.STOMP"));
    }

    #[test]
    fn no_subprotocol_is_chosen_that_was_not_offered() {
        assert_eq!(choose_subprotocol(&request(&[])), None);
        assert_eq!(choose_subprotocol(&request(&["mqtt", "v13.stomp"])), None);
    }

    #[test]
    fn origins() {
        let allowed = vec!["https://app.example.com".to_string()];
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert!(origin_allowed(Some(&v("https://evil.example")), &[]), "no list: any origin");
        assert!(origin_allowed(Some(&v("https://APP.example.com/")), &allowed));
        assert!(!origin_allowed(Some(&v("https://evil.example")), &allowed));
        assert!(!origin_allowed(Some(&v("null")), &allowed));
        assert!(origin_allowed(None, &allowed), "not a browser");
    }
}
