//! `cargo xtask emulator-cost`: what the WAN emulator costs and how fast it can go.
//!
//! For each offered rate, a fresh lab with a 10 ms RTT and no bottleneck carries a paced UDP
//! stream of 1500-byte IP packets from client to server for a few seconds. The emulator's own
//! CPU time (user + system, from its rusage) and what arrived are recorded. The emulator
//! sustains a rate when at least 99.5 % of the packets arrive and it reports no faults (no frame
//! dropped by the kernel before the emulator could read it).

use anyhow::{Context, Result};
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use wsx_lab::emulator::LinkParams;
use wsx_lab::{Lab, Node, WanSpec, addr, monotonic_ns, traffic};

#[derive(clap::Args, Debug)]
pub(crate) struct CostArgs {
    /// Offered rates to try, Mbit/s.
    #[arg(long, value_delimiter = ',', default_values_t = [100.0, 500.0, 1000.0, 1500.0, 2000.0])]
    rates: Vec<f64>,
    /// Seconds per rate.
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
}

const IP_BYTES: usize = 1500;

pub(crate) fn run(args: &CostArgs) -> Result<()> {
    crate::build_lab_binary()?;
    wsx_lab::install_signal_cleanup()?;
    println!(
        "| offered Mbit/s | delivered Mbit/s | delivered % | emulator CPU % of a core (user + sys) | CPU µs/packet | faults |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for &rate in &args.rates {
        let row = measure(rate, args.seconds).with_context(|| format!("at {rate} Mbit/s"))?;
        println!(
            "| {rate} | {:.1} | {:.2} | {:.1} ({:.1} + {:.1}) | {:.2} | {} |",
            row.delivered_mbit,
            row.delivered_mbit / rate * 100.0,
            row.cpu_s / row.seconds * 100.0,
            row.user_s / row.seconds * 100.0,
            (row.cpu_s - row.user_s) / row.seconds * 100.0,
            row.cpu_s * 1e6 / row.packets.max(1) as f64,
            row.faults
        );
    }
    Ok(())
}

struct Row {
    delivered_mbit: f64,
    cpu_s: f64,
    user_s: f64,
    seconds: f64,
    packets: u64,
    faults: u64,
}

fn measure(rate_mbit: f64, seconds: f64) -> Result<Row> {
    let spec = WanSpec {
        rtt_ms: 10.0,
        rate_mbit: 0.0,
        ..WanSpec::default()
    };
    let mut config = spec.emulator_config();
    config.b_to_a = LinkParams::with_delay_ms(5.0);
    let lab = Lab::start(&config)?;
    let sink = lab.run_in(Node::Server, || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
        s.set_recv_buffer_size(64 << 20)?;
        s.bind(&SocketAddr::new(addr::SERVER_V4.into(), 0).into())?;
        Ok::<UdpSocket, std::io::Error>(s.into())
    })??;
    sink.set_read_timeout(Some(Duration::from_millis(300)))?;
    let target = sink.local_addr()?;
    let client = lab.run_in(Node::Client, || {
        UdpSocket::bind(SocketAddr::new(addr::CLIENT_V4.into(), 0))
    })??;
    // Resolve neighbours before measuring.
    client.send_to(b"warm", target)?;
    sink.recv(&mut [0u8; 64]).context("warm-up packet")?;

    let counter = std::thread::spawn(move || {
        let (mut packets, mut buf) = (0u64, [0u8; 2048]);
        while sink.recv(&mut buf).is_ok() {
            packets += 1;
        }
        packets
    });
    let before = lab.emulator().stats()?;
    let start = monotonic_ns();
    traffic::send_paced(&client, target, IP_BYTES, rate_mbit, seconds)?;
    let elapsed = (monotonic_ns() - start) as f64 / 1e9;
    let received = counter
        .join()
        .map_err(|_| anyhow::anyhow!("counter panicked"))?;
    let after = lab.emulator().stats()?;
    let fwd = after.a_to_b.since(&before.a_to_b);
    Ok(Row {
        delivered_mbit: received as f64 * IP_BYTES as f64 * 8.0 / elapsed / 1e6,
        cpu_s: after.cpu_s() - before.cpu_s(),
        user_s: after.cpu_user_s - before.cpu_user_s,
        seconds: elapsed,
        packets: fwd.fwd_pkts,
        faults: fwd.emulator_faults,
    })
}
