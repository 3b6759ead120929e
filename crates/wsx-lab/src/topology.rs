//! The lab topology: `client — gw-a — wan — gw-b — server`, five network namespaces joined by
//! veth pairs, with the WAN emulator bridging the two interfaces of `wan`.
//!
//! ```text
//!  client        gw-a                 wan                  gw-b              server
//!  eth0 ──── lan0    wan0 ──── a0 [emulator] b0 ──── wan0    lan0 ──── eth0
//!  .1.2      .1.1    .2.1                                .2.2    .3.1      .3.2
//! ```
//!
//! [`Lab::start_clean`] puts a kernel bridge in the emulator's place, with the veths' offloads
//! on: a path with nothing to emulate, for measuring what the gateways themselves cost.
//!
//! IPv4 uses 10.71.0.0/16 and IPv6 the ULA prefix fd57:5358:1ab::/48, only inside the lab's
//! namespaces; the three subnets are `.1` (client LAN), `.2` (the WAN, one L2 segment through
//! the emulator) and `.3` (server LAN). gw-a and gw-b route between them.

use crate::emulator::{EmulatorConfig, EmulatorHandle};
use crate::netns;
use anyhow::{Context, Result, bail};
use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Every lab namespace name starts with this, then the creating process id and a counter:
/// `wsxl-<pid>-<n>-<node>`. `clean` uses the pid to find leftovers of dead runs.
pub const PREFIX: &str = "wsxl-";
/// Per-lab runtime files (the emulator's control socket).
const RUN_DIR: &str = "/run/wsx-lab";

/// A host of the lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Node {
    /// The client endpoint.
    Client,
    /// The client-side gateway.
    GwA,
    /// The WAN, where the emulator runs.
    Wan,
    /// The server-side gateway.
    GwB,
    /// The server endpoint.
    Server,
}

impl Node {
    /// All nodes, client to server.
    pub const ALL: [Node; 5] = [Node::Client, Node::GwA, Node::Wan, Node::GwB, Node::Server];

    /// The suffix of the node's namespace name.
    pub fn role(self) -> &'static str {
        match self {
            Node::Client => "client",
            Node::GwA => "gwa",
            Node::Wan => "wan",
            Node::GwB => "gwb",
            Node::Server => "server",
        }
    }
}

/// The lab's fixed addresses. They exist only inside the lab's namespaces.
pub mod addr {
    use super::*;

    /// The client.
    pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 1, 2);
    /// gw-a on the client LAN.
    pub const GWA_LAN_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 1, 1);
    /// gw-a on the WAN.
    pub const GWA_WAN_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 1);
    /// gw-b on the WAN.
    pub const GWB_WAN_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 2);
    /// gw-b on the server LAN.
    pub const GWB_LAN_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 3, 1);
    /// The server.
    pub const SERVER_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 3, 2);

    const fn v6(subnet: u16, host: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd57, 0x5358, 0x01ab, subnet, 0, 0, 0, host)
    }
    /// The client.
    pub const CLIENT_V6: Ipv6Addr = v6(1, 2);
    /// gw-a on the client LAN.
    pub const GWA_LAN_V6: Ipv6Addr = v6(1, 1);
    /// gw-a on the WAN.
    pub const GWA_WAN_V6: Ipv6Addr = v6(2, 1);
    /// gw-b on the WAN.
    pub const GWB_WAN_V6: Ipv6Addr = v6(2, 2);
    /// gw-b on the server LAN.
    pub const GWB_LAN_V6: Ipv6Addr = v6(3, 1);
    /// The server.
    pub const SERVER_V6: Ipv6Addr = v6(3, 2);

    /// The server's address in the given family.
    pub fn server(ipv6: bool) -> IpAddr {
        if ipv6 {
            SERVER_V6.into()
        } else {
            SERVER_V4.into()
        }
    }

    /// The client's address in the given family.
    pub fn client(ipv6: bool) -> IpAddr {
        if ipv6 {
            CLIENT_V6.into()
        } else {
            CLIENT_V4.into()
        }
    }

    /// The client's LAN (behind gw-a): its IPv4 /24 and IPv6 /64, as prefix strings.
    pub fn client_lan() -> [String; 2] {
        lan(CLIENT_V4, CLIENT_V6)
    }

    /// The server's LAN (behind gw-b).
    pub fn server_lan() -> [String; 2] {
        lan(SERVER_V4, SERVER_V6)
    }

    fn lan(v4: Ipv4Addr, v6: Ipv6Addr) -> [String; 2] {
        let [a, b, c, _] = v4.octets();
        let s = v6.segments();
        [
            format!("{a}.{b}.{c}.0/24"),
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3]),
        ]
    }
}

