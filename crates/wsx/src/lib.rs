//! The `wsx` binary: the gateway daemon (`wsx run`), its helper commands, and the CLI that
//! talks to a running gateway through its API.
//!
//! - `wsx run`: installs the interception rules, runs the gateway and its API, reloads on
//!   SIGHUP, drains on SIGTERM, tells systemd (Type=notify) when it is ready and stopping.
//! - `wsx check-config FILE`: parses and validates a file; errors name file, line, column
//!   and field.
//! - `wsx genkey` / `wsx pubkey`: keys in the base64 form the configuration takes, as
//!   WireGuard's `wg genkey` / `wg pubkey`; `wsx gentoken`: an API token.
//! - `wsx cleanup`: removes the rules a crashed run left (systemd's `ExecStopPost`), so
//!   that traffic flows unaccelerated.
//! - `wsx status`, `peers`, `sessions`, `session kill`, `bypass`, `config`, `log-level`: the
//!   API's client (the `cli` module).
//! - `wsx completions SHELL`: shell completions.
//!
//! Every command reads the configuration file given by `--config` (default
//! `/etc/wsx/wsx.toml`).
//!
//! The binary is [`main`]; this library target exists for it, for the packaging task
//! ([`command`] gives it the command line for man pages and completions) and, with the
//! `fuzzing` feature, for the fuzz targets of the configuration file and the API's edits
//! of it (the `fuzzing` module).

mod cli;
mod config;
mod control;
mod daemon;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod memory;

use anyhow::{Context, Result};
use base64::Engine;
use clap::{CommandFactory, Parser, Subcommand};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use wsx_tunnel::SecretKey;

/// wsx: a WAN accelerator gateway.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The configuration file: what `run` serves and `cleanup` removes the rules of, and
    /// where the commands that ask a running gateway find its API's address and token.
    #[arg(long, short, global = true, default_value = "/etc/wsx/wsx.toml")]
    config: PathBuf,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway.
    Run,
    /// Check a configuration file and exit.
    CheckConfig { file: PathBuf },
    /// Print a new private key (base64).
    Genkey,
    /// Read a private key on standard input and print its public key.
    Pubkey,
    /// Print a new API token (192 random bits, base64url).
    Gentoken,
    /// Remove the interception rules of the configuration (after a crash).
    Cleanup,
    /// Print shell completions (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    #[command(flatten)]
    Api(cli::ApiCommand),
}

/// The command line's definition: what the Debian package's man pages and shell
/// completions are made from (`cargo xtask deb`).
pub fn command() -> clap::Command {
    Cli::command()
}

/// The `wsx` command: parses the arguments, runs the command, reports an error on stderr.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run) {
        // The Rust runtime ignores SIGPIPE, so printing into a closed pipe (`wsx sessions |
        // head`) panics. A command-line tool should end quietly there, as the shell's own
        // do; the daemon keeps ignoring it (a closed socket is an error it handles).
        // SAFETY: setting a signal's disposition to its default before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wsx: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let config = cli.config.clone();
    match cli.command {
        Command::Run => daemon::run(&config),
        Command::CheckConfig { file } => {
            let loaded = config::Loaded::read(&file)?;
            let gateway = loaded.gateway()?;
            let api = loaded.api()?;
            // What starting it will install, so that no privilege comes as a surprise.
            let rules = match (&gateway.intercept, gateway.transparent_origin) {
                (Some(i), _) => format!(
                    "nftables table {} (TPROXY on {}, and the route for replies) and policy \
                     routing (mark {:#x}, table {}): needs CAP_NET_ADMIN",
                    wsx_proxy::rules::TABLE,
                    if i.interfaces.is_empty() {
                        "every interface".to_string()
                    } else {
                        i.interfaces.join(", ")
                    },
                    i.mark,
                    i.route_table
                ),
                (None, true) => format!(
                    "nftables table {} (the route for the servers' replies to transparent \
                     origin) and policy routing: needs CAP_NET_ADMIN",
                    wsx_proxy::rules::TABLE
                ),
                (None, false) => "none".to_string(),
            };
            println!(
                "{}: ok ({} peer(s), interception {}, transparent origin {}, {} forwarding and \
                 {} SOCKS listener(s), shaper {}, API {})\nrules: {rules}",
                file.display(),
                gateway.peers.len(),
                if gateway.intercept.is_some() {
                    "on"
                } else {
                    "off"
                },
                if gateway.transparent_origin {
                    "on"
                } else {
                    "off"
                },
                gateway.forwards.len(),
                gateway.socks.len(),
                gateway
                    .shaping
                    .as_ref()
                    .map_or("off".to_string(), |s| format!(
                        "on ({} scenario(s), {} filter(s))",
                        s.scenarios.len(),
                        s.filters.len()
                    )),
                api.map_or("off".to_string(), |a| format!("on {}", a.listen)),
            );
            Ok(())
        }
        Command::Genkey => {
            println!("{}", SecretKey::generate().to_base64());
            Ok(())
        }
        Command::Pubkey => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading standard input")?;
            let key: SecretKey = text
                .parse()
                .map_err(|e| anyhow::anyhow!("not a private key: {e}"))?;
            println!("{}", key.public_key());
            Ok(())
        }
        Command::Gentoken => {
            let mut bytes = [0u8; 24];
            getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
            println!(
                "{}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
            );
            Ok(())
        }
        Command::Cleanup => daemon::cleanup(&config),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "wsx", &mut std::io::stdout());
            Ok(())
        }
        Command::Api(command) => cli::run(command, &config),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_completes() {
        Cli::command().debug_assert();
        let mut script = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "wsx",
            &mut script,
        );
        let script = String::from_utf8(script).unwrap_or_default();
        for word in ["sessions", "bypass", "log-level", "--json"] {
            assert!(script.contains(word), "{word} missing from the completions");
        }
    }

    #[test]
    fn api_options_belong_to_the_commands_that_ask_a_gateway() {
        let cli = Cli::try_parse_from([
            "wsx",
            "sessions",
            "--route",
            "tunnel",
            "--json",
            "--api",
            "http://[::1]:1",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            cli.command,
            Command::Api(cli::ApiCommand::Sessions { .. })
        ));
        // A nested command takes them after its own name too.
        let cli = Cli::try_parse_from(["wsx", "session", "kill", "7", "--json"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            cli.command,
            Command::Api(cli::ApiCommand::Session { .. })
        ));
        let cli = Cli::try_parse_from(["wsx", "run", "--config", "/x.toml"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.config, std::path::Path::new("/x.toml"));
        // `run` has no API client options, in its parsing or its help.
        assert!(Cli::try_parse_from(["wsx", "run", "--json"]).is_err());
        let mut command = Cli::command();
        let run = command
            .find_subcommand_mut("run")
            .map(|r| r.render_long_help().to_string())
            .unwrap_or_default();
        assert!(!run.contains("--token") && !run.contains("--api"), "{run}");
    }
}
