//! What the tasks need of the host: root for the lab's namespaces, and the Debian packages
//! of the programs the lab runs, installed through apt-get when they are missing. The demo,
//! the benchmarks and the test suite all start here, so that each works on a fresh machine.

use anyhow::{Context, Result, bail};
use std::process::Command;

/// Programs every lab needs and the Debian packages that provide them.
pub(crate) const LAB: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("ethtool", "ethtool"),
    ("nft", "nftables"),
    ("sysctl", "procps"),
    ("tc", "iproute2"),
];

/// What the test suite needs beyond the lab.
pub(crate) const TESTS: &[(&str, &str)] = &[
    // The deployment test boots systemd in the gateways' namespaces.
    ("systemctl", "systemd"),
    ("nsenter", "util-linux"),
    // The API test's schemathesis runs in a virtual environment.
    ("python3", "python3-venv"),
    // The SOCKS test's client.
    ("curl", "curl"),
    // The SMB test's server and client.
    ("smbd", "samba"),
    ("smbclient", "smbclient"),
    // The dashboard's browser test: headless Chromium, driven through its WebDriver.
    ("chromium", "chromium"),
    ("chromedriver", "chromium-driver"),
];

/// Fails with one line saying what to do unless this runs as root: `task` builds network
/// namespaces.
pub(crate) fn require_root(task: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "cargo xtask {task} builds network namespaces and needs root: run it as root \
             (e.g. `sudo -E cargo xtask {task}`)"
        );
    }
    Ok(())
}

/// Installs, through apt-get, the packages of the `programs` not on the path.
pub(crate) fn ensure(programs: &[(&str, &str)]) -> Result<()> {
    let mut missing: Vec<&str> = programs
        .iter()
        .filter(|(program, _)| !on_path(program))
        .map(|&(_, package)| package)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    install_packages(&missing)
}

/// `apt-get install -y packages` (after an update), non-interactively.
pub(crate) fn install_packages(packages: &[&str]) -> Result<()> {
    let command = format!(
        "apt-get update && apt-get install -y {}",
        packages.join(" ")
    );
    if !on_path("apt-get") {
        bail!(
            "missing packages and no apt-get to install them; install: {}",
            packages.join(" ")
        );
    }
    println!("installing {}", packages.join(" "));
    let status = Command::new("sh")
        .args(["-c", &format!("DEBIAN_FRONTEND=noninteractive {command}")])
        .status()
        .context("running apt-get")?;
    if !status.success() {
        bail!("installing packages failed; run: {command}");
    }
    Ok(())
}

fn on_path(program: &str) -> bool {
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&dirs)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|d| d.join(program).is_file())
}