/// Names of labs this process has running, for cleanup on a signal.
static ACTIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A running lab. Dropping it kills its processes and deletes its namespaces, also when a test
/// panics; [`install_signal_cleanup`] covers Ctrl-C and SIGTERM, and [`clean`] what a killed run
/// left.
///
/// The emulator is started with `PR_SET_PDEATHSIG` tied to the thread that calls [`Lab::start`]:
/// keep the lab on that thread.
#[derive(Debug)]
pub struct Lab {
    name: String,
    /// `None` when the WAN is a kernel bridge.
    emulator: Option<Child>,
    handle: EmulatorHandle,
    run_dir: PathBuf,
}

/// What joins gw-a's and gw-b's WAN interfaces in the `wan` namespace.
#[derive(Clone, Debug)]
enum Wan<'a> {
    /// The userspace emulator with these link parameters.
    Emulated(&'a EmulatorConfig),
    /// A kernel bridge; the WAN veths keep their offloads and get this MTU.
    Clean { mtu: u16 },
}

impl Lab {
    /// Builds the topology and starts the emulator with `config`. On any error everything
    /// created so far is removed.
    pub fn start(config: &EmulatorConfig) -> Result<Lab> {
        config.validate()?;
        Self::start_with(Wan::Emulated(config))
    }

    /// Builds the topology with a kernel bridge instead of the emulator: no delay, no loss,
    /// no rate limit, segmentation offloads on, `mtu` on the WAN veths (1500 for Ethernet,
    /// 9000 for jumbo frames). Everything the emulator would answer fails.
    pub fn start_clean(mtu: u16) -> Result<Lab> {
        if !(1280..=65_535).contains(&mtu) {
            bail!("a clean WAN's MTU must be 1280 to 65535 bytes (IPv6 needs 1280), not {mtu}");
        }
        Self::start_with(Wan::Clean { mtu })
    }

    fn start_with(wan: Wan<'_>) -> Result<Lab> {
        check_prerequisites()?;
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        ACTIVE
            .lock()
            .map_err(|_| anyhow::anyhow!("lab registry poisoned"))?
            .push(name.clone());
        let run_dir = Path::new(RUN_DIR).join(&name);
        let built = build(&name, &run_dir, wan);
        match built {
            Ok((emulator, handle)) => Ok(Lab {
                name,
                emulator,
                handle,
                run_dir,
            }),
            Err(e) => {
                let _ = remove(&name);
                Err(e.context(format!("building lab {name}")))
            }
        }
    }

    /// The lab's name, the prefix of its namespaces.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace of `node`.
    pub fn netns(&self, node: Node) -> String {
        netns_name(&self.name, node)
    }

    /// A command that runs `program` inside `node`'s namespace and dies with the thread that
    /// spawns it.
    pub fn command(&self, node: Node, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec"])
            .arg(self.netns(node))
            .arg(program);
        // SAFETY: prctl is async-signal-safe, as pre_exec requires.
        unsafe { cmd.pre_exec(crate::sys::die_with_parent) };
        cmd
    }

    /// Runs `f` on a thread inside `node`'s namespace (see [`netns::run_in`]).
    pub fn run_in<T: Send + 'static>(
        &self,
        node: Node,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        netns::run_in(&self.netns(node), f)
    }

    /// The emulator's control handle: statistics and run-time changes. On a clean lab its
    /// requests fail.
    pub fn emulator(&self) -> &EmulatorHandle {
        &self.handle
    }

    /// The emulator's process id (`None` on a clean lab).
    pub fn emulator_pid(&self) -> Option<u32> {
        self.emulator.as_ref().map(Child::id)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(emulator) = &mut self.emulator {
            let _ = emulator.kill();
            let _ = emulator.wait();
        }
        if let Err(e) = remove(&self.name) {
            eprintln!("wsx-lab: tearing down {}: {e:#}", self.name);
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

fn netns_name(lab: &str, node: Node) -> String {
    format!("{lab}-{}", node.role())
}

fn check_prerequisites() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the lab needs root (network namespaces, veth, AF_PACKET); run as root");
    }
    for tool in ["ip", "ethtool"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()));
        if !found {
            bail!("`{tool}` is not installed: apt-get install -y iproute2 ethtool");
        }
    }
    Ok(())
}

