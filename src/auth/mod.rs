//! Authentication (KubeMQ JWTs, `--auth-jwt-key`) and per-channel authorization (KubeMQ ACL
//! rules, `--authz-file`), shared by the STOMP listener and the gRPC API. Both are off unless
//! configured.
//!
//! Nothing here does network I/O: the STOMP session reaches this module through its `Host`
//! (`session::Host::authenticate` / `authorize`), so the session stays pure, and the gRPC API
//! calls it from its interceptor and handlers. The JWT is verified once per STOMP connection
//! (at CONNECT) and once per gRPC call.
pub mod acl;
pub mod jwt;

pub use acl::{Access, Authz, RuleSet};
pub use jwt::{JwtAlg, JwtVerifier};

use std::sync::Arc;

/// A request refused by authentication or authorization. It carries no reason on purpose:
/// the wire only ever says `access denied` (the reason is logged where it is known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied;

/// The process's authentication and authorization, loaded at start-up. Cloning shares it.
/// Compared by the files it came from (so the configuration that holds it stays comparable).
#[derive(Clone, Default)]
pub struct Auth {
    pub jwt: Option<Arc<JwtVerifier>>,
    pub authz: Option<Arc<Authz>>,
}

impl Auth {
    /// Whether a CONNECT (or gRPC call) must carry a valid JWT.
    pub fn jwt_on(&self) -> bool {
        self.jwt.is_some()
    }

    /// A front-end's login: the JWT in `passcode` (STOMP's CONNECT passcode, AMQP's SASL PLAIN
    /// password), verified here with one audit line either way; `login` is only logged.
    /// `Ok(None)` when authentication is off; otherwise the token's client id (a token must
    /// name one: [`JwtVerifier::verify`]).
    /// `missing` is the logged reason when no passcode came.
    pub fn authenticate_passcode(
        &self,
        transport: &'static str,
        login: Option<&[u8]>,
        passcode: Option<&[u8]>,
        source: Option<std::net::SocketAddr>,
        missing: &str,
    ) -> Result<Option<bytes::Bytes>, Denied> {
        let Some(jwt) = &self.jwt else { return Ok(None) };
        let login = login.map(String::from_utf8_lossy).unwrap_or_default();
        match passcode.map(|p| jwt.verify(p)) {
            Some(Ok(id)) => {
                audit(true, transport, &id, source, "");
                Ok(Some(bytes::Bytes::from(id)))
            }
            Some(Err(reason)) => {
                audit(false, transport, &login, source, &reason);
                Err(Denied)
            }
            None => {
                audit(false, transport, &login, source, missing);
                Err(Denied)
            }
        }
    }
}

/// A small index for caching one (pattern, access) decision as a bit: pattern × 2 + write.
/// Shared by the per-connection (session) and per-stream (gRPC) decision caches.
pub fn decision_slot(pattern: crate::model::Pattern, access: Access) -> u32 {
    use crate::model::Pattern;
    let p = match pattern {
        Pattern::Events => 0,
        Pattern::EventsStore => 1,
        Pattern::Queues => 2,
        Pattern::Commands => 3,
        Pattern::Queries => 4,
        Pattern::Reply => 5,
    };
    p * 2 + u32::from(access == Access::Write)
}

impl PartialEq for Auth {
    fn eq(&self, other: &Auth) -> bool {
        let jwt = |a: &Auth| a.jwt.as_ref().map(|j| (j.key_file().to_path_buf(), j.alg()));
        let authz = |a: &Auth| a.authz.as_ref().map(|z| z.path().to_path_buf());
        jwt(self) == jwt(other) && authz(self) == authz(other)
    }
}

impl Eq for Auth {}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("jwt", &self.jwt.as_ref().map(|j| (j.key_file().display().to_string(), j.alg())))
            .field("authz", &self.authz.as_ref().map(|z| z.path().display().to_string()))
            .finish()
    }
}

/// The audit line of one authentication (issue 14, item 6): who, from where, how; never the
/// token. `transport` is `stomp` or `grpc`.
pub fn audit(ok: bool, transport: &'static str, client_id: &str, source: Option<std::net::SocketAddr>, reason: &str) {
    let source = source.map(|s| s.to_string()).unwrap_or_default();
    if ok {
        tracing::info!(target: "stompgate::audit", event = "auth.success", transport, client_id, source, mechanism = "jwt", "authenticated");
    } else {
        crate::telemetry::auth_failure(transport);
        tracing::warn!(target: "stompgate::audit", event = "auth.failure", transport, client_id, source, mechanism = "jwt", reason, "authentication failed");
    }
}
