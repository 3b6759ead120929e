//! `cargo xtask demo`: the main job on the built-in lab.

use crate::bench::{Case, Mode, run_case};
use anyhow::Result;
use wsx_lab::WanSpec;
use wsx_lab::traffic::PayloadKind;

#[derive(clap::Args, Debug)]
pub(crate) struct DemoArgs {
    /// Round-trip time of the emulated WAN, ms.
    #[arg(long, default_value_t = 100.0)]
    rtt_ms: f64,
    /// Random loss, percent, both directions.
    #[arg(long, default_value_t = 1.0)]
    loss: f64,
    /// Bottleneck rate, Mbit/s.
    #[arg(long, default_value_t = 100.0)]
    rate_mbit: f64,
    /// Seconds per transfer.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
}

pub(crate) fn run(args: &DemoArgs) -> Result<()> {
    let wan = WanSpec {
        rtt_ms: args.rtt_ms,
        loss_pct: args.loss,
        rate_mbit: args.rate_mbit,
        ..WanSpec::default()
    };
    let binary = crate::build_lab_binary()?;
    wsx_lab::install_signal_cleanup()?;
    println!(
        "wsx demo: one transfer of {} s across an emulated WAN of {} ms RTT, {} % random loss, {} Mbit/s\n",
        args.seconds, wan.rtt_ms, wan.loss_pct, wan.rate_mbit
    );
    let mut rows = Vec::new();
    for mode in [Mode::DirectCubic, Mode::DirectBbr, Mode::Wsx] {
        let case = Case {
            mode,
            wan: wan.clone(),
            flows: 1,
            seconds: args.seconds,
            warm_up_s: 0.0,
            payload: PayloadKind::Random,
            ipv6: false,
            gateways: crate::gateway::Settings::default(),
            veth_mtu: None,
            wsx_binary: None,
        };
        println!("running {} ...", case_label(mode));
        let r = run_case(&case, &binary)?;
        rows.push((case_label(mode), r));
    }

    println!(
        "\n{:<34} {:>15} {:>12} {:>10} {:>9}",
        "path", "goodput Mbit/s", "of the link", "t90", "verified"
    );
    for (label, r) in &rows {
        println!(
            "{:<34} {:>15.2} {:>11.1}% {:>10} {:>9}",
            label,
            r.goodput_mbit,
            r.utilization * 100.0,
            r.t90_ms.map_or("never".into(), |t| format!("{t} ms")),
            if r.verified { "yes" } else { "NO" }
        );
    }
    println!(
        "\nThe same client and server, the same kernel TCP: the wsx row goes through the gateways \
         (TPROXY on gw-a, the tunnel across the WAN, re-originated on gw-b)."
    );
    anyhow::ensure!(
        rows.iter().all(|(_, r)| r.verified),
        "a transfer was not verified"
    );
    Ok(())
}

fn case_label(mode: Mode) -> &'static str {
    match mode {
        Mode::DirectCubic => "plain TCP, CUBIC",
        Mode::DirectBbr => "plain TCP, BBR",
        Mode::Wsx => "wsx (through both gateways)",
        Mode::WsxForward => "wsx (a forwarding listener on gw-a)",
        Mode::Tunnel => "wsx tunnel alone (gw-a to gw-b)",
        Mode::TunnelVeth => "wsx tunnel alone (clean veth)",
        Mode::WsxVeth => "wsx, both gateways on a clean WAN",
        Mode::HtbCubic => "plain TCP, CUBIC, shaped by the kernel's HTB",
    }
}
