//! Sessions and statements of the Flight SQL endpoint.
//!
//! A session is a front-end `SessionContext` (current catalog and schema, `SET` options),
//! found by the caller's bearer token or, for anonymous loopback clients, by their TCP
//! connection. Statements (planned queries waiting for `DoGet`, prepared statements) are
//! found by an opaque handle and belong to one session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::common::ParamValues;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use futures::future::AbortHandle;

/// One client session.
pub struct Session {
    pub ctx: SessionContext,
    last_used: Mutex<Instant>,
}

impl Session {
    pub fn new(ctx: SessionContext) -> Self {
        Self {
            ctx,
            last_used: Mutex::new(Instant::now()),
        }
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }

    fn idle(&self) -> Duration {
        self.last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }
}

/// A query planned by `GetFlightInfo`, waiting to be fetched, or a prepared statement.
pub struct Statement {
    pub session: String,
    pub sql: String,
    pub plan: LogicalPlan,
    pub params: Option<ParamValues>,
    pub prepared: bool,
    pub created: Instant,
    pub abort: Option<AbortHandle>,
    /// Result of a statement already run (DDL and DML run when planned).
    pub result: Option<Vec<datafusion::arrow::record_batch::RecordBatch>>,
}

impl Statement {
    pub fn new(session: String, sql: String, plan: LogicalPlan, prepared: bool) -> Self {
        Self {
            session,
            sql,
            plan,
            params: None,
            prepared,
            created: Instant::now(),
            abort: None,
            result: None,
        }
    }
}

/// Sessions and statements, shared by all calls.
#[derive(Default)]
pub struct Registry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    statements: Mutex<HashMap<String, Statement>>,
}

impl Registry {
    /// The session for `key`, created with `make` if it does not exist.
    pub fn session(
        &self,
        key: &str,
        make: impl FnOnce() -> datafusion::error::Result<SessionContext>,
    ) -> datafusion::error::Result<Arc<Session>> {
        let mut sessions = self
            .sessions
            .lock()
            .map_err(|_| datafusion::error::DataFusionError::Internal("session lock".into()))?;
        if let Some(s) = sessions.get(key) {
            s.touch();
            return Ok(s.clone());
        }
        let session = Arc::new(Session::new(make()?));
        sessions.insert(key.to_string(), session.clone());
        Ok(session)
    }

    /// Drops sessions idle for longer than `idle` and unfetched statements older than it.
    /// Prepared statements go with their session.
    pub fn expire(&self, idle: Duration) {
        let live: std::collections::HashSet<String> = match self.sessions.lock() {
            Ok(mut sessions) => {
                sessions.retain(|_, s| s.idle() < idle);
                sessions.keys().cloned().collect()
            }
            Err(_) => return,
        };
        if let Ok(mut statements) = self.statements.lock() {
            statements.retain(|_, s| {
                live.contains(&s.session) && (s.prepared || s.created.elapsed() < idle)
            });
        }
    }

    /// Stores a statement and returns its handle.
    pub fn put_statement(&self, statement: Statement) -> String {
        let handle = uuid::Uuid::new_v4().simple().to_string();
        if let Ok(mut s) = self.statements.lock() {
            s.insert(handle.clone(), statement);
        }
        handle
    }

    /// Runs `f` on the statement `handle` of `session`.
    pub fn with_statement<T>(
        &self,
        handle: &str,
        session: &str,
        f: impl FnOnce(&mut Statement) -> T,
    ) -> Option<T> {
        let mut statements = self.statements.lock().ok()?;
        let s = statements.get_mut(handle)?;
        if s.session != session {
            return None;
        }
        Some(f(s))
    }

    /// Removes a statement.
    pub fn remove_statement(&self, handle: &str, session: &str) -> Option<Statement> {
        let mut statements = self.statements.lock().ok()?;
        if statements.get(handle)?.session != session {
            return None;
        }
        statements.remove(handle)
    }

    /// Cancels the running fetch of a statement of `session`; true if one was running.
    pub fn cancel(&self, handle: &str, session: &str) -> bool {
        let Ok(mut statements) = self.statements.lock() else {
            return false;
        };
        match statements
            .get_mut(handle)
            .filter(|s| s.session == session)
            .and_then(|s| s.abort.take())
        {
            Some(abort) => {
                abort.abort();
                true
            }
            None => false,
        }
    }
}
