//! The interception rules the gateway installs and owns: one nftables table and one policy
//! routing rule per address family.
//!
//! ```text
//! table inet wsx
//!   chain prerouting (filter hook, mangle priority)
//!     tcp, socket transparent 1                 -> mark, accept   packets of our sessions
//!     [iifname LAN] SYN, daddr not local,
//!       daddr in @remote4 / @remote6            -> tproxy to :port, mark, accept
//! ip rule: fwmark MARK lookup TABLE;  TABLE: local default dev lo
//! ```
//!
//! The first rule catches the packets of connections our transparent sockets own: replies to a
//! connection re-originated from a client's address, and the rest of an intercepted
//! connection. The mark sends them through `TABLE`, whose only route delivers everything
//! locally. The second hands new connections (a bare SYN) toward a remote prefix to the
//! listener. Only TCP is touched, so the tunnel's UDP and anything addressed to the gateway
//! itself (the API) pass untouched.
//!
//! [`Rules::install`] first removes what an earlier run may have left (it owns the table name,
//! the mark and the route table, so anything carrying them is its own), then applies the new
//! table in one `nft` transaction. [`Rules::update`] replaces the table atomically (a reload);
//! [`Rules::drain`] keeps only the first rule, so existing sessions finish while new
//! connections flow past untouched; [`Rules::remove`] removes everything.

use ipnet::IpNet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

/// The nftables table wsx owns.
pub const TABLE: &str = "wsx";

/// Where and how connections are intercepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesConfig {
    /// The port of the transparent listeners.
    pub port: u16,
    /// The firewall mark of intercepted packets.
    pub mark: u32,
    /// The route table that delivers marked packets locally.
    pub route_table: u32,
    /// The priority of the `ip rule` that selects it.
    pub rule_priority: u32,
    /// Interfaces new connections are intercepted on; empty means all.
    pub interfaces: Vec<String>,
    /// Destinations whose connections are intercepted.
    pub prefixes: Vec<IpNet>,
}

/// Errors from installing or removing rules.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RulesError {
    /// The program could not be run at all.
    #[error("running {program}: {source}")]
    Spawn {
        program: &'static str,
        source: std::io::Error,
    },
    /// The program ran and refused the change.
    #[error("{command} failed: {stderr}")]
    Failed { command: String, stderr: String },
}

/// The installed rules; see the module documentation.
#[derive(Debug)]
pub struct Rules {
    config: RulesConfig,
    /// Interception of new connections is paused (the gateway is at capacity).
    paused: bool,
}

impl Rules {
    /// Removes leftovers of an earlier run and installs the rules.
    pub fn install(config: RulesConfig) -> Result<Self, RulesError> {
        remove(&config);
        let rules = Self {
            config,
            paused: false,
        };
        rules.reinstall()?;
        Ok(rules)
    }

