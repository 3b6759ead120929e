//! `cargo xtask test`: the whole test suite.
//!
//! The end-to-end tests build network namespaces, so this needs root; it says so and fails
//! rather than skipping them. It installs the Debian packages the lab uses when they are
//! missing, schemathesis (the property-based API tester) and Selenium (the dashboard's
//! browser test), each from PyPI into a virtual environment under `target/tools`, and
//! cargo-deb (the deployment test installs the Debian package, `cargo xtask deb`, made
//! from the debug build). It removes leftovers of killed runs first, and fails if the run
//! leaks namespaces. Each test binary runs under `timeout`, so a hung test fails the run
//! with its binary named rather than stalling it.

use crate::host;
use anyhow::{Context, Result, bail};
use std::process::Command;

#[derive(clap::Args, Debug)]
pub(crate) struct TestArgs {
    /// Extra arguments for `cargo test` (after `--`), e.g. a test name filter.
    #[arg(last = true)]
    cargo_args: Vec<String>,
}

/// The schemathesis release the API test was written against.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";

/// The Selenium release the dashboard's browser test (`tests/dashboard.py`) was written
/// against; it drives Debian's chromium through its chromedriver.
const SELENIUM: &str = "selenium==4.45.0";

/// The longest one test binary may run. The slowest take about 75 s here; this is a
/// bound on a hang, not a performance check.
const BINARY_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

pub(crate) fn run(args: &TestArgs) -> Result<()> {
    host::require_root("test")?;
    host::ensure(host::LAB)?;
    host::ensure(host::TESTS)?;
    let schemathesis = host::python_tool(SCHEMATHESIS)?.join("bin/schemathesis");
    let selenium = host::python_tool(SELENIUM)?.join("bin/python");
    let smb_python = host::python_tool(crate::smb::SMBPROTOCOL)?.join("bin/python");
    for ns in wsx_lab::clean(false)? {
        println!("removed leftover namespace {ns}");
    }

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = crate::workspace_root();
    // The lab's tests run the wsx-lab binary inside namespaces: build it first.
    let status = Command::new(&cargo)
        .args(["build", "--workspace", "--bins"])
        .current_dir(&root)
        .status()?;
    if !status.success() {
        bail!("cargo build failed");
    }
    // The deployment test installs the Debian package: made from the debug build just
    // made, so it costs no second build.
    let deb = crate::deb::build(true).context("building the Debian package")?;
    // Every test binary runs under `timeout`: one that hangs fails the run in minutes,
    // named in cargo's report, instead of holding it until CI's own limit.
    let runner = format!(
        "target.'cfg(all())'.runner = [\"timeout\", \"--kill-after=10\", \"{}\"]",
        BINARY_TIME_LIMIT.as_secs()
    );
    let status = Command::new(&cargo)
        .args(["test", "--workspace", "--all-targets", "--no-fail-fast"])
        .args(["--config", &runner])
        .args(&args.cargo_args)
        .env("WSX_SCHEMATHESIS", &schemathesis)
        .env("WSX_SELENIUM_PYTHON", &selenium)
        .env("WSX_SMB_PYTHON", &smb_python)
        .env("WSX_DEB", &deb)
        .current_dir(&root)
        .status()?;
    let doc_status = Command::new(&cargo)
        .args(["test", "--workspace", "--doc"])
        .current_dir(&root)
        .status()?;

    let leaked: Vec<String> = wsx_lab::netns::list()
        .into_iter()
        .filter(|n| n.starts_with(wsx_lab::PREFIX))
        .collect();
    let removed = wsx_lab::clean(false)?;
    if !status.success() || !doc_status.success() {
        bail!("tests failed");
    }
    if !removed.is_empty() {
        bail!(
            "the test run leaked network namespaces (now removed): {}",
            removed.join(", ")
        );
    }
    if !leaked.is_empty() {
        println!(
            "note: namespaces of still-running labs (not this run's): {}",
            leaked.join(", ")
        );
    }
    println!("all tests passed; no namespaces leaked");
    Ok(())
}
