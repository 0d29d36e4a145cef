//! The Prometheus exporter a program starts from its config (`metrics_listen`,
//! `metrics_file`): a `metrics` recorder for the whole process, which the connector and
//! plugins then report to (see [`meters`](crate::meters) for what they emit).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
#[cfg(feature = "prometheus")]
use std::sync::Mutex;
use std::time::Duration;

#[cfg(feature = "prometheus")]
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

#[cfg(feature = "prometheus")]
use crate::Source;
use crate::{Config, Error, Result, StorageIdentity};

#[cfg(feature = "prometheus")]
/// Histogram buckets of every `_seconds` metric: 100 µs to 30 s.
const SECONDS_BUCKETS: [f64; 17] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// The process's Prometheus exporter, started by [`start_metrics`]. It lives as long as the
/// process: a `metrics` recorder, once installed, cannot be taken back.
///
/// Without the `prometheus` feature of this crate no value of this type exists.
#[derive(Debug)]
pub struct MetricsExporter {
    #[cfg(feature = "prometheus")]
    handle: PrometheusHandle,
    #[cfg(not(feature = "prometheus"))]
    handle: std::convert::Infallible,
    settings: Settings,
}

#[derive(Clone, Debug, PartialEq)]
struct Settings {
    listen: Option<SocketAddr>,
    file: Option<PathBuf>,
    interval: Duration,
}

impl MetricsExporter {
    /// The metrics now, in the Prometheus text format (what `/metrics` serves).
    pub fn render(&self) -> String {
        #[cfg(feature = "prometheus")]
        return self.handle.render();
        #[cfg(not(feature = "prometheus"))]
        match self.handle {}
    }

    /// The loopback address `/metrics` is served on, if any.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.settings.listen
    }

    /// The file rewritten with the metrics, if any.
    pub fn file(&self) -> Option<&Path> {
        self.settings.file.as_deref()
    }
}

#[cfg(feature = "prometheus")]
static STARTED: Mutex<Option<&'static MetricsExporter>> = Mutex::new(None);

/// Starts the Prometheus exporter `config` asks for (`metrics_listen`, `metrics_file`) and
/// installs it as the process's `metrics` recorder; `Ok(None)` when it asks for none.
///
/// One process has one exporter: a second call with the same settings returns the running
/// one (several connectors in one process share it); other settings are an error naming
/// the key. [`open`](crate::open) calls this, so a program that opens through it needs
/// nothing more.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the key when the address cannot be listened on, the file
/// cannot be written, or another exporter runs with other settings;
/// [`Error::Unsupported`] when the process already has a `metrics` recorder of its own, or
/// when this build lacks the `prometheus` feature.
pub fn start_metrics(config: &Config) -> Result<Option<&'static MetricsExporter>> {
    start_with(settings_of(config), config)
}

/// [`start_metrics`] for one rank of a parallel job whose ranks all get the same config
/// (SGLang's extra config): the rank at place `r` of tp × cp × pp serves on the configured
/// port plus `r` and writes `<name>.rank<r>` beside the configured file (`hicache.prom`
/// becomes `hicache.rank3.prom`). A job of one rank uses the config as it is.
/// [`open`](crate::open) calls this with its options' identity.
///
/// # Errors
/// As [`start_metrics`]; also [`Error::InvalidConfig`] naming `metrics_listen` when the
/// port plus the rank passes 65535.
pub fn start_rank_metrics(
    config: &Config,
    identity: &StorageIdentity,
) -> Result<Option<&'static MetricsExporter>> {
    let mut settings = settings_of(config);
    let ranks = u64::from(identity.tp_size.max(1))
        * u64::from(identity.cp_size.max(1))
        * u64::from(identity.pp_size.max(1));
    if ranks > 1 {
        let rank = u64::from(identity.tp_rank)
            + u64::from(identity.tp_size)
                * (u64::from(identity.cp_rank)
                    + u64::from(identity.cp_size) * u64::from(identity.pp_rank));
        if let Some(addr) = &mut settings.listen {
            let port =
                u16::try_from(u64::from(addr.port()) + rank).map_err(|_| Error::InvalidConfig {
                    key: "metrics_listen".into(),
                    source_desc: config.metrics_listen.source.to_string(),
                    reason: format!(
                        "rank {rank} of {ranks} would serve on port {} + {rank}, past 65535",
                        addr.port()
                    ),
                    hint: Some("pick a lower port: each rank serves on its own".into()),
                })?;
            addr.set_port(port);
        }
        if let Some(file) = &mut settings.file {
            *file = rank_file(file, rank);
        }
    }
    start_with(settings, config)
}

