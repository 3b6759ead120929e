//! Development tasks for wsx, run as `cargo xtask <task>`:
//!
//! - `demo`: the main job on the built-in lab: plain TCP (and, once the gateways exist, wsx)
//!   across a 100 ms, 1 % loss, 100 Mbit/s WAN, side by side.
//! - `bench`: single benchmark cases and matrices on the lab, as JSON Lines, a markdown table
//!   and SVG plots under `target/bench/`; with `--sessions`, many concurrent sessions held
//!   through the gateways; with `--exchanges`, request/response with one request
//!   outstanding.
//! - `shaping`: the bandwidth controller's cases (minimums and priorities, latency by
//!   priority, fair share), through wsx's shaper and the kernel's HTB in one run.
//! - `soak`: mixed bulk and short sessions through the gateways for a long run while the
//!   link flaps, a server stalls and the peer restarts; every transfer hashed, memory and
//!   descriptors sampled.
//! - `emulator-cost`: the WAN emulator's CPU use and highest sustained rate.
//! - `test`: the whole test suite (unit, simulation, property, and end-to-end in network
//!   namespaces), installing the Debian packages it needs.
//! - `deb`: the Debian package (binary, systemd unit, man pages, completions, the example
//!   configuration and the deployment guide), with cargo-deb.

mod bench;
mod chart;
mod deb;
mod demo;
mod emulator_cost;
mod exchange;
mod gateway;
mod host;
mod sessions;
mod shaping;
mod smb;
mod soak;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "cargo xtask", about = "wsx development tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand, Debug)]
enum Task {
    /// Plain TCP (and wsx, once it exists) across the default lab WAN, side by side.
    Demo(demo::DemoArgs),
    /// Run benchmark cases on the lab.
    Bench(Box<bench::BenchArgs>),
    /// The bandwidth controller's lab cases, through wsx's shaper and the kernel's HTB.
    Shaping(shaping::ShapingArgs),
    /// Mixed traffic through the gateways for a long run while the link flaps, a server
    /// stalls and the peer restarts; memory and descriptors sampled (not part of CI).
    Soak(soak::SoakArgs),
    /// Run the whole test suite (needs root).
    Test(test::TestArgs),
    /// Measure the WAN emulator's CPU cost and highest sustained rate.
    EmulatorCost(emulator_cost::CostArgs),
    /// Build the Debian package (target/debian/).
    Deb(deb::DebArgs),
}

fn main() {
    let result = match Cli::parse().task {
        Task::Demo(args) => lab_task("demo").and_then(|()| demo::run(&args)),
        Task::Bench(args) => lab_task("bench").and_then(|()| bench::run(&args)),
        Task::Shaping(args) => lab_task("shaping").and_then(|()| shaping::run(&args)),
        Task::Soak(args) => lab_task("soak").and_then(|()| soak::run(&args)),
        Task::Test(args) => test::run(&args),
        Task::EmulatorCost(args) => {
            lab_task("emulator-cost").and_then(|()| emulator_cost::run(&args))
        }
        Task::Deb(args) => deb::run(&args),
    };
    if let Err(e) = result {
        // One line that says what went wrong and, where it can, what to do.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// What every task that builds a lab needs first: root, and the lab's programs.
fn lab_task(task: &str) -> Result<()> {
    host::require_root(task)?;
    host::ensure(host::LAB)
}

/// The workspace root (xtask lives one level below it).
fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Builds the lab's binary (and the gateway's, `wsx`, beside it) in release mode, makes the
/// lab use it (for the emulator too: the
/// lab would otherwise find the debug build beside this program), and returns its path.
fn build_lab_binary() -> Result<std::path::PathBuf> {
    let root = workspace_root();
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "build",
                "--quiet",
                "--release",
                "-p",
                "wsx-lab",
                "-p",
                "wsx",
            ])
            .current_dir(&root)
            .status()?;
    anyhow::ensure!(status.success(), "building wsx-lab and wsx failed");
    let binary = root.join("target/release/wsx-lab");
    wsx_lab::use_lab_binary(binary.clone());
    Ok(binary)
}
