//! Authentication and authorization of gRPC calls (issue 14).
//!
//! Authentication, in the interceptor, is one of: none; the static `--grpc-token` (compared
//! as is); or, with `--auth-jwt-key`, a KubeMQ JWT in the `authorization` metadata (a
//! `Bearer ` prefix is accepted), verified on every call — the same token a STOMP client puts
//! in `passcode`. The JWT replaces the static token: configuration refuses both at once.
//! Failure: UNAUTHENTICATED, with no detail beyond that.
//!
//! Authorization (`--authz-file`) is checked by the service on each call against the same
//! rules as STOMP ([`authorize`]): the client id is the JWT's (`ClientID`, else `sub`), else
//! the request's own `ClientID` field. Denial: PERMISSION_DENIED. On the three stream calls
//! whose channels come one message at a time, each message is checked ([`StreamAuthz`]) and a
//! denied one gets KubeMQ's in-band error result with the text `access denied`; the stream
//! goes on serving the others.
use crate::auth::{Access, Auth};
use crate::model::Pattern;
use ahash::AHashMap;
use std::sync::Arc;
use tonic::Status;

/// The client id a verified JWT named, put into the request's extensions by [`Authenticate`].
#[derive(Clone, Debug)]
pub struct CallIdentity(pub String);

/// The interceptor: refuses calls without the configured credential.
#[derive(Clone)]
pub struct Authenticate {
    pub token: Option<Arc<str>>,
    pub auth: Auth,
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(jwt) = &self.auth.jwt {
            let peer = req.remote_addr();
            let Some(given) = req.metadata().get("authorization").map(|v| v.as_bytes()) else {
                crate::auth::audit(false, "grpc", "", peer, "no authorization metadata");
                return Err(Status::unauthenticated("access denied"));
            };
            let token = given.strip_prefix(b"Bearer ").unwrap_or(given);
            return match jwt.verify(token) {
                Ok(id) => {
                    // One audit line per call would flood the log for unary traffic: only
                    // failures are logged here (STOMP logs both, once per connection).
                    req.extensions_mut().insert(CallIdentity(id));
                    Ok(req)
                }
                Err(reason) => {
                    crate::auth::audit(false, "grpc", "", peer, &reason);
                    Err(Status::unauthenticated("access denied"))
                }
            };
        }
        let Some(expected) = &self.token else { return Ok(req) };
        match req.metadata().get("authorization").map(|v| v.as_bytes()) {
            Some(given) if constant_time_eq(given, expected.as_bytes()) => Ok(req),
            Some(_) => Err(tonic::Status::unauthenticated("invalid authorization token")),
            None => Err(tonic::Status::unauthenticated("missing authorization token")),
        }
    }
}

/// Compares without an early exit, so response timing does not reveal a token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks one (pattern, channel, access) of a call against `--authz-file` (allowed when
/// authorization is off). `identity` is what the interceptor verified; `declared` the
/// request's own `ClientID` field, used only without a JWT.
///
/// # Errors
/// PERMISSION_DENIED `access denied`.
pub fn authorize(auth: &Auth, identity: Option<&CallIdentity>, declared: &str, pattern: Pattern, channel: &str, access: Access) -> Result<(), Status> {
    let Some(authz) = &auth.authz else { return Ok(()) };
    let client_id = identity.map_or(declared, |i| i.0.as_str());
    if authz.allows(client_id, pattern, channel, access) {
        return Ok(());
    }
    crate::telemetry::authz_denial("grpc");
    tracing::info!(target: "stompgate::audit", event = "authz.denied", transport = "grpc", client_id, ?pattern, channel, ?access, "access denied");
    Err(Status::permission_denied("access denied"))
}

/// One stream's authorization decisions (SendEventsStream, QueuesUpstream, QueuesDownstream):
/// each message is checked on its own, as a STOMP SEND is, and a denial answers that message
/// only. Decisions are cached per (client id, channel) as in `session::authz`, so a stream that
/// keeps writing to one channel pays a hash lookup per message, not a regex pass; the cache is
/// dropped when the rules' generation changes (SIGHUP reload).
pub struct StreamAuthz {
    auth: Auth,
    /// The verified JWT's client id; without one, each message's own `ClientID` is used.
    identity: Option<String>,
    generation: u64,
    /// client id → channel → bits: `1 << slot` known, `1 << (slot + 16)` allowed.
    decisions: AHashMap<String, AHashMap<String, u32>>,
    cached: usize,
}

/// Decisions remembered per stream; past it the cache starts over, so a stream that names ever
/// new channels (or client ids) holds bounded memory.
const MAX_CACHED: usize = 1024;