    /// Stops (`true`) or resumes intercepting new connections, as [`Rules::drain`] does,
    /// while keeping the rules' configuration: a gateway out of capacity lets new
    /// connections take the kernel's own route, unaccelerated, instead of refusing them.
    /// An [`update`](Rules::update) meanwhile keeps the pause.
    pub fn pause(&mut self, paused: bool) -> Result<(), RulesError> {
        if paused == self.paused {
            return Ok(());
        }
        nft(&self.script(if paused { Mode::Drain } else { Mode::Intercept }))?;
        self.paused = paused;
        Ok(())
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    pub fn config(&self) -> &RulesConfig {
        &self.config
    }

    /// Replaces the table with one for `config` in one transaction; the routing rule is
    /// changed only if its numbers changed.
    pub fn update(&mut self, config: RulesConfig) -> Result<(), RulesError> {
        let routing_changed = (config.mark, config.route_table, config.rule_priority)
            != (
                self.config.mark,
                self.config.route_table,
                self.config.rule_priority,
            );
        if routing_changed {
            remove(&self.config);
            self.config = config;
            return self.reinstall();
        }
        self.config = config;
        nft(&self.script(self.mode()))
    }

    fn mode(&self) -> Mode {
        if self.paused {
            Mode::Drain
        } else {
            Mode::Intercept
        }
    }

    fn reinstall(&self) -> Result<(), RulesError> {
        nft(&self.script(self.mode()))?;
        for family in ["-4", "-6"] {
            ip(&self.rule_args(family, "add"))?;
            ip(&self.route_args(family))?;
        }
        Ok(())
    }

    /// Stops intercepting new connections; packets of existing sessions still reach them.
    pub fn drain(&self) -> Result<(), RulesError> {
        nft(&self.script(Mode::Drain))
    }

    /// Removes everything [`Rules::install`] added.
    pub fn remove(self) {
        remove(&self.config);
    }

    /// The `nft -f` input that replaces the table.
    fn script(&self, mode: Mode) -> String {
        let c = &self.config;
        let mut s = String::new();
        // Adding first makes the delete succeed whether or not the table exists, so the whole
        // replacement is one transaction.
        let _ = writeln!(s, "add table inet {TABLE}\ndelete table inet {TABLE}");
        let _ = writeln!(s, "table inet {TABLE} {{");
        let (v4, v6): (Vec<&IpNet>, Vec<&IpNet>) =
            c.prefixes.iter().partition(|p| matches!(p, IpNet::V4(_)));
        for (name, kind, prefixes) in [("remote4", "ipv4_addr", &v4), ("remote6", "ipv6_addr", &v6)]
        {
            let _ = write!(s, "  set {name} {{ type {kind}; flags interval;");
            if !prefixes.is_empty() {
                let list: Vec<String> = prefixes.iter().map(|p| p.trunc().to_string()).collect();
                let _ = write!(s, " elements = {{ {} }};", list.join(", "));
            }
            let _ = writeln!(s, " }}");
        }
        let _ = writeln!(s, "  chain prerouting {{");
        let _ = writeln!(
            s,
            "    type filter hook prerouting priority mangle; policy accept;"
        );
        let _ = writeln!(
            s,
            "    meta l4proto tcp socket transparent 1 meta mark set {:#x} accept",
            c.mark
        );
        if mode == Mode::Intercept {
            let interfaces = match c.interfaces.as_slice() {
                [] => String::new(),
                names => {
                    let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
                    format!("iifname {{ {} }} ", quoted.join(", "))
                }
            };
            for (family, set) in [("ip", "remote4"), ("ip6", "remote6")] {
                let _ = writeln!(
                    s,
                    "    {interfaces}tcp flags & (fin | syn | rst | ack) == syn fib daddr type != local \
                     {family} daddr @{set} tproxy {family} to :{} meta mark set {:#x} accept",
                    c.port, c.mark
                );
            }
        }
        let _ = writeln!(s, "  }}\n}}");
        s
    }

    fn rule_args(&self, family: &'static str, verb: &'static str) -> Vec<String> {
        rule_args(&self.config, family, verb)
    }

    fn route_args(&self, family: &'static str) -> Vec<String> {
        let default = if family == "-4" { "0.0.0.0/0" } else { "::/0" };
        [
            family, "route", "replace", "local", default, "dev", "lo", "table",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([self.config.route_table.to_string()])
        .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Intercept,
    Drain,
}

fn rule_args(config: &RulesConfig, family: &'static str, verb: &'static str) -> Vec<String> {
    vec![
        family.into(),
        "rule".into(),
        verb.into(),
        "fwmark".into(),
        format!("{:#x}", config.mark),
        "lookup".into(),
        config.route_table.to_string(),
        "priority".into(),
        config.rule_priority.to_string(),
    ]
}

/// Removes the table, the routing rules and the route table of `config`, whichever exist.
/// Errors mean "not there" and are ignored.
pub fn remove(config: &RulesConfig) {
    let _ = nft(&format!("delete table inet {TABLE}\n"));
    for family in ["-4", "-6"] {
        // A crashed run may have been started more than once; remove every copy.
        for _ in 0..16 {
            if ip(&rule_args(config, family, "del")).is_err() {
                break;
            }
        }
        let _ = ip(&[
            family.into(),
            "route".into(),
            "flush".into(),
            "table".into(),
            config.route_table.to_string(),
        ]);
    }
}

fn nft(script: &str) -> Result<(), RulesError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RulesError::Spawn {
            program: "nft",
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|source| RulesError::Spawn {
                program: "nft",
                source,
            })?;
    }
    let output = child
        .wait_with_output()
        .map_err(|source| RulesError::Spawn {
            program: "nft",
            source,
        })?;
    check("nft -f -".into(), output)
}

fn ip(args: &[String]) -> Result<(), RulesError> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RulesError::Spawn {
            program: "ip",
            source,
        })?;
    check(format!("ip {}", args.join(" ")), output)
}

