//! KubeMQ JWT verification with the `jsonwebtoken` crate (ring backend). The key is either an
//! HMAC secret (HS*) or a PEM public key (RS*, ES*); the algorithm is fixed by configuration,
//! so a token that names another one (or `none`) is refused before its signature is looked at.
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use std::path::{Path, PathBuf};

/// `--auth-jwt-alg`, as KubeMQ names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JwtAlg {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    ES256,
    ES384,
}

impl JwtAlg {
    pub const NAMES: &'static str = "HS256, HS384, HS512, RS256, RS384, RS512, ES256, ES384";

    pub fn parse(s: &str) -> Option<JwtAlg> {
        Some(match s.trim() {
            "HS256" => JwtAlg::HS256,
            "HS384" => JwtAlg::HS384,
            "HS512" => JwtAlg::HS512,
            "RS256" => JwtAlg::RS256,
            "RS384" => JwtAlg::RS384,
            "RS512" => JwtAlg::RS512,
            "ES256" => JwtAlg::ES256,
            "ES384" => JwtAlg::ES384,
            _ => return None,
        })
    }

    fn algorithm(self) -> Algorithm {
        match self {
            JwtAlg::HS256 => Algorithm::HS256,
            JwtAlg::HS384 => Algorithm::HS384,
            JwtAlg::HS512 => Algorithm::HS512,
            JwtAlg::RS256 => Algorithm::RS256,
            JwtAlg::RS384 => Algorithm::RS384,
            JwtAlg::RS512 => Algorithm::RS512,
            JwtAlg::ES256 => Algorithm::ES256,
            JwtAlg::ES384 => Algorithm::ES384,
        }
    }
}

/// Verifies tokens against one key and one algorithm.
pub struct JwtVerifier {
    key_file: PathBuf,
    alg: JwtAlg,
    key: DecodingKey,
    validation: Validation,
}

/// The claims that name the client: KubeMQ's `ClientID`, else the standard `sub`.
#[derive(serde::Deserialize)]
struct Identity {
    #[serde(rename = "ClientID")]
    client_id: Option<String>,
    sub: Option<String>,
}

/// Longest client id taken from a token (KubeMQ's connectors cap it at 256).
const MAX_CLIENT_ID: usize = 256;

impl JwtVerifier {
    /// Reads the key file: the secret's bytes for HS* (one trailing newline, as `echo` leaves,
    /// is dropped), a PEM public key for RS*/ES*.
    ///
    /// # Errors
    /// The file cannot be read, is empty, or is not a PEM key of the algorithm's kind.
    pub fn load(key_file: &Path, alg: JwtAlg) -> Result<JwtVerifier, String> {
        let bytes = std::fs::read(key_file).map_err(|e| format!("cannot read {}: {e}", key_file.display()))?;
        JwtVerifier::from_key(key_file, &bytes, alg)
    }

    /// As [`JwtVerifier::load`], with the file's contents given.
    ///
    /// # Errors
    /// As [`JwtVerifier::load`].
    pub fn from_key(key_file: &Path, bytes: &[u8], alg: JwtAlg) -> Result<JwtVerifier, String> {
        let bad = |e: jsonwebtoken::errors::Error| format!("{} is not a usable {alg:?} key: {e}", key_file.display());
        let key = match alg {
            JwtAlg::HS256 | JwtAlg::HS384 | JwtAlg::HS512 => {
                let secret = bytes.strip_suffix(b"\n").unwrap_or(bytes);
                let secret = secret.strip_suffix(b"\r").unwrap_or(secret);
                if secret.is_empty() {
                    return Err(format!("{} is empty: an HMAC secret is needed", key_file.display()));
                }
                DecodingKey::from_secret(secret)
            }
            JwtAlg::RS256 | JwtAlg::RS384 | JwtAlg::RS512 => DecodingKey::from_rsa_pem(bytes).map_err(bad)?,
            JwtAlg::ES256 | JwtAlg::ES384 => DecodingKey::from_ec_pem(bytes).map_err(bad)?,
        };
        let mut validation = Validation::new(alg.algorithm());
        // `exp` is required and checked, `nbf` checked when present; a few seconds of clock
        // skew between the token's issuer and this host are forgiven.
        validation.set_required_spec_claims(&["exp"]);
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.leeway = 5;
        // KubeMQ tokens carry no audience the gateway could check.
        validation.validate_aud = false;
        Ok(JwtVerifier { key_file: key_file.to_path_buf(), alg, key, validation })
    }

    pub fn key_file(&self) -> &Path {
        &self.key_file
    }

    pub fn alg(&self) -> JwtAlg {
        self.alg
    }

    /// Verifies `token`: `Ok(id)` is its `ClientID` claim, else its `sub`. `Err` is the
    /// reason, for the log only.
    ///
    /// A valid token must name its client: the identity authorization judges comes from the
    /// token alone, never from what the client says of itself (a STOMP `login`, a gRPC
    /// request's `ClientID`), or any holder of a nameless token could pick whose rules apply.
    ///
    /// # Errors
    /// Garbage, another algorithm (`none` included), a bad signature, a missing or past `exp`,
    /// a future `nbf`, no usable `ClientID` or `sub` claim.
    pub fn verify(&self, token: &[u8]) -> Result<String, String> {
        let token = std::str::from_utf8(token).map_err(|_| "token is not UTF-8".to_string())?;
        let data = jsonwebtoken::decode::<Identity>(token.trim(), &self.key, &self.validation).map_err(|e| e.to_string())?;
        let usable = |id: &String| !id.is_empty() && id.len() <= MAX_CLIENT_ID && !id.chars().any(char::is_control);
        data.claims
            .client_id
            .filter(usable)
            .or(data.claims.sub.filter(usable))
            .ok_or_else(|| "the token names no client (no usable ClientID or sub claim)".to_string())
    }
}