/// `hicache.prom` of rank 3: `hicache.rank3.prom` (`metrics` becomes `metrics.rank3`).
fn rank_file(file: &Path, rank: u64) -> PathBuf {
    let stem = file.file_stem().unwrap_or_default().to_string_lossy();
    let name = match file.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    file.with_file_name(name)
}

fn settings_of(config: &Config) -> Settings {
    Settings {
        listen: config.metrics_listen.value,
        file: config.metrics_file.value.clone(),
        interval: Duration::from_secs_f64(config.metrics_file_interval_s.value),
    }
}

fn start_with(settings: Settings, config: &Config) -> Result<Option<&'static MetricsExporter>> {
    if settings.listen.is_none() && settings.file.is_none() {
        return Ok(None);
    }
    #[cfg(not(feature = "prometheus"))]
    let _ = config;
    #[cfg(not(feature = "prometheus"))]
    return Err(Error::Unsupported {
        component: crate::Component::Tool("metrics exporter"),
        operation: format!(
            "exporting metrics to {}: this build has no Prometheus exporter; enable the `prometheus` feature of the `hicache` crate",
            describe(&settings)
        ),
    });
    #[cfg(feature = "prometheus")]
    start(settings, config)
}

#[cfg(feature = "prometheus")]
fn start(settings: Settings, config: &Config) -> Result<Option<&'static MetricsExporter>> {
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(running) = *started {
        if running.settings == settings {
            return Ok(Some(running));
        }
        let (key, source) = if running.settings.listen != settings.listen {
            ("metrics_listen", &config.metrics_listen.source)
        } else if running.settings.file != settings.file {
            ("metrics_file", &config.metrics_file.source)
        } else {
            (
                "metrics_file_interval_s",
                &config.metrics_file_interval_s.source,
            )
        };
        return Err(Error::InvalidConfig {
            key: key.into(),
            source_desc: source.to_string(),
            reason: format!(
                "this process's exporter already runs with {}",
                describe(&running.settings)
            ),
            hint: Some(
                "one process has one exporter: give every connector the same metrics settings"
                    .into(),
            ),
        });
    }
    let exporter: &'static MetricsExporter = Box::leak(Box::new(spawn(settings, config)?));
    hicache_core::meters::describe();
    tracing::info!("metrics: {}", describe(&exporter.settings));
    *started = Some(exporter);
    Ok(Some(exporter))
}

fn describe(s: &Settings) -> String {
    let mut parts = Vec::new();
    if let Some(addr) = s.listen {
        parts.push(format!("http://{addr}/metrics"));
    }
    if let Some(file) = &s.file {
        parts.push(format!("{} every {:?}", file.display(), s.interval));
    }
    parts.join(" and ")
}

/// Why the exporter's thread could not start serving.
#[cfg(feature = "prometheus")]
enum Failed {
    Runtime(std::io::Error),
    Buckets(String),
    Listen(String),
    RecorderTaken,
}