/// The text a denied stream message carries in its in-band error (nothing more on the wire).
pub const ACCESS_DENIED: &str = "access denied";

use crate::auth::decision_slot as slot;

impl StreamAuthz {
    /// For a stream call whose interceptor verified `identity` (if any).
    pub fn new(auth: &Auth, identity: Option<&CallIdentity>) -> StreamAuthz {
        StreamAuthz { auth: auth.clone(), identity: identity.map(|i| i.0.clone()), generation: 0, decisions: AHashMap::new(), cached: 0 }
    }

    /// Whether this stream's client may do `access` on `channel` of `pattern` (always, with
    /// authorization off). `declared` is the message's own `ClientID`, used only without a
    /// JWT. A denial is counted each time and logged once per cached decision.
    pub fn allows(&mut self, declared: &str, pattern: Pattern, channel: &str, access: Access) -> bool {
        let Some(authz) = &self.auth.authz else { return true };
        let generation = authz.generation();
        if generation != self.generation {
            self.decisions.clear();
            self.cached = 0;
            self.generation = generation;
        }
        let client_id = self.identity.as_deref().unwrap_or(declared);
        let s = slot(pattern, access);
        let known = self.decisions.get(client_id).and_then(|by_channel| by_channel.get(channel)).filter(|&&bits| bits & (1 << s) != 0);
        let allowed = match known {
            Some(&bits) => bits & (1 << (s + 16)) != 0,
            None => {
                let allowed = authz.allows(client_id, pattern, channel, access);
                if !allowed {
                    tracing::info!(target: "stompgate::audit", event = "authz.denied", transport = "grpc", client_id, ?pattern, channel, ?access, "stream message denied");
                }
                if self.cached >= MAX_CACHED {
                    self.decisions.clear();
                    self.cached = 0;
                }
                let by_channel = self.decisions.entry(client_id.to_string()).or_default();
                let bits = by_channel.entry(channel.to_string()).or_insert_with(|| {
                    self.cached += 1;
                    0
                });
                *bits |= (1 << s) | (u32::from(allowed) << (s + 16));
                allowed
            }
        };
        if !allowed {
            crate::telemetry::authz_denial("grpc");
        }
        allowed
    }

    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Authz;

    fn auth_with(rules: &str) -> (Auth, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("stompgate-stream-authz-{}-{}.json", std::process::id(), rules.len()));
        std::fs::write(&path, rules).unwrap();
        (Auth { jwt: None, authz: Some(Arc::new(Authz::load(&path).unwrap())) }, path)
    }

    #[test]
    fn each_message_is_decided_on_its_channel_client_and_access() {
        let (auth, path) = auth_with(r#"[{"ClientID": "a", "Queues": true, "Channel": "ok", "Read": true, "Write": true}]"#);
        let mut z = StreamAuthz::new(&auth, None);
        assert!(z.allows("a", Pattern::Queues, "ok", Access::Write));
        assert!(!z.allows("a", Pattern::Queues, "no", Access::Write));
        assert!(!z.allows("b", Pattern::Queues, "ok", Access::Write), "another declared client id");
        assert!(!z.allows("a", Pattern::Events, "ok", Access::Write), "another pattern");
        // Cached answers are the same answers.
        assert!(z.allows("a", Pattern::Queues, "ok", Access::Write));
        assert!(!z.allows("a", Pattern::Queues, "no", Access::Write));
        assert_eq!(z.cached(), 3, "(a, ok), (a, no), (b, ok)");
        // A verified identity overrides the declared one.
        let mut z = StreamAuthz::new(&auth, Some(&CallIdentity("a".into())));
        assert!(z.allows("b", Pattern::Queues, "ok", Access::Read));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_reload_drops_cached_decisions_and_the_cache_is_bounded() {
        let (auth, path) = auth_with(r#"[{"Queues": true, "Channel": "x", "Write": true}]"#);
        let mut z = StreamAuthz::new(&auth, None);
        assert!(z.allows("c", Pattern::Queues, "x", Access::Write));
        std::fs::write(&path, r#"[{"Queues": true, "Channel": "y", "Write": true}]"#).unwrap();
        auth.authz.as_ref().unwrap().reload().unwrap();
        assert!(!z.allows("c", Pattern::Queues, "x", Access::Write), "stale decision kept after reload");
        for i in 0..3 * MAX_CACHED {
            z.allows("c", Pattern::Queues, &format!("ch-{i}"), Access::Write);
        }
        assert!(z.cached() <= MAX_CACHED);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn without_rules_everything_is_allowed() {
        let mut z = StreamAuthz::new(&Auth::default(), None);
        assert!(z.allows("", Pattern::Queues, "anything", Access::Read));
    }
}