fn build(name: &str, run_dir: &Path, wan_link: Wan<'_>) -> Result<(Option<Child>, EmulatorHandle)> {
    let ns = |node| netns_name(name, node);
    let (client, gwa, wan, gwb, server) = (
        ns(Node::Client),
        ns(Node::GwA),
        ns(Node::Wan),
        ns(Node::GwB),
        ns(Node::Server),
    );

    let mut host = String::new();
    for node in Node::ALL {
        host += &format!("netns add {}\n", ns(node));
    }
    netns::ip_batch(None, &host)?;

    // Sysctls before the links exist, so new interfaces inherit the defaults.
    let no_dad = [
        "net.ipv6.conf.default.accept_dad=0",
        "net.ipv6.conf.all.accept_dad=0",
    ];
    // Room for a 400 ms x 1 Gbit/s window; autotuning grows buffers up to these maxima.
    let tcp = [
        "net.ipv4.tcp_rmem=4096 131072 134217728",
        "net.ipv4.tcp_wmem=4096 16384 134217728",
        "net.ipv4.tcp_no_metrics_save=1",
    ];
    let forward = ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"];
    // The wan namespace has no IP presence: the emulator is a bridge.
    let silent = [
        "net.ipv6.conf.default.disable_ipv6=1",
        "net.ipv6.conf.all.disable_ipv6=1",
    ];
    for (netns, keys) in [
        (&client, [&no_dad[..], &tcp[..]].concat()),
        (&gwa, [&no_dad[..], &tcp[..], &forward[..]].concat()),
        (&wan, silent.to_vec()),
        (&gwb, [&no_dad[..], &tcp[..], &forward[..]].concat()),
        (&server, [&no_dad[..], &tcp[..]].concat()),
    ] {
        let mut args = vec!["-q", "-w"];
        args.extend(keys.iter().copied());
        netns::exec(netns, "sysctl", &args)?;
    }

    netns::ip_batch(
        None,
        &format!(
            "link add eth0 netns {client} type veth peer name lan0 netns {gwa}\n\
             link add wan0 netns {gwa} type veth peer name a0 netns {wan}\n\
             link add b0 netns {wan} type veth peer name wan0 netns {gwb}\n\
             link add lan0 netns {gwb} type veth peer name eth0 netns {server}\n"
        ),
    )?;

    netns::ip_batch(
        Some(&client),
        &endpoint_script(
            addr::CLIENT_V4,
            addr::CLIENT_V6,
            addr::GWA_LAN_V4,
            addr::GWA_LAN_V6,
        ),
    )?;
    netns::ip_batch(
        Some(&gwa),
        &gateway_script(
            [addr::GWA_LAN_V4, addr::GWA_WAN_V4, addr::GWB_WAN_V4],
            [addr::GWA_LAN_V6, addr::GWA_WAN_V6, addr::GWB_WAN_V6],
            "10.71.3.0/24",
            "fd57:5358:1ab:3::/64",
        ),
    )?;
    netns::ip_batch(
        Some(&wan),
        "link set lo up\nlink set a0 promisc on up\nlink set b0 promisc on up\n",
    )?;
    netns::ip_batch(
        Some(&gwb),
        &gateway_script(
            [addr::GWB_LAN_V4, addr::GWB_WAN_V4, addr::GWA_WAN_V4],
            [addr::GWB_LAN_V6, addr::GWB_WAN_V6, addr::GWA_WAN_V6],
            "10.71.1.0/24",
            "fd57:5358:1ab:1::/64",
        ),
    )?;
    netns::ip_batch(
        Some(&server),
        &endpoint_script(
            addr::SERVER_V4,
            addr::SERVER_V6,
            addr::GWB_LAN_V4,
            addr::GWB_LAN_V6,
        ),
    )?;

    let config = match wan_link {
        Wan::Emulated(config) => config,
        Wan::Clean { mtu } => {
            for (netns, dev) in [(&gwa, "wan0"), (&wan, "a0"), (&wan, "b0"), (&gwb, "wan0")] {
                netns::exec(
                    netns,
                    "ip",
                    &["link", "set", "dev", dev, "mtu", &mtu.to_string()],
                )?;
            }
            netns::ip_batch(
                Some(&wan),
                "link add br0 type bridge
link set a0 master br0
link set b0 master br0
                 link set br0 up
",
            )?;
            return Ok((None, EmulatorHandle::absent()));
        }
    };
    // Frames on the emulated WAN must be MTU-sized and carry finished checksums, as on a real
    // link: the gateways' WAN interfaces segment and checksum in software before sending, and
    // the emulator's interfaces neither coalesce nor defer checksums.
    for (netns, dev) in [(&gwa, "wan0"), (&wan, "a0"), (&wan, "b0"), (&gwb, "wan0")] {
        netns::exec(
            netns,
            "ethtool",
            &[
                "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off",
            ],
        )?;
    }

    std::fs::create_dir_all(run_dir)?;
    let socket = run_dir.join("emulator.sock");
    let binary = crate::lab_binary()?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &wan])
        .arg(&binary)
        .args(["emulate", "--a", "a0", "--b", "b0", "--control"])
        .arg(&socket)
        .arg("--config")
        .arg(serde_json::to_string(config)?)
        .stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe, as pre_exec requires.
    unsafe { cmd.pre_exec(crate::sys::die_with_parent) };
    let mut emulator = cmd
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let handle = EmulatorHandle::new(&socket);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if handle.stats().is_ok() {
            return Ok((Some(emulator), handle));
        }
        if let Some(status) = emulator.try_wait()? {
            bail!("the emulator exited during start-up: {status}");
        }
        if Instant::now() > deadline {
            let _ = emulator.kill();
            bail!(
                "the emulator did not answer on {} within 10 s",
                socket.display()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `ip -batch` commands for an endpoint: its addresses on `eth0`, default routes via its gateway.
fn endpoint_script(
    v4: Ipv4Addr,
    v6: Ipv6Addr,
    gateway_v4: Ipv4Addr,
    gateway_v6: Ipv6Addr,
) -> String {
    format!(
        "link set lo up\nlink set eth0 up\n\
         addr add {v4}/24 dev eth0\naddr add {v6}/64 dev eth0 nodad\n\
         route add default via {gateway_v4}\nroute add ::/0 via {gateway_v6}\n"
    )
}

/// `ip -batch` commands for a gateway: `[lan, wan, peer's wan]` addresses per family, and a
/// route to the far LAN through the peer gateway.
fn gateway_script(
    v4: [Ipv4Addr; 3],
    v6: [Ipv6Addr; 3],
    far_lan_v4: &str,
    far_lan_v6: &str,
) -> String {
    let ([lan4, wan4, peer4], [lan6, wan6, peer6]) = (v4, v6);
    format!(
        "link set lo up\nlink set lan0 up\nlink set wan0 up\n\
         addr add {lan4}/24 dev lan0\naddr add {lan6}/64 dev lan0 nodad\n\
         addr add {wan4}/24 dev wan0\naddr add {wan6}/64 dev wan0 nodad\n\
         route add {far_lan_v4} via {peer4}\nroute add {far_lan_v6} via {peer6}\n"
    )
}

/// Deletes lab `name`'s namespaces and runtime directory.
fn remove(name: &str) -> Result<()> {
    let mut first_error = None;
    for node in Node::ALL {
        if let Err(e) = netns::delete(&netns_name(name, node)) {
            first_error.get_or_insert(e);
        }
    }
    let _ = std::fs::remove_dir_all(Path::new(RUN_DIR).join(name));
    if let Ok(mut active) = ACTIVE.lock() {
        active.retain(|n| n != name);
    }
    first_error.map_or(Ok(()), Err)
}

/// Removes leftovers of lab runs whose process is gone (or of every run, with `all`), and
/// returns the namespaces removed.
pub fn clean(all: bool) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let mut names: Vec<String> = netns::list()
        .into_iter()
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    names.sort();
    for ns in names {
        let owner = ns[PREFIX.len()..]
            .split('-')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok());
        let owner_alive = owner.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if all || !owner_alive {
            netns::delete(&ns)?;
            removed.push(ns);
        }
    }
    if let Ok(dirs) = std::fs::read_dir(RUN_DIR) {
        for dir in dirs.flatten() {
            let name = dir.file_name().to_string_lossy().into_owned();
            let owner = name
                .strip_prefix(PREFIX)
                .and_then(|r| r.split('-').next()?.parse::<u32>().ok());
            if all || !owner.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_dir_all(dir.path());
            }
        }
    }
    Ok(removed)
}

/// Namespaces of labs that this process has started and not yet torn down.
pub fn active() -> Vec<String> {
    ACTIVE.lock().map(|a| a.clone()).unwrap_or_default()
}

/// Tears down this process's labs on Ctrl-C or SIGTERM, then exits with status 130.
pub fn install_signal_cleanup() -> Result<()> {
    ctrlc::set_handler(|| {
        for name in active() {
            let _ = remove(&name);
        }
        eprintln!("wsx-lab: interrupted; lab namespaces removed");
        std::process::exit(130);
    })
    .context("installing the signal handler")
}
