//! KubeMQ access-control rules (`--authz-file`): a JSON list of
//! `{"ClientID": regex, "Events": bool, "EventsStore": bool, "Queues": bool, "Commands": bool,
//! "Queries": bool, "Channel": regex, "Read": bool, "Write": bool}`. A request is allowed when
//! some rule matches its client id, pattern, channel and access; with rules loaded, nothing
//! else is. Each regex must match the whole value (it is anchored: `orders` does not allow
//! `orders-archive`; write `orders.*` for that); a missing regex field matches everything.
//!
//! The rule set is shared by every core and the gRPC API behind an [`ArcSwap`], replaced as a
//! whole on SIGHUP ([`Authz::reload`]); a bump of [`Authz::generation`] tells connections
//! that cached decisions are stale.
use crate::model::Pattern;
use arc_swap::ArcSwap;
use regex::Regex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a request does to a channel: SUBSCRIBE (and gRPC subscribe/receive) = Read,
/// SEND (and gRPC send, RPC requests) = Write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(rename = "ClientID", default)]
    client_id: Option<String>,
    #[serde(rename = "Events", default)]
    events: bool,
    #[serde(rename = "EventsStore", default)]
    events_store: bool,
    #[serde(rename = "Queues", default)]
    queues: bool,
    #[serde(rename = "Commands", default)]
    commands: bool,
    #[serde(rename = "Queries", default)]
    queries: bool,
    #[serde(rename = "Channel", default)]
    channel: Option<String>,
    #[serde(rename = "Read", default)]
    read: bool,
    #[serde(rename = "Write", default)]
    write: bool,
}

struct Rule {
    client_id: Option<Regex>,
    channel: Option<Regex>,
    patterns: [bool; 5],
    read: bool,
    write: bool,
}

/// A parsed, compiled rule list.
pub struct RuleSet {
    rules: Vec<Rule>,
}

fn pattern_index(p: Pattern) -> Option<usize> {
    match p {
        Pattern::Events => Some(0),
        Pattern::EventsStore => Some(1),
        Pattern::Queues => Some(2),
        Pattern::Commands => Some(3),
        Pattern::Queries => Some(4),
        Pattern::Reply => None,
    }
}

fn anchored(field: &str, n: usize, re: Option<String>) -> Result<Option<Regex>, String> {
    re.map(|r| Regex::new(&format!("^(?:{r})$")).map_err(|e| format!("rule {n}: {field} is not a valid regex: {}", e.to_string().lines().last().unwrap_or(""))))
        .transpose()
}