fn check(command: String, output: std::process::Output) -> Result<(), RulesError> {
    if output.status.success() {
        Ok(())
    } else {
        Err(RulesError::Failed {
            command,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RulesConfig {
        RulesConfig {
            port: 4501,
            mark: 0x7773,
            route_table: 119,
            rule_priority: 10119,
            interfaces: vec!["lan0".into()],
            prefixes: vec![
                "10.71.3.0/24".parse().unwrap_or_else(|e| panic!("{e}")),
                "fd57:5358:1ab:3::7/64"
                    .parse()
                    .unwrap_or_else(|e| panic!("{e}")),
            ],
        }
    }

    #[test]
    fn the_script_replaces_the_table_and_intercepts_only_syns_toward_the_prefixes() {
        let script = Rules {
            config: config(),
            paused: false,
        }
        .script(Mode::Intercept);
        assert!(script.starts_with("add table inet wsx\ndelete table inet wsx\n"));
        assert!(script.contains(
            "set remote4 { type ipv4_addr; flags interval; elements = { 10.71.3.0/24 }; }"
        ));
        // Host bits are cleared: nft refuses a prefix with them set.
        assert!(script.contains("elements = { fd57:5358:1ab:3::/64 }"));
        assert!(script.contains("socket transparent 1 meta mark set 0x7773 accept"));
        assert!(script.contains(
            "iifname { \"lan0\" } tcp flags & (fin | syn | rst | ack) == syn fib daddr type != local \
             ip daddr @remote4 tproxy ip to :4501 meta mark set 0x7773 accept"
        ));
        assert!(script.contains("ip6 daddr @remote6 tproxy ip6 to :4501"));
    }

    #[test]
    fn draining_keeps_only_the_rule_for_existing_sessions() {
        let script = Rules {
            config: config(),
            paused: false,
        }
        .script(Mode::Drain);
        assert!(script.contains("socket transparent 1"));
        assert!(!script.contains("tproxy"));
    }

    #[test]
    fn an_empty_family_gets_an_empty_set() {
        let mut c = config();
        c.prefixes.truncate(1);
        c.interfaces.clear();
        let script = Rules {
            config: c,
            paused: false,
        }
        .script(Mode::Intercept);
        assert!(script.contains("set remote6 { type ipv6_addr; flags interval; }"));
        assert!(script.contains("    tcp flags"));
    }

    #[test]
    fn routing_commands_name_the_mark_table_and_priority() {
        let rules = Rules {
            config: config(),
            paused: false,
        };
        assert_eq!(
            rules.rule_args("-6", "add").join(" "),
            "-6 rule add fwmark 0x7773 lookup 119 priority 10119"
        );
        assert_eq!(
            rules.route_args("-4").join(" "),
            "-4 route replace local 0.0.0.0/0 dev lo table 119"
        );
    }
}
