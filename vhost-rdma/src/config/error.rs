//! [`ConfigError`]: why a `--port`, `--host` or configuration file was
//! refused.

use std::path::PathBuf;

/// Why the daemon's configuration was refused: a `--port` or `--host`
/// flag, the TOML file, or the configuration as a whole.
///
/// The message of an error that wraps another (`--port SPEC: ...`,
/// `port NAME: ...`, `in FILE: ...`) includes it: `{}` shows the whole
/// chain on one line, and [`std::error::Error::source`] is left empty so
/// that `anyhow`'s `{:#}` does not print it twice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The TOML file does not parse, or one of its tables does not fit the
    /// model (its position is in the message).
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// The configuration file could not be read.
    #[error("reading {}: {err}", path.display())]
    Read { path: PathBuf, err: std::io::Error },
    /// An error in the configuration file `path`.
    #[error("in {}: {err}", path.display())]
    File {
        path: PathBuf,
        err: Box<ConfigError>,
    },
    /// An error in one `--port` or `--host` flag (`flag`: its name).
    #[error("--{flag} {spec:?}: {err}")]
    Flag {
        flag: &'static str,
        spec: String,
        err: Box<ConfigError>,
    },
    /// An error in the settings of port `port`.
    #[error("port {port}: {err}")]
    Port { port: String, err: Box<ConfigError> },
    /// An error in the settings of virtual host `host`.
    #[error("host {host}: {err}")]
    Host { host: String, err: Box<ConfigError> },
    /// The value of `key` is refused.
    #[error("{key}={value}: {err}")]
    Value {
        key: String,
        value: String,
        err: Box<ConfigError>,
    },
    /// A flag that is not `NAME=...[,key=value...]`.
    #[error("{0}")]
    Syntax(String),
    /// A key no port kind accepts.
    #[error("unknown option {key:?} ({accepted})")]
    UnknownKey { key: String, accepted: String },
    /// A key another port kind accepts, given to this one.
    #[error("{key} is a setting of {kinds} ports")]
    WrongKind { key: String, kinds: String },
    /// A value out of its range, settings that do not go together, or a
    /// configuration that is inconsistent as a whole.
    #[error("{0}")]
    Invalid(String),
    /// A `kind=vxlan` port's VXLAN settings.
    #[error(transparent)]
    Vxlan(#[from] crate::vxlan::ConfigError),
    /// The live checker's limits.
    #[error(transparent)]
    Checker(#[from] crate::checker::CheckerLimitError),
    /// What the serde model refused (a missing field, a type mismatch).
    #[error("{0}")]
    Serde(String),
}

impl ConfigError {
    /// `err` about port `name`.
    pub fn port(name: &str, err: ConfigError) -> Self {
        ConfigError::Port {
            port: name.to_string(),
            err: Box::new(err),
        }
    }

    /// `err` in the flag `--{flag} {spec}`.
    pub(crate) fn flag(flag: &'static str, spec: &str, err: ConfigError) -> Self {
        ConfigError::Flag {
            flag,
            spec: spec.to_string(),
            err: Box::new(err),
        }
    }

    /// `err` about `key=value`.
    pub(crate) fn value(key: &str, value: impl ToString, err: ConfigError) -> Self {
        ConfigError::Value {
            key: key.to_string(),
            value: value.to_string(),
            err: Box::new(err),
        }
    }
}

impl serde::de::Error for ConfigError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        ConfigError::Serde(msg.to_string())
    }
}

/// `bail!` for [`ConfigError::Invalid`].
macro_rules! invalid {
    ($($t:tt)*) => {
        return Err($crate::config::ConfigError::Invalid(format!($($t)*)))
    };
}
pub(crate) use invalid;
