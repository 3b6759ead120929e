//! `cargo xtask deb`: the Debian package, built with cargo-deb (installed into `~/.cargo/bin`
//! when missing, at the version pinned here).
//!
//! The package carries the binary as `/usr/bin/wsx`, the systemd unit (the one in `deploy/`,
//! pointed at `/usr/bin`), the annotated configuration and the deployment guide as
//! documentation, a man page per command and bash, zsh and fish completions. The man pages
//! and completions are made here from the command line's definition (`wsx::command`), so
//! they cannot drift from it. Its maintainer scripts (`deploy/debian/`) create the `wsx`
//! user and `/etc/wsx`; installing the package does not enable or start the service (the
//! configuration and keys come first, as the guide says).

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cargo-deb release the packaging was written against.
const CARGO_DEB: &str = "3.8.0";

#[derive(clap::Args, Debug)]
pub(crate) struct DebArgs {
    /// Package the debug build (what the test suite has built anyway) instead of an
    /// optimised one.
    #[arg(long)]
    debug: bool,
}

pub(crate) fn run(args: &DebArgs) -> Result<()> {
    let deb = build(args.debug)?;
    println!("{}", deb.display());
    Ok(())
}

/// Builds the binary and the package; returns the package's path.
pub(crate) fn build(debug: bool) -> Result<PathBuf> {
    let root = crate::workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    ensure_cargo_deb(&cargo)?;
    let profile = if debug { "dev" } else { "release" };
    let status = Command::new(&cargo)
        .args(["build", "--quiet", "--profile", profile, "-p", "wsx"])
        .current_dir(&root)
        .status()?;
    anyhow::ensure!(status.success(), "building wsx failed");

    let assets = root.join("target/deb-assets");
    let _ = std::fs::remove_dir_all(&assets);
    write_assets(&root, &assets)?;
    // The binary is staged with the rest: cargo-deb packages only what this task built
    // (it refuses the dev profile, which the test suite's package comes from).
    let built = root
        .join("target")
        .join(if debug { "debug" } else { "release" })
        .join("wsx");
    std::fs::copy(&built, assets.join("wsx"))
        .with_context(|| format!("staging {}", built.display()))?;

    let output = root.join("target/debian");
    std::fs::create_dir_all(&output)?;
    let mut deb = Command::new(&cargo);
    deb.args(["deb", "--no-build", "--quiet", "-p", "wsx"]);
    if debug {
        // A debug binary is ten times the size; its package is for tests, not downloads.
        deb.arg("--fast");
    }
    let out = deb
        .arg("--output")
        .arg(&output)
        .current_dir(&root)
        .output()
        .context("running cargo deb")?;
    if !out.status.success() {
        bail!(
            "cargo deb failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // cargo-deb prints the package's path last.
    let printed = String::from_utf8_lossy(&out.stdout);
    let path = printed
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.ends_with(".deb"))
        .map(PathBuf::from)
        .context("cargo deb did not say where the package is")?;
    Ok(path)
}

/// Installs cargo-deb unless the pinned version is there.
fn ensure_cargo_deb(cargo: &str) -> Result<()> {
    let installed = Command::new(cargo)
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains(CARGO_DEB)
        });
    if installed {
        return Ok(());
    }
    println!("installing cargo-deb {CARGO_DEB}");
    let status = Command::new(cargo)
        .args([
            "install",
            "--locked",
            "--quiet",
            "cargo-deb",
            "--version",
            CARGO_DEB,
        ])
        .status()
        .context("running cargo install")?;
    anyhow::ensure!(
        status.success(),
        "installing cargo-deb failed; run: cargo install --locked cargo-deb --version {CARGO_DEB}"
    );
    Ok(())
}

/// What the package carries beside the binary and the files of `deploy/`, under `dir`:
/// the unit for `/usr/bin`, the man pages and the completions.
fn write_assets(root: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("man"))?;
    std::fs::create_dir_all(dir.join("completions"))?;

    // The unit in deploy/ is the one for an install from source, into /usr/local/bin.
    let unit = std::fs::read_to_string(root.join("deploy/wsx.service"))?;
    anyhow::ensure!(
        unit.contains("/usr/local/bin/wsx"),
        "deploy/wsx.service no longer runs /usr/local/bin/wsx; update the packaging"
    );
    std::fs::write(
        dir.join("wsx.service"),
        unit.replace("/usr/local/bin/wsx", "/usr/bin/wsx"),
    )?;

    let mut command = wsx::command();
    command.build();
    let source = format!("wsx {}", command.get_version().unwrap_or_default());
    for page in pages(&command) {
        let name = page
            .get_display_name()
            .unwrap_or_else(|| page.get_name())
            .to_owned();
        let mut roff = Vec::new();
        clap_mangen::Man::new(page.clone())
            .source(source.as_str())
            .manual("wsx manual")
            .render(&mut roff)?;
        let file = std::fs::File::create(dir.join("man").join(format!("{name}.1.gz")))?;
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
        gz.write_all(&roff)?;
        gz.finish()?;
    }

    for (shell, file) in [
        (clap_complete::Shell::Bash, "wsx.bash"),
        (clap_complete::Shell::Zsh, "_wsx"),
        (clap_complete::Shell::Fish, "wsx.fish"),
    ] {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command, "wsx", &mut script);
        std::fs::write(dir.join("completions").join(file), script)?;
    }
    Ok(())
}

/// The command and every subcommand a person types (not hidden ones, not `help`), depth
/// first: one man page each.
fn pages(command: &clap::Command) -> Vec<&clap::Command> {
    let mut all = vec![command];
    for sub in command.get_subcommands() {
        if !sub.is_hide_set() && sub.get_name() != "help" {
            all.extend(pages(sub));
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_gets_a_page_named_after_its_path() {
        let mut command = wsx::command();
        command.build();
        let names: Vec<String> = pages(&command)
            .iter()
            .map(|c| c.get_display_name().unwrap_or(c.get_name()).to_owned())
            .collect();
        for expected in ["wsx", "wsx-run", "wsx-check-config", "wsx-sessions"] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} in {names:?}"
            );
        }
        assert!(!names.iter().any(|n| n.ends_with("-help")), "{names:?}");
    }
}
