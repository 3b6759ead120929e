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

/// Installs the Python package `requirement` (`name==version`) into its own virtual
/// environment, `target/tools/NAME`, unless that version is there already; returns the
/// environment's directory.
pub(crate) fn python_tool(requirement: &str) -> Result<std::path::PathBuf> {
    let (name, version) = requirement
        .split_once("==")
        .context("a pinned requirement")?;
    let venv = crate::workspace_root().join("target/tools").join(name);
    let installed = Command::new(venv.join("bin/pip"))
        .args(["show", name])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == format!("Version: {version}"))
        });
    if installed {
        return Ok(venv);
    }
    // Debian's python3 needs python3-venv for `-m venv` (ensurepip).
    let has_venv = Command::new("python3")
        .args(["-c", "import ensurepip, venv"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_venv {
        install_packages(&["python3-venv"])?;
    }
    println!("installing {requirement} into {}", venv.display());
    let status = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .context("running python3 -m venv")?;
    if !status.success() {
        bail!("creating the virtual environment {} failed", venv.display());
    }
    let status = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ])
        .status()
        .context("running pip")?;
    if !status.success() {
        bail!("pip install {requirement} failed");
    }
    Ok(venv)
}
