//! `wsx run`: the gateway under systemd.

use crate::config::Loaded;
use anyhow::{Context, Result};
use std::path::Path;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;
use wsx_proxy::Gateway;
use wsx_proxy::rules::{self, RulesConfig};

pub(crate) fn run(path: &Path) -> Result<()> {
    let loaded = Loaded::read(path)?;
    let config = loaded.gateway()?;
    init_logging(&loaded.config.log.level)?;
    let drain = loaded.config.sessions.drain_timeout;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("wsx")
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let gateway = Gateway::start(config).await?;
        info!(version = env!("CARGO_PKG_VERSION"), config = %path.display(), "wsx running");
        notify(&[sd_notify::NotifyState::Ready]);
        let watchdog = tokio::spawn(watchdog());
        let mut hangup = signal(SignalKind::hangup())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut drain = drain;
        loop {
            tokio::select! {
                _ = hangup.recv() => {
                    notify(&[sd_notify::NotifyState::Reloading]);
                    match reload(&gateway, path).await {
                        Ok(new_drain) => drain = new_drain,
                        Err(e) => error!("reload failed, keeping the running configuration: {e:#}"),
                    }
                    notify(&[sd_notify::NotifyState::Ready]);
                }
                _ = terminate.recv() => break,
                _ = interrupt.recv() => break,
            }
        }
        info!(deadline = ?drain, "stopping");
        notify(&[sd_notify::NotifyState::Stopping]);
        watchdog.abort();
        gateway.shutdown(drain).await;
        info!("stopped");
        Ok(())
    })
}

async fn reload(gateway: &Gateway, path: &Path) -> Result<Duration> {
    let loaded = Loaded::read(path)?;
    let config = loaded.gateway()?;
    gateway.reload(config).await?;
    Ok(loaded.config.sessions.drain_timeout)
}

/// Removes the rules a configuration would install: after a crash, the table, the routing
/// rules and the route table are all that is left behind.
pub(crate) fn cleanup(path: &Path) -> Result<()> {
    let loaded = Loaded::read(path)?;
    let config = loaded.gateway()?;
    // Without [intercept], transparent origin installs its rule with the default numbers;
    // removing what is not there is harmless.
    let i = config.intercept.unwrap_or_default();
    rules::remove(&RulesConfig {
        port: i.port,
        mark: i.mark,
        route_table: i.route_table,
        rule_priority: i.rule_priority,
        interfaces: i.interfaces,
        prefixes: Vec::new(),
    });
    Ok(())
}

/// One line per event; under systemd (journald keeps its own timestamps) without time or
/// colour.
fn init_logging(level: &str) -> Result<()> {
    let filter = EnvFilter::try_from_env("WSX_LOG")
        .or_else(|_| EnvFilter::try_new(level))
        .with_context(|| format!("log.level: not a valid filter: {level}"))?;
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    if journal {
        builder.without_time().with_ansi(false).init();
    } else {
        builder.with_ansi(false).init();
    }
    Ok(())
}

fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, state) {
        warn!(error = %e, "telling systemd");
    }
}

/// Pings systemd's watchdog at half its interval, if the unit enables it.
async fn watchdog() {
    let mut usec = 0;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return;
    }
    let mut interval = tokio::time::interval(Duration::from_micros(usec) / 2);
    loop {
        interval.tick().await;
        notify(&[sd_notify::NotifyState::Watchdog]);
    }
}
