//! The error type shared by Basin's crates.

use std::path::PathBuf;

/// Result with [`BasinError`].
pub type Result<T, E = BasinError> = std::result::Result<T, E>;

/// Errors raised by Basin outside DataFusion's own planning and execution.
///
/// At DataFusion trait boundaries these travel as `DataFusionError::External` and can be
/// downcast back with [`BasinError::find_in`].
#[derive(Debug, thiserror::Error)]
pub enum BasinError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The configuration file is malformed or has a bad, missing or unknown key.
    #[error("invalid configuration in {path}: {message}")]
    Config { path: PathBuf, message: String },
    /// A `${env:VAR}` reference names a variable that is not set.
    #[error("environment variable {var} is not set (referenced as ${{env:{var}}} by {key})")]
    MissingEnv { var: String, key: String },
    /// A user asked for something that does not exist or is not allowed.
    #[error("{0}")]
    Invalid(String),
    /// A server (an executor's) stopped on its own without being asked to: one of its ports
    /// taken by another process, or its scheduler gave it up. Starting it again may work.
    #[error("{0}")]
    Stopped(String),
    /// Errors from DataFusion.
    #[error(transparent)]
    DataFusion(#[from] datafusion::error::DataFusionError),
    /// I/O errors.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl BasinError {
    /// Wraps this error for a DataFusion trait boundary.
    pub fn into_datafusion(self) -> datafusion::error::DataFusionError {
        match self {
            BasinError::DataFusion(e) => e,
            other => datafusion::error::DataFusionError::External(Box::new(other)),
        }
    }

    /// Finds a `BasinError` inside a DataFusion error chain.
    pub fn find_in(err: &datafusion::error::DataFusionError) -> Option<&BasinError> {
        err.find_root().as_ref_external()
    }
}

trait AsRefExternal {
    fn as_ref_external(&self) -> Option<&BasinError>;
}

impl AsRefExternal for datafusion::error::DataFusionError {
    fn as_ref_external(&self) -> Option<&BasinError> {
        match self {
            datafusion::error::DataFusionError::External(e) => e.downcast_ref::<BasinError>(),
            _ => None,
        }
    }
}
