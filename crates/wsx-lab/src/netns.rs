//! Network-namespace primitives: running `ip`, entering a namespace from a thread, listing and
//! deleting namespaces.

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Where `ip netns` keeps its namespace handles.
const NETNS_DIR: &str = "/run/netns";

/// The handle file of namespace `name`.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// Names of all named network namespaces on the host.
pub fn list() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

/// Runs `ip` with a batch of commands (one per line), inside namespace `netns` if given.
pub fn ip_batch(netns: Option<&str>, commands: &str) -> Result<()> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .context("running `ip` (is iproute2 installed?)")?;
    child
        .stdin
        .take()
        .context("ip stdin")?
        .write_all(commands.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "ip -batch in {} failed: {}\ncommands:\n{commands}",
            netns.unwrap_or("the host namespace"),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Runs a program to completion inside namespace `netns` and fails with its stderr if it fails.
pub fn exec(netns: &str, program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, program])
        .args(args)
        .output()
        .with_context(|| format!("running {program} in {netns}"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` in {netns} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes a sysctl inside namespace `netns` (`key` in dotted form).
pub fn sysctl(netns: &str, key: &str, value: &str) -> Result<()> {
    exec(netns, "sysctl", &["-q", "-w", &format!("{key}={value}")]).map(drop)
}

/// Runs `f` on a new thread that has entered namespace `netns`, and returns its result.
/// Sockets created inside `f` belong to that namespace and stay usable from any thread.
pub fn run_in<T: Send + 'static>(netns: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let ns_path = path(netns);
    std::thread::Builder::new()
        .name(format!("in-{netns}"))
        .spawn(move || -> Result<T> {
            crate::sys::enter_netns(&ns_path)
                .with_context(|| format!("entering {}", ns_path.display()))?;
            Ok(f())
        })?
        .join()
        .map_err(|_| anyhow::anyhow!("thread in {netns} panicked"))?
}

/// Kills every process inside namespace `name`, then deletes it. Missing namespaces are fine.
pub fn delete(name: &str) -> Result<()> {
    if !path(name).exists() {
        return Ok(());
    }
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                // SAFETY: kill(2) with a pid and a signal number.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let out = Command::new("ip")
        .args(["netns", "delete", name])
        .output()?;
    if !out.status.success() && path(name).exists() {
        bail!(
            "deleting netns {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
