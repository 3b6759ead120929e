//! A Samba server in one of the lab's namespaces, for the SMB tests and benchmarks: `smbd`
//! from a private configuration in its own directory (nothing of the host's Samba setup is
//! read or written), listening on the node's lab addresses, IPv4 and IPv6, port 445.
//!
//! Shares: `pub` (guest access, writable) and `encrypted` (SMB3 encryption required); both
//! serve [`Samba::share_dir`]. A user `root` with [`Samba::PASSWORD`] exists in the private
//! password database for authenticated (and signed) sessions. [`Samba::client_config`]
//! writes a client configuration (also private) for `smbclient`.
//!
//! Needs `smbd`, `smbpasswd` and `smbclient` (Debian: `samba`, `smbclient`).

use crate::{Lab, Node};
use anyhow::{Context, Result, bail};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `smbd`; stopped when dropped.
#[derive(Debug)]
pub struct Samba {
    child: Child,
    dir: PathBuf,
}

impl Samba {
    /// The password of the user `root` in the server's private database.
    pub const PASSWORD: &'static str = "wsx-lab-smb";

    /// Starts `smbd` in `node`, on the node's addresses in `addresses`, with its state in
    /// `dir` (created), and waits until it accepts connections.
    pub fn start(lab: &Lab, node: Node, addresses: &[IpAddr], dir: &Path) -> Result<Self> {
        for sub in [
            "share", "private", "lock", "state", "cache", "pid", "ncalrpc", "log",
        ] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let d = dir.display();
        let interfaces: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
        let config = format!(
            "[global]
server role = standalone server
interfaces = {interfaces}
bind interfaces only = yes
disable netbios = yes
smb ports = 445
server min protocol = SMB2_02
server max protocol = SMB3_11
map to guest = Bad User
server services = smb
lock directory = {d}/lock
state directory = {d}/state
cache directory = {d}/cache
pid directory = {d}/pid
private dir = {d}/private
ncalrpc dir = {d}/ncalrpc
passdb backend = tdbsam:{d}/private/passdb.tdb
log file = {d}/log/smbd.log
load printers = no
disable spoolss = yes
printcap name = /dev/null
[pub]
path = {d}/share
guest ok = yes
read only = no
force user = root
[encrypted]
path = {d}/share
read only = yes
smb encrypt = required
",
            interfaces = interfaces.join(" ")
        );
        let conf = dir.join("smb.conf");
        std::fs::write(&conf, config).with_context(|| format!("writing {}", conf.display()))?;
        // The user for authenticated sessions, in the private database only.
        let mut add = lab.command(node, "smbpasswd");
        add.arg("-c")
            .arg(&conf)
            .args(["-s", "-a", "root"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut add = add
            .spawn()
            .context("running smbpasswd (is samba installed?)")?;
        if let Some(mut stdin) = add.stdin.take() {
            use std::io::Write;
            writeln!(stdin, "{0}\n{0}", Self::PASSWORD).context("smbpasswd's input")?;
        }
        let out = add.wait_with_output().context("waiting for smbpasswd")?;
        if !out.status.success() {
            bail!(
                "smbpasswd failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        // setsid: on exit smbd signals its whole process group, which would be ours.
        let log = std::fs::File::create(dir.join("log/foreground.log"))?;
        let child = lab
            .command(node, "setsid")
            .arg("smbd")
            .arg("-s")
            .arg(&conf)
            .args(["--foreground", "--no-process-group", "--debug-stdout"])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting smbd (is samba installed?)")?;
        let mut samba = Self {
            child,
            dir: dir.to_owned(),
        };
        let first = *addresses.first().context("no address for smbd")?;
        samba.wait_ready(lab, node, SocketAddr::new(first, 445))?;
        Ok(samba)
    }

    fn wait_ready(&mut self, lab: &Lab, node: Node, at: SocketAddr) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "smbd exited ({status}); see {}",
                    self.dir.join("log").display()
                );
            }
            let up = lab.run_in(node, move || {
                TcpStream::connect_timeout(&at, Duration::from_millis(200)).is_ok()
            })?;
            if up {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("smbd not listening on {at} after 20 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The directory both shares serve.
    pub fn share_dir(&self) -> PathBuf {
        self.dir.join("share")
    }

    /// Writes a private `smbclient` configuration for dialects up to `max_protocol` (e.g.
    /// `SMB2_10`, `SMB3_11`) with signing off unless the command line asks for it, and
    /// returns its path.
    pub fn client_config(&self, max_protocol: &str) -> Result<PathBuf> {
        let dir = self.dir.join(format!("client-{max_protocol}"));
        for sub in ["lock", "state", "cache", "private"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let d = dir.display();
        let path = dir.join("smb.conf");
        std::fs::write(
            &path,
            format!(
                "[global]
client min protocol = SMB2_02
client max protocol = {max_protocol}
client signing = disabled
client ipc signing = disabled
lock directory = {d}/lock
state directory = {d}/state
cache directory = {d}/cache
private dir = {d}/private
"
            ),
        )?;
        Ok(path)
    }

    /// `smbclient` in `node` with `config` (from [`Samba::client_config`]) and `args`.
    pub fn smbclient(lab: &Lab, node: Node, config: &Path, args: &[&str]) -> Command {
        let mut cmd = lab.command(node, "smbclient");
        cmd.arg("-s").arg(config).args(args);
        cmd
    }
}

impl Drop for Samba {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
