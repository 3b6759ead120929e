//! `wsx-lab`: build the lab, run the WAN emulator, send and sink verified traffic.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;
use wsx_lab::emulator::{self, Direction, EmulatorConfig, EmulatorHandle, LinkParams};
use wsx_lab::traffic::{self, PayloadKind, SendOptions, SinkOptions, TunnelKeys};
use wsx_lab::{Lab, Node, WanSpec};
use wsx_tunnel::{PublicKey, SecretKey};

#[derive(Parser, Debug)]
#[command(
    name = "wsx-lab",
    version,
    about = "The wsx lab: namespaces, WAN emulator, verified traffic"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Build a lab and keep it until Ctrl-C; prints its namespaces and the emulator socket.
    Up {
        #[command(flatten)]
        wan: WanSpec,
    },
    /// Remove namespaces and files left by lab runs whose process has died.
    Clean {
        /// Remove every lab, also those of running processes.
        #[arg(long)]
        all: bool,
    },
    /// Print a running emulator's counters as JSON.
    Stats {
        /// The emulator's control socket.
        #[arg(long)]
        socket: PathBuf,
    },
    /// Change a running emulator's link parameters (JSON `LinkParams`).
    Set {
        /// The emulator's control socket.
        #[arg(long)]
        socket: PathBuf,
        /// Which direction to change.
        #[arg(long, value_enum, default_value_t = Direction::Both)]
        direction: Direction,
        /// The new parameters, e.g. '{"delay_us":50000,"rate_kbit":20000}'.
        params: String,
    },
    /// Run the emulator (the lab starts this inside the wan namespace).
    Emulate {
        /// Interface towards gw-a.
        #[arg(long)]
        a: String,
        /// Interface towards gw-b.
        #[arg(long)]
        b: String,
        /// Path of the control socket to create.
        #[arg(long)]
        control: PathBuf,
        /// JSON `EmulatorConfig`.
        #[arg(long)]
        config: String,
    },
    /// Send verified traffic to a sink.
    Send {
        /// The sink's address.
        #[arg(long)]
        to: SocketAddr,
        /// Parallel TCP connections.
        #[arg(long, default_value_t = 1)]
        flows: u16,
        /// Bytes per flow (otherwise send for --seconds).
        #[arg(long)]
        bytes: Option<u64>,
        /// Duration of a timed run.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// TCP congestion control (cubic, bbr, reno); default: the namespace's.
        #[arg(long)]
        cc: Option<String>,
        /// Payload.
        #[arg(long, value_enum, default_value_t = PayloadKind::Random)]
        payload: PayloadKind,
        /// Seed of the payload streams.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Limit each flow to this rate, as an application that has no more to send would.
        #[arg(long)]
        rate_mbit: Option<f64>,
        /// Write the JSON report here ("-": stdout).
        #[arg(long, default_value = "-")]
        json: String,
        #[command(flatten)]
        tunnel: TunnelArgs,
    },
    /// Time requests answered by an echo server: one of --size bytes every --interval-ms.
    Probe {
        /// The echo server's address.
        #[arg(long)]
        to: SocketAddr,
        /// Bytes per request.
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Milliseconds from one request to the next.
        #[arg(long, default_value_t = 10.0)]
        interval_ms: f64,
        /// How long to probe.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Seed of the request bytes.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write the JSON report here ("-": stdout).
        #[arg(long, default_value = "-")]
        json: String,
    },
    /// Request/response exchanges, one outstanding at a time, each answer checked and timed.
    Exchange {
        /// The answering server (`wsx-lab answer`).
        #[arg(long)]
        to: SocketAddr,
        /// Exchanges, one after another.
        #[arg(long, default_value_t = 1000)]
        exchanges: usize,
        /// Bytes per answer.
        #[arg(long, default_value_t = 65536)]
        answer_bytes: usize,
        /// TCP congestion control (cubic, bbr, reno); default: the namespace's.
        #[arg(long)]
        cc: Option<String>,
        /// Seed of the answers.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write the JSON report here ("-": stdout).
        #[arg(long, default_value = "-")]
        json: String,
    },
    /// Answer the requests of one `wsx-lab exchange` connection until it closes; prints
    /// "ready" once listening.
    Answer {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// TCP congestion control of the answers (cubic, bbr, reno); default: the
        /// namespace's.
        #[arg(long)]
        cc: Option<String>,
    },
    /// Echo what one connection sends until it closes; prints "ready" once listening.
    Echo {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Echo every connection until it closes, any number at once; prints "ready" once
    /// listening.
    EchoServer {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Serve SMB2 (the simulated server of the engine's tests) on every connection, any
    /// number at once, sharing the address with other processes (SO_REUSEPORT); prints
    /// "ready" once listening.
    SmbServer {
        /// Address to listen on (port 445, for the gateways to see SMB).
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Open many sessions to echo servers (or SMB servers) and hold them: prints "opened",
    /// then obeys "probe N" and "close" on standard input (see `traffic::sessions`).
    Sessions {
        /// A server's address; repeat to spread the sessions over several.
        #[arg(long, required = true)]
        to: Vec<SocketAddr>,
        /// Speak SMB2 to `smb-server`s: each session reads a file to open, another to
        /// prove itself after the hold.
        #[arg(long)]
        smb: bool,
        /// Sessions to open and hold.
        #[arg(long)]
        count: usize,
        /// Connections being opened at once.
        #[arg(long, default_value_t = 128)]
        concurrency: usize,
        /// Seed of the requests.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write the JSON report here ("-": stdout).
        #[arg(long, default_value = "-")]
        json: String,
    },
    /// Accept and verify traffic; prints "ready" once listening, then the report.
    Sink {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// Connections to accept.
        #[arg(long, default_value_t = 1)]
        flows: u16,
        /// A connection idle this many seconds fails.
        #[arg(long, default_value_t = 120)]
        idle_timeout_s: u64,
        /// Write the JSON report here ("-": stdout).
        #[arg(long, default_value = "-")]
        json: String,
        #[command(flatten)]
        tunnel: TunnelArgs,
    },
}

/// Carry the flows as streams of a wsx tunnel (memory to memory, no TCP): `--to` and
/// `--listen` are then the tunnel's UDP addresses.
#[derive(clap::Args, Debug)]
struct TunnelArgs {
    /// This side's tunnel secret key (base64).
    #[arg(long, requires = "tunnel_peer")]
    tunnel_secret: Option<SecretKey>,
    /// The other side's public key (base64).
    #[arg(long, requires = "tunnel_secret")]
    tunnel_peer: Option<PublicKey>,
}

impl TunnelArgs {
    fn keys(self) -> Option<TunnelKeys> {
        Some(TunnelKeys {
            secret: self.tunnel_secret?,
            peer: self.tunnel_peer?,
        })
    }
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Up { wan } => {
            wsx_lab::install_signal_cleanup()?;
            let lab = Lab::start(&wan.emulator_config())?;
            println!(
                "lab {} is up ({} ms RTT, {} % loss, {} Mbit/s)",
                lab.name(),
                wan.rtt_ms,
                wan.loss_pct,
                wan.rate_mbit
            );
            use wsx_lab::addr::*;
            // What an operator following the deployment guide needs: where to run each
            // gateway, and the interfaces and addresses its configuration names.
            let interfaces: [(Node, String); 5] = [
                (
                    Node::Client,
                    format!("eth0 {CLIENT_V4}/24 {CLIENT_V6}/64, default via {GWA_LAN_V4}"),
                ),
                (
                    Node::GwA,
                    format!(
                        "lan0 {GWA_LAN_V4}/24 {GWA_LAN_V6}/64 (LAN), wan0 {GWA_WAN_V4}/24 {GWA_WAN_V6}/64 (WAN)"
                    ),
                ),
                (Node::Wan, "a0, b0: the emulator's bridge".to_string()),
                (
                    Node::GwB,
                    format!(
                        "lan0 {GWB_LAN_V4}/24 {GWB_LAN_V6}/64 (LAN), wan0 {GWB_WAN_V4}/24 {GWB_WAN_V6}/64 (WAN)"
                    ),
                ),
                (
                    Node::Server,
                    format!("eth0 {SERVER_V4}/24 {SERVER_V6}/64, default via {GWB_LAN_V4}"),
                ),
            ];
            for (node, addresses) in interfaces {
                println!("  {:<7} ip netns exec {} ...", node.role(), lab.netns(node));
                println!("          {addresses}");
            }
            println!(
                "  the gateways: `ip netns exec NS wsx run --config FILE`, and the CLI the same \
                 way (`ip netns exec NS wsx status --config FILE`); deploy/wsx.toml names these \
                 interfaces and addresses"
            );
            if let Some(socket) = lab.emulator().socket() {
                println!("  emulator: wsx-lab stats --socket {}", socket.display());
            }
            println!("Ctrl-C tears it down.");
            loop {
                std::thread::park();
            }
        }
        Cmd::Clean { all } => {
            for ns in wsx_lab::clean(all)? {
                println!("removed {ns}");
            }
            Ok(())
        }
        Cmd::Stats { socket } => {
            println!(
                "{}",
                serde_json::to_string_pretty(&EmulatorHandle::new(socket).stats()?)?
            );
            Ok(())
        }
        Cmd::Set {
            socket,
            direction,
            params,
        } => {
            let params: LinkParams =
                serde_json::from_str(&params).context("parsing the link parameters")?;
            EmulatorHandle::new(socket).set(direction, params)
        }
        Cmd::Emulate {
            a,
            b,
            control,
            config,
        } => {
            let config: EmulatorConfig =
                serde_json::from_str(&config).context("parsing --config")?;
            emulator::bridge::run(&a, &b, &control, config)
        }
        Cmd::Send {
            to,
            flows,
            bytes,
            seconds,
            cc,
            payload,
            seed,
            rate_mbit,
            json,
            tunnel,
        } => {
            let options = SendOptions {
                rate_bps: rate_mbit.map(|m| (m * 1e6) as u64),
                to,
                flows,
                bytes,
                seconds,
                congestion: cc,
                payload,
                seed,
                receipt_timeout: Duration::from_secs(300),
            };
            let report = match tunnel.keys() {
                Some(keys) => traffic::tunnel_send(to, &keys, &options)?,
                None => traffic::send(&options)?,
            };
            let error = report.flows.iter().find_map(|f| f.error.as_deref());
            finish(&json, &report, report.verified(), error)
        }
        Cmd::Probe {
            to,
            size,
            interval_ms,
            seconds,
            seed,
            json,
        } => {
            let report = traffic::probe(&traffic::ProbeOptions {
                to,
                size,
                interval: Duration::from_secs_f64(interval_ms / 1000.0),
                seconds,
                seed,
            });
            finish(&json, &report, report.verified, report.error.as_deref())
        }
        Cmd::Exchange {
            to,
            exchanges,
            answer_bytes,
            cc,
            seed,
            json,
        } => {
            let report = traffic::exchange(&traffic::ExchangeOptions {
                to,
                exchanges,
                answer_len: answer_bytes,
                congestion: cc,
                seed,
                timeout: Duration::from_secs(60),
            });
            finish(&json, &report, report.verified, report.error.as_deref())
        }
        Cmd::Answer { listen, cc } => {
            let listener =
                TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
            println!("ready {}", listener.local_addr()?);
            let _ = std::io::stdout().flush();
            let served = traffic::answer(&listener, cc.as_deref())?;
            eprintln!(
                "answered {} requests, {} bytes",
                served.exchanges, served.bytes
            );
            Ok(())
        }
        Cmd::Echo { listen } => {
            let listener =
                TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
            println!("ready {}", listener.local_addr()?);
            let _ = std::io::stdout().flush();
            // Standard output may be gone by now (whoever waited for "ready" stopped reading).
            let echoed = traffic::echo(&listener)?;
            eprintln!("echoed {echoed} bytes");
            Ok(())
        }
        Cmd::EchoServer { listen } => traffic::echo_server(listen, |at| {
            println!("ready {at}");
            let _ = std::io::stdout().flush();
        }),
        Cmd::SmbServer { listen } => traffic::smb_server(listen, |at| {
            println!("ready {at}");
            let _ = std::io::stdout().flush();
        }),
        Cmd::Sessions {
            to,
            smb,
            count,
            concurrency,
            seed,
            json,
        } => {
            let report = traffic::sessions(&traffic::SessionsOptions {
                to,
                speak: if smb {
                    traffic::Speak::Smb
                } else {
                    traffic::Speak::Echo
                },
                count,
                concurrency,
                seed,
            })?;
            let error = report.errors.keys().next().cloned();
            finish(&json, &report, report.verified(), error.as_deref())
        }
        Cmd::Sink {
            listen,
            flows,
            idle_timeout_s,
            json,
            tunnel,
        } => {
            let options = SinkOptions {
                flows,
                idle_timeout: Duration::from_secs(idle_timeout_s),
            };
            let ready = |at: SocketAddr| {
                println!("ready {at}");
                let _ = std::io::stdout().flush();
            };
            let report = match tunnel.keys() {
                Some(keys) => traffic::tunnel_sink(listen, &keys, options, ready)?,
                None => {
                    let listener = TcpListener::bind(listen)
                        .with_context(|| format!("listening on {listen}"))?;
                    ready(listener.local_addr()?);
                    traffic::sink(&listener, options)?
                }
            };
            let error = report.flows.iter().find_map(|f| f.error.as_deref());
            finish(&json, &report, report.verified(), error)
        }
    }
}

/// Writes the report, then fails unless the transfer was verified.
fn finish(
    path: &str,
    report: &impl serde::Serialize,
    verified: bool,
    error: Option<&str>,
) -> Result<()> {
    write_report(path, report)?;
    anyhow::ensure!(
        verified,
        "transfer not verified: {}",
        error.unwrap_or("no error reported")
    );
    Ok(())
}

fn write_report(path: &str, report: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string(report)?;
    if path == "-" {
        println!("{text}");
    } else {
        std::fs::write(path, text + "\n").with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}