impl RuleSet {
    /// Parses a rule file's text. `Err` is a one-line reason.
    ///
    /// # Errors
    /// Not a JSON list of rule objects, an unknown field, or a regex that does not compile.
    pub fn parse(text: &str) -> Result<RuleSet, String> {
        let raw: Vec<RawRule> = serde_json::from_str(text).map_err(|e| format!("not a JSON list of access rules: {e}"))?;
        let rules = raw
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                Ok(Rule {
                    client_id: anchored("ClientID", i + 1, r.client_id)?,
                    channel: anchored("Channel", i + 1, r.channel)?,
                    patterns: [r.events, r.events_store, r.queues, r.commands, r.queries],
                    read: r.read,
                    write: r.write,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(RuleSet { rules })
    }

    /// Whether `client_id` may do `access` on `channel` of `pattern`. `/reply/` destinations
    /// are never asked about (they are local to one connection and always allowed).
    pub fn allows(&self, client_id: &str, pattern: Pattern, channel: &str, access: Access) -> bool {
        let Some(p) = pattern_index(pattern) else { return true };
        self.rules.iter().any(|r| {
            r.patterns[p]
                && match access {
                    Access::Read => r.read,
                    Access::Write => r.write,
                }
                && r.client_id.as_ref().is_none_or(|re| re.is_match(client_id))
                && r.channel.as_ref().is_none_or(|re| re.is_match(channel))
        })
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// The live rule set of `--authz-file`, reloadable.
pub struct Authz {
    path: PathBuf,
    rules: ArcSwap<RuleSet>,
    generation: AtomicU64,
}

impl Authz {
    /// Loads `path`.
    ///
    /// # Errors
    /// The file cannot be read or is not a valid rule list (the reason names the file).
    pub fn load(path: &Path) -> Result<Authz, String> {
        let rules = read_rules(path)?;
        Ok(Authz { path: path.to_path_buf(), rules: ArcSwap::from_pointee(rules), generation: AtomicU64::new(1) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-reads the file (SIGHUP). A bad file is refused and the rules in force stay; either
    /// way the outcome is logged. Returns the number of rules now in force, or the reason.
    ///
    /// # Errors
    /// As [`Authz::load`]; nothing changes then.
    pub fn reload(&self) -> Result<usize, String> {
        match read_rules(&self.path) {
            Ok(rules) => {
                let n = rules.len();
                self.rules.store(Arc::new(rules));
                self.generation.fetch_add(1, Ordering::Release);
                tracing::info!(file = %self.path.display(), rules = n, "authorization rules reloaded");
                Ok(n)
            }
            Err(reason) => {
                tracing::error!(file = %self.path.display(), %reason, "authorization rules not reloaded; the previous rules stay in force");
                Err(reason)
            }
        }
    }

    /// Changes whenever the rules do: a connection's cached decisions are valid while this
    /// stays what it was when they were made. One relaxed-ish load of a rarely written word.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Decides from the rules in force now (a regex pass: callers cache the answer).
    pub fn allows(&self, client_id: &str, pattern: Pattern, channel: &str, access: Access) -> bool {
        self.rules.load().allows(client_id, pattern, channel, access)
    }
}

fn read_rules(path: &Path) -> Result<RuleSet, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    RuleSet::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Access::{Read, Write};
    use Pattern::*;

    const RULES: &str = r#"[
        {"ClientID": "alice", "Queues": true, "Channel": "orders\\..*", "Read": true, "Write": true},
        {"ClientID": "bob", "Events": true, "EventsStore": true, "Channel": "news", "Read": true},
        {"ClientID": "svc-.*", "Commands": true, "Queries": true, "Channel": "rpc\\.[a-z]+", "Write": true},
        {"ClientID": "watcher", "Events": true, "Channel": "metrics\\.>", "Read": true}
    ]"#;

    #[test]
    fn each_decision_of_the_table() {
        let rs = RuleSet::parse(RULES).unwrap();
        let cases: &[(&str, Pattern, &str, Access, bool)] = &[
            ("alice", Queues, "orders.eu", Read, true),
            ("alice", Queues, "orders.eu", Write, true),
            ("alice", Events, "orders.eu", Read, false),
            ("alice", Queues, "orders", Read, false),
            ("alice", Queues, "x.orders.eu", Read, false),
            ("alicex", Queues, "orders.eu", Read, false),
            ("bob", Events, "news", Read, true),
            ("bob", EventsStore, "news", Read, true),
            ("bob", Events, "news", Write, false),
            ("bob", Events, "news2", Read, false),
            ("svc-a", Commands, "rpc.pay", Write, true),
            ("svc-a", Queries, "rpc.pay", Write, true),
            ("svc-a", Commands, "rpc.pay", Read, false),
            ("svc-a", Commands, "rpc.Pay", Write, false),
            ("watcher", Events, "metrics.>", Read, true),
            ("watcher", Events, "metrics.*", Read, false),
            ("watcher", Events, ">", Read, false),
            ("nobody", Events, "news", Read, false),
            ("nobody", Reply, "anything", Read, true),
        ];
        for &(id, p, ch, a, want) in cases {
            assert_eq!(rs.allows(id, p, ch, a), want, "{id} {p:?} {ch} {a:?}");
        }
    }

    #[test]
    fn missing_regex_fields_match_everything_and_empty_list_allows_nothing() {
        let rs = RuleSet::parse(r#"[{"Events": true, "Read": true}]"#).unwrap();
        assert!(rs.allows("anyone", Events, "any.thing", Read));
        assert!(!rs.allows("anyone", Events, "any.thing", Write));
        let none = RuleSet::parse("[]").unwrap();
        assert!(!none.allows("anyone", Events, "a", Read));
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        for (text, says) in [
            ("{", "not a JSON list"),
            (r#"{"ClientID": "a"}"#, "not a JSON list"),
            (r#"[{"ClientID": "("}]"#, "rule 1: ClientID is not a valid regex"),
            (r#"[{"Read": true}, {"Channel": "[z-a]"}]"#, "rule 2: Channel is not a valid regex"),
            (r#"[{"Reed": true}]"#, "unknown field"),
            (r#"[{"Read": "yes"}]"#, "not a JSON list"),
        ] {
            let err = RuleSet::parse(text).err().unwrap_or_else(|| panic!("{text} parsed"));
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn reload_swaps_rules_and_a_broken_file_keeps_the_old_ones() {
        let path = std::env::temp_dir().join(format!("stompgate-acl-{}.json", std::process::id()));
        std::fs::write(&path, r#"[{"Events": true, "Channel": "a", "Read": true}]"#).unwrap();
        let authz = Authz::load(&path).unwrap();
        let g0 = authz.generation();
        assert!(authz.allows("x", Events, "a", Read));
        std::fs::write(&path, r#"[{"Events": true, "Channel": "b", "Read": true}]"#).unwrap();
        assert_eq!(authz.reload(), Ok(1));
        assert!(authz.generation() > g0);
        assert!(!authz.allows("x", Events, "a", Read));
        assert!(authz.allows("x", Events, "b", Read));
        let g1 = authz.generation();
        std::fs::write(&path, "[{").unwrap();
        assert!(authz.reload().is_err());
        assert_eq!(authz.generation(), g1);
        assert!(authz.allows("x", Events, "b", Read));
        std::fs::remove_file(&path).unwrap();
    }
}
