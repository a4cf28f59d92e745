//! Database sources queried in place: PostgreSQL, MySQL/MariaDB and SQL Server.
//!
//! ```text
//!   basin.toml [catalogs.pg] ─► RemoteSource (dialect, backend, limits; registry by name)
//!   RemoteCatalogProvider ─► schemas, tables, columns from the source's catalog (TTL cache)
//!   RemotePushdown (optimizer rule) ─► largest single-source subtrees → RemoteQueryTable
//!   RemoteScanExec ─► splits (ctid ranges / key ranges) run on executors, streamed as Arrow
//! ```
//!
//! What differs per source is behind two traits in [`backend`]: [`backend::SqlDialect`]
//! (quoting, literals, LIMIT, capabilities) and [`backend::Backend`] (driver, catalog queries,
//! splits, reads). One module per source implements them: [`postgres`], [`mysql`],
//! [`sqlserver`].

/// A sqlx connect-options builder `o` with the separate fields of a source's configuration
/// `c` (host, port, user, password, database) overriding its URL's parts.
macro_rules! sqlx_overrides {
    ($o:expr, $c:expr) => {{
        let mut o = $o;
        if let Some(h) = &$c.host {
            o = o.host(h);
        }
        if let Some(p) = $c.port {
            o = o.port(p);
        }
        if let Some(u) = &$c.user {
            o = o.username(u);
        }
        if let Some(p) = &$c.password {
            o = o.password(p.expose());
        }
        if let Some(d) = &$c.database {
            o = o.database(d);
        }
        o
    }};
}

pub mod backend;
pub mod catalog;
pub mod decode;
pub mod exec;
pub mod mysql;
pub mod oracle;
pub mod postgres;
pub mod pushdown;
pub mod source;
pub mod sql;
pub mod sqlserver;
pub mod types;

pub use backend::{Dialect, SourceError, SourceErrorKind, source_status, status_source_error};
pub use catalog::{RemoteCatalogProvider, RemoteTable};
pub use exec::{RemoteQuery, RemoteQueryTable, RemoteScanExec, RemoteScanSpec};
pub use pushdown::RemotePushdown;
pub use source::{RemoteSource, register_sources, source};
