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
//! the request's own `ClientID` field. Denial: PERMISSION_DENIED.
use crate::auth::{Access, Auth};
use crate::model::Pattern;
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
                    if let Some(id) = id {
                        req.extensions_mut().insert(CallIdentity(id));
                    }
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

/// A call whose channels come one message at a time on a stream (SendEventsStream,
/// QueuesUpstream, QueuesDownstream) is not checked per message yet: with rules loaded it is
/// refused as a whole, so the rules are never bypassed through it.
///
/// # Errors
/// PERMISSION_DENIED when authorization is on.
pub fn refuse_unchecked_stream(auth: &Auth, call: &str) -> Result<(), Status> {
    match &auth.authz {
        None => Ok(()),
        Some(_) => {
            crate::telemetry::authz_denial("grpc");
            tracing::info!(target: "stompgate::audit", event = "authz.denied", transport = "grpc", call, "stream call refused: not checked per message with --authz-file");
            Err(Status::permission_denied("access denied"))
        }
    }
}