/// Builds the recorder on its own thread (`hicache-metrics`, a one-thread tokio runtime that
/// serves HTTP and rewrites the file), installs it, and returns once both are known to work.
/// Everything tokio happens on that thread, so a caller inside an async runtime is fine.
#[cfg(feature = "prometheus")]
fn spawn(settings: Settings, config: &Config) -> Result<MetricsExporter> {
    let refused = |key: &str, source: &Source, reason: String, hint: &str| Error::InvalidConfig {
        key: key.into(),
        source_desc: source.to_string(),
        reason,
        hint: Some(hint.into()),
    };
    let component = crate::Component::Tool("metrics exporter");
    // Whether the file is new: a start that fails later removes it again.
    let created = settings.file.as_deref().is_some_and(|f| !f.exists());
    if let Some(file) = &settings.file {
        write_file(file, "").map_err(|e| {
            refused(
                "metrics_file",
                &config.metrics_file.source,
                format!("cannot write {}: {e}", file.display()),
                "name a file in an existing dir this process may write",
            )
        })?;
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let thread = settings.clone();
    std::thread::Builder::new()
        .name("hicache-metrics".into())
        .spawn(move || serve(thread, tx))
        .map_err(|e| Error::io(component.clone(), "start its thread", None, e))?;
    let failed = match rx.recv() {
        Ok(Ok(handle)) => return Ok(MetricsExporter { handle, settings }),
        Ok(Err(failed)) => failed,
        Err(_) => Failed::Runtime(std::io::Error::other("the exporter's thread ended")),
    };
    if created && let Some(file) = &settings.file {
        let _ = std::fs::remove_file(file);
    }
    Err(match failed {
        Failed::Runtime(e) => Error::io(component, "start its runtime", None, e),
        Failed::Buckets(e) => Error::backend(component, e),
        Failed::Listen(e) => refused(
            "metrics_listen",
            &config.metrics_listen.source,
            format!(
                "cannot serve on {}: {e}",
                settings.listen.map(|a| a.to_string()).unwrap_or_default()
            ),
            "pick a free port, or leave metrics_listen empty",
        ),
        Failed::RecorderTaken => Error::Unsupported {
            component,
            operation: "installing the Prometheus exporter: this process already has a `metrics` recorder (leave metrics_listen and metrics_file empty and export through yours)".into(),
        },
    })
}

/// The exporter's thread: builds and installs the recorder, reports how that went on
/// `started`, then serves HTTP and rewrites the file for the rest of the process.
#[cfg(feature = "prometheus")]
fn serve(
    settings: Settings,
    started: std::sync::mpsc::SyncSender<std::result::Result<PrometheusHandle, Failed>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = started.send(Err(Failed::Runtime(e)));
            return;
        }
    };
    let built = (|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
            .map_err(|e| Failed::Buckets(e.to_string()))?;
        match settings.listen {
            Some(addr) => {
                // Binds here, so a taken port is an error now, not a log line later.
                let _entered = runtime.enter();
                let (recorder, served) = builder
                    .with_http_listener(addr)
                    .build()
                    .map_err(|e| Failed::Listen(e.to_string()))?;
                Ok((recorder, Some(served)))
            }
            None => Ok((builder.build_recorder(), None)),
        }
    })();
    let (recorder, served) = match built {
        Ok(b) => b,
        Err(failed) => {
            let _ = started.send(Err(failed));
            return;
        }
    };
    let handle = recorder.handle();
    if metrics::set_global_recorder(recorder).is_err() {
        let _ = started.send(Err(Failed::RecorderTaken));
        return;
    }
    let _ = started.send(Ok(handle.clone()));
    runtime.block_on(async move {
        if let Some(served) = served {
            tokio::spawn(async move {
                if let Err(e) = served.await {
                    tracing::error!("metrics: the HTTP listener stopped: {e:?}");
                }
            });
        }
        let mut warned = false;
        loop {
            tokio::time::sleep(settings.interval).await;
            handle.run_upkeep();
            if let Some(file) = &settings.file
                && let Err(e) = write_file(file, &handle.render())
                && !std::mem::replace(&mut warned, true)
            {
                tracing::warn!(file = %file.display(), error = %e, "metrics: cannot rewrite the file");
            }
        }
    });
}

/// Replaces `file` whole: a scraper never reads half a rewrite. The temporary file is
/// created new, so a link planted under its name is replaced, never followed. Anything
/// else in the file's place (a device, a FIFO, a socket, a dir) is left as it is: the
/// rewrite fails.
#[cfg(feature = "prometheus")]
fn write_file(file: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    if let Ok(meta) = std::fs::symlink_metadata(file)
        && !meta.is_file()
        && !meta.file_type().is_symlink()
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "it exists and is not a regular file, which the exporter would replace",
        ));
    }
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?
        .write_all(text.as_bytes())?;
    std::fs::rename(&tmp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(all(test, not(feature = "prometheus")))]
mod tests {
    /// A build without the exporter says so when a config asks for one, and is silent
    /// when none is asked for.
    #[test]
    fn a_build_without_the_exporter_refuses_its_keys() {
        let asked = crate::config()
            .set("metrics_listen", "127.0.0.1:9464")
            .load()
            .unwrap();
        let err = super::start_metrics(&asked).unwrap_err();
        assert!(
            err.to_string().contains("enable the `prometheus` feature"),
            "{err}"
        );
        let quiet = crate::config().load().unwrap();
        assert!(super::start_metrics(&quiet).unwrap().is_none());
    }
}

#[cfg(test)]
mod rank_tests {
    use std::path::Path;

    #[test]
    fn each_rank_gets_its_own_file_name() {
        let f = |p: &str, r| super::rank_file(Path::new(p), r);
        assert_eq!(
            f("/run/hicache.prom", 3),
            Path::new("/run/hicache.rank3.prom")
        );
        assert_eq!(f("/run/metrics", 0), Path::new("/run/metrics.rank0"));
        assert_eq!(f("m.tar.prom", 12), Path::new("m.tar.rank12.prom"));
    }
}
