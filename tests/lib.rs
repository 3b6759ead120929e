//! End-to-end tests of wsx: real kernel TCP through the lab's namespaces and emulated WAN.
//! The tests live in `tests/`; they need root and are run by `cargo xtask test`.
//!
//! This library holds what they share: [`Daemon`] runs the `wsx` binary in a lab node with a
//! configuration and watches its log.

// Test support: a failed setup is a failed test.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use wsx_lab::{Lab, Node};

/// The `wsx` binary `cargo xtask test` built beside the test executables.
pub fn wsx_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("wsx"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no wsx binary near {}: run `cargo build -p wsx`",
                exe.display()
            )
        })
}

/// A `wsx run` in one lab node. Dropping it stops the daemon (SIGTERM, then SIGKILL).
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    log: Arc<(Mutex<Vec<String>>, Condvar)>,
    pub config: PathBuf,
    node: Node,
}

impl Daemon {
    /// Writes `config` into `dir` and starts the daemon with it; waits until it runs.
    pub fn start(lab: &Lab, node: Node, dir: &std::path::Path, config: &str) -> Self {
        let path = dir.join(format!("{}.toml", node.role()));
        std::fs::write(&path, config).unwrap();
        Self::start_with(lab, node, path)
    }

    /// Starts the daemon on an existing configuration file.
    pub fn start_with(lab: &Lab, node: Node, config: PathBuf) -> Self {
        let mut child = lab
            .command(node, wsx_binary())
            .arg("run")
            .arg("--config")
            .arg(&config)
            .env("WSX_LOG", "info,wsx_proxy=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        let role = node.role();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{role}] {line}");
                sink.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                sink.1.notify_all();
            }
        });
        let daemon = Self {
            child: Some(child),
            log,
            config,
            node,
        };
        daemon.wait_for("wsx running", Duration::from_secs(20));
        daemon
    }

    /// Waits until a log line contains `pattern` (counting lines already logged); panics
    /// after `timeout`.
    pub fn wait_for(&self, pattern: &str, timeout: Duration) {
        self.wait_for_count(pattern, 1, timeout);
    }

    /// Waits until `count` log lines contain `pattern`.
    pub fn wait_for_count(&self, pattern: &str, count: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let (lines, changed) = &*self.log;
        let mut guard = lines.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if guard.iter().filter(|l| l.contains(pattern)).count() >= count {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{:?}: no {count} log line(s) with {pattern:?} within {timeout:?}; log:\n{}",
                self.node,
                guard.join("\n")
            );
            guard = changed
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// How many log lines contain `pattern`.
    pub fn count(&self, pattern: &str) -> usize {
        self.count_all(&[pattern])
    }

    /// How many log lines contain every one of `patterns`.
    pub fn count_all(&self, patterns: &[&str]) -> usize {
        let lines = self.log.0.lock().unwrap_or_else(|e| e.into_inner());
        lines
            .iter()
            .filter(|l| patterns.iter().all(|p| l.contains(p)))
            .count()
    }

    /// How many sessions the daemon opened on `route` ("tunnel", "bypass", "inbound"),
    /// once the count has stopped changing: log lines arrive through a pipe and may trail
    /// the traffic they describe by a moment.
    pub fn sessions(&self, route: &str) -> usize {
        let pattern = format!("route=\"{route}\"");
        let mut last = self.count_all(&[&pattern, "session opened"]);
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = self.count_all(&[&pattern, "session opened"]);
            if now == last {
                return now;
            }
            last = now;
        }
    }

    /// The daemon's peak resident memory so far, KiB.
    pub fn max_rss_kb(&self) -> u64 {
        let pid = self.child.as_ref().map(|c| c.id()).unwrap();
        wsx_lab::usage_of(pid).unwrap().max_rss_kb
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: kill with a pid we own and a valid signal number.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    /// Stops the daemon with SIGTERM and waits for it; returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        // SAFETY: as in `signal`.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the daemon with SIGKILL, as a crash would: nothing is cleaned up.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
