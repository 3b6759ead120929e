//! The `wsx` binary: the gateway daemon (`wsx run`) and its helper commands.
//!
//! - `wsx run --config FILE`: installs the interception rules, runs the gateway, reloads on
//!   SIGHUP, drains on SIGTERM, tells systemd (Type=notify) when it is ready and stopping.
//! - `wsx check-config FILE`: parses and validates a file; errors name file, line, column
//!   and field.
//! - `wsx genkey` / `wsx pubkey`: keys in the base64 form the configuration takes, as
//!   WireGuard's `wg genkey` / `wg pubkey`.
//! - `wsx cleanup --config FILE`: removes the rules a crashed run left (systemd's
//!   `ExecStopPost`), so that traffic flows unaccelerated.

mod config;
mod daemon;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
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
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway.
    Run {
        #[arg(long, short, default_value = "/etc/wsx/wsx.toml")]
        config: PathBuf,
    },
    /// Check a configuration file and exit.
    CheckConfig { file: PathBuf },
    /// Print a new private key (base64).
    Genkey,
    /// Read a private key on standard input and print its public key.
    Pubkey,
    /// Remove the interception rules of the configuration (after a crash).
    Cleanup {
        #[arg(long, short, default_value = "/etc/wsx/wsx.toml")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wsx: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Run { config } => daemon::run(&config),
        Command::CheckConfig { file } => {
            let loaded = config::Loaded::read(&file)?;
            let gateway = loaded.gateway()?;
            println!(
                "{}: ok ({} peer(s), interception {})",
                file.display(),
                gateway.peers.len(),
                if gateway.intercept.is_some() {
                    "on"
                } else {
                    "off"
                }
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
        Command::Cleanup { config } => daemon::cleanup(&config),
    }
}
