//! What the API acts on outside the gateway: the configuration file and the log filter.
//!
//! A reload by SIGHUP and `PUT /api/v1/config` take the same path, one at a time: parse and
//! validate, apply to the gateway, and (for the API) write the file. The file is written
//! before the gateway is changed, atomically (a temporary file in the same directory,
//! synced, renamed over the old one, the directory synced), and put back if the gateway
//! refuses the change, so that the file and the running configuration never disagree for
//! longer than the change takes, and a crash in the middle leaves one or the other whole.

use crate::config::Loaded;
use crate::config::edit::EditError;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tracing::info;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::reload;
use wsx_api::model::{ConfigSummary, ConfigView, ShaperEdit};
use wsx_api::{ApiError, BoxFuture, ErrorCode};
use wsx_proxy::{Gateway, GatewayConfig, GatewayError};

/// Changes the log filter of the running subscriber.
pub(crate) struct LogControl {
    handle: reload::Handle<EnvFilter, tracing_subscriber::Registry>,
    filter: Mutex<String>,
}

impl LogControl {
    pub(crate) fn new(
        handle: reload::Handle<EnvFilter, tracing_subscriber::Registry>,
        filter: String,
    ) -> Self {
        Self {
            handle,
            filter: Mutex::new(filter),
        }
    }

    pub(crate) fn filter(&self) -> String {
        self.filter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, filter: &str) -> Result<(), String> {
        let parsed = EnvFilter::try_new(filter).map_err(|e| e.to_string())?;
        self.handle.reload(parsed).map_err(|e| e.to_string())?;
        *self.filter.lock().unwrap_or_else(PoisonError::into_inner) = filter.to_owned();
        Ok(())
    }
}

/// The daemon's side of the API.
pub(crate) struct Daemon {
    gateway: Arc<Gateway>,
    path: PathBuf,
    running: Mutex<Arc<Loaded>>,
    /// One reload at a time, whoever asks.
    reloading: tokio::sync::Mutex<()>,
    log: LogControl,
}

impl Daemon {
    pub(crate) fn new(gateway: Arc<Gateway>, loaded: Loaded, log: LogControl) -> Self {
        Self {
            gateway,
            path: loaded.path.clone(),
            running: Mutex::new(Arc::new(loaded)),
            reloading: tokio::sync::Mutex::new(()),
            log,
        }
    }

    /// The configuration running now.
    pub(crate) fn running(&self) -> Arc<Loaded> {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// SIGHUP: applies the file as it is now.
    pub(crate) async fn reload_file(&self) -> Result<()> {
        let _one = self.reloading.lock().await;
        let loaded = Loaded::read(&self.path)?;
        let config = check(&loaded)?;
        self.apply(loaded, config).await.map_err(anyhow::Error::new)
    }

    /// The API: validates `text`, writes it to the file, applies it; puts the old file
    /// back if the gateway refuses it.
    async fn apply_text(&self, text: String) -> Result<ConfigSummary, ApiError> {
        let _one = self.reloading.lock().await;
        self.apply_locked(text).await
    }

    /// The API: makes `edit` on the configuration file as it is on disk, then as
    /// [`Self::apply_text`].
    async fn apply_edit(&self, edit: ShaperEdit) -> Result<ConfigSummary, ApiError> {
        let _one = self.reloading.lock().await;
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| internal(format!("reading {}: {e}", self.path.display())))?;
        let text = crate::config::edit::apply(&text, &edit).map_err(|e| match e {
            EditError::NotFound(message) => ApiError::new(ErrorCode::NotFound, message),
            EditError::Fields(message) => ApiError::new(ErrorCode::InvalidValue, message),
            EditError::File(message) => ApiError::new(ErrorCode::InvalidConfig, message),
        })?;
        self.apply_locked(text).await
    }

    /// Validates `text`, writes it to the file, applies it; puts the old file back if the
    /// gateway refuses it. The caller holds `reloading`.
    async fn apply_locked(&self, text: String) -> Result<ConfigSummary, ApiError> {
        let (loaded, config) = self.validate(text)?;
        let summary = summary(&config, true);
        let previous = std::fs::read(&self.path)
            .map_err(|e| internal(format!("reading {}: {e}", self.path.display())))?;
        write_atomically(&self.path, loaded.text.as_bytes())
            .map_err(|e| internal(format!("{e:#}")))?;
        if let Err(e) = self.apply(loaded, config).await {
            if let Err(restore) = write_atomically(&self.path, &previous) {
                tracing::error!(error = %format!("{restore:#}"), "could not restore the configuration file");
            }
            return Err(e);
        }
        info!(path = %self.path.display(), "configuration applied and saved through the API");
        Ok(summary)
    }

