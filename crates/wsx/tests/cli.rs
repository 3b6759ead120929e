//! The `wsx` binary as an operator runs it, without a gateway: output into a closed pipe,
//! and what `check-config` says a configuration will install.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};

const WSX: &str = env!("CARGO_BIN_EXE_wsx");

/// Like `wsx completions bash | true`: the reader is gone before wsx writes; wsx ends
/// without a panic or an error message.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(WSX)
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.is_empty(), "{stderr}");
}

/// A gateway that only forwards needs no rules; one that intercepts says which it installs.
#[test]
fn check_config_says_what_will_be_installed() {
    let dir = tempfile::tempdir().unwrap();
    let key = String::from_utf8(Command::new(WSX).arg("genkey").output().unwrap().stdout).unwrap();
    let base = format!("[tunnel]\nprivate_key = \"{}\"\n", key.trim());
    let check = |text: &str| {
        let file = dir.path().join("wsx.toml");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(WSX)
            .arg("check-config")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = check(&base);
    assert!(plain.contains("transparent origin off"), "{plain}");
    assert!(plain.contains("rules: none"), "{plain}");
    let intercepting = check(&format!("{base}[intercept]\ninterfaces = [\"lan0\"]\n"));
    assert!(
        intercepting.contains("transparent origin on"),
        "{intercepting}"
    );
    assert!(
        intercepting.contains("rules: nftables table wsx (TPROXY on lan0"),
        "{intercepting}"
    );
}
