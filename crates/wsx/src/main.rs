//! The `wsx` binary: the gateway daemon (`wsx run`) and its CLI.
//!
//! It will load the TOML configuration, wire the proxy, the tunnel and the API together, run as a
//! systemd service and offer `check-config`, `genkey` and `pubkey`. Nothing is implemented yet;
//! see the project's issue tracker. Until then the binary says so and exits with an error, so
//! that no script mistakes it for a working gateway.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "wsx {}: the gateway daemon is not implemented yet; the lab and benchmarks live in `cargo xtask`",
        env!("CARGO_PKG_VERSION")
    );
    ExitCode::from(2)
}