    /// Parses and checks a candidate as if it were the file.
    fn validate(&self, text: String) -> Result<(Loaded, GatewayConfig), ApiError> {
        let loaded = Loaded::parse(&self.path, text).map_err(config_error)?;
        let config = check(&loaded).map_err(config_error)?;
        Ok((loaded, config))
    }

    async fn apply(&self, loaded: Loaded, config: GatewayConfig) -> Result<(), ApiError> {
        if loaded.config.api != self.running().config.api {
            tracing::warn!("the [api] section changed: it takes effect at the next restart");
        }
        self.gateway.reload(config).await.map_err(|e| match e {
            GatewayError::NeedsRestart(what) => ApiError::new(
                ErrorCode::NeedsRestart,
                format!("{what} cannot change without a restart"),
            ),
            GatewayError::Peers(e) => ApiError::new(ErrorCode::InvalidConfig, e.to_string()),
            GatewayError::Shaping(e) => ApiError::new(ErrorCode::InvalidConfig, e.to_string()),
            other => internal(other.to_string()),
        })?;
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(loaded);
        Ok(())
    }

    /// How long a stop lets sessions finish, as configured now.
    pub(crate) fn drain_timeout(&self) -> Duration {
        self.running().config.sessions.drain_timeout
    }
}

impl wsx_api::Control for Daemon {
    fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    fn config(&self) -> ConfigView {
        let running = self.running();
        ConfigView {
            path: self.path.display().to_string(),
            config: serde_json::to_value(&running.config).unwrap_or_else(
                |e| serde_json::json!({ "error": format!("cannot show the configuration: {e}") }),
            ),
        }
    }

    fn check_config(&self, text: &str) -> Result<ConfigSummary, ApiError> {
        let (_, config) = self.validate(text.to_owned())?;
        Ok(summary(&config, false))
    }

    fn apply_config(&self, text: String) -> BoxFuture<'_, Result<ConfigSummary, ApiError>> {
        Box::pin(self.apply_text(text))
    }

    fn edit_shaper(&self, edit: ShaperEdit) -> BoxFuture<'_, Result<ConfigSummary, ApiError>> {
        Box::pin(self.apply_edit(edit))
    }

    fn log_filter(&self) -> String {
        self.log.filter()
    }

    fn set_log_filter(&self, filter: &str) -> Result<(), ApiError> {
        self.log
            .set(filter)
            .map_err(|e| ApiError::new(ErrorCode::InvalidValue, e).field("filter"))
    }
}

/// Checks everything a restart would (the `[api]` table too, though a reload does not
/// apply it: a candidate saved now must start later) and returns the gateway's settings.
fn check(loaded: &Loaded) -> Result<GatewayConfig> {
    loaded.api()?;
    loaded.gateway()
}

fn summary(config: &GatewayConfig, applied: bool) -> ConfigSummary {
    ConfigSummary {
        peers: config.peers.len() as u64,
        interception: config.intercept.is_some(),
        applied,
    }
}

/// A configuration error as the API reports it: the field, line and column it names.
fn config_error(e: anyhow::Error) -> ApiError {
    match e.downcast::<crate::config::ConfigError>() {
        Ok(c) => {
            let mut error = ApiError::new(ErrorCode::InvalidConfig, c.message.clone());
            if let Some(field) = &c.field {
                error = error.field(field.clone());
            }
            if let Some((line, column)) = c.position {
                error = error.at(line as u32, column as u32);
            }
            error
        }
        Err(other) => ApiError::new(ErrorCode::InvalidConfig, format!("{other:#}")),
    }
}

fn internal(message: String) -> ApiError {
    ApiError::new(ErrorCode::Internal, message)
}

/// Replaces `path` with `contents` so that a crash leaves either the old file or the new one:
/// a temporary file beside it, synced, renamed over it, and the directory synced. The new
/// file keeps the old one's permissions (it may hold a key).
fn write_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    if let Ok(meta) = std::fs::metadata(path) {
        file.as_file()
            .set_permissions(meta.permissions())
            .context("copying the file's permissions")?;
    }
    file.write_all(contents)
        .context("writing the configuration")?;
    file.as_file()
        .sync_all()
        .context("syncing the configuration")?;
    file.persist(path)
        .with_context(|| format!("replacing {}", path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_replaces_the_file_and_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("wsx.toml");
        std::fs::write(&path, "old").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        write_atomically(&path, b"new").unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(std::fs::read(&path).unwrap_or_default(), b"new");
        let mode = std::fs::metadata(&path)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or_default();
        assert_eq!(mode, 0o600);
        // Nothing else is left in the directory.
        assert_eq!(
            std::fs::read_dir(dir.path())
                .map(|d| d.count())
                .unwrap_or(0),
            1
        );
    }
}
