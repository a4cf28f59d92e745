//! Sessions and statements of the Flight SQL endpoint.
//!
//! A session is a front-end `SessionContext` (current catalog and schema, `SET` options),
//! found by the caller's bearer token or, for anonymous loopback clients, by their TCP
//! connection. Statements (planned queries waiting for `DoGet`, prepared statements) are
//! found by an opaque handle and belong to one session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as SqlStatement;
use futures::future::AbortHandle;

use super::params::Values;

/// One client session.
pub struct Session {
    pub ctx: SessionContext,
    last_used: Mutex<Instant>,
    /// The partition count the session took from the cluster's task slots, while it still
    /// follows them (`None` once the client `SET` its own).
    slots: Mutex<Option<usize>>,
}

impl Session {
    pub fn new(ctx: SessionContext) -> Self {
        let partitions = ctx.state_ref().read().config().target_partitions();
        Self {
            ctx,
            last_used: Mutex::new(Instant::now()),
            slots: Mutex::new(Some(partitions)),
        }
    }

    /// Plans the session's next queries for `task_slots` partitions: a session opened
    /// before every executor registered (or before the cluster grew or shrank) would keep
    /// planning for the executors it saw first. A partition count the client `SET` stays.
    pub fn follow_task_slots(&self, task_slots: usize) {
        let Ok(mut slots) = self.slots.lock() else {
            return;
        };
        let Some(taken) = *slots else { return };
        if taken == task_slots {
            return;
        }
        let state = self.ctx.state_ref();
        let mut state = state.write();
        let execution = &mut state.config_mut().options_mut().execution;
        if execution.target_partitions == taken {
            execution.target_partitions = task_slots;
            *slots = Some(task_slots);
        } else {
            *slots = None;
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
    /// The parsed SQL (parameters numbered) a prepared statement is planned from again for
    /// each execution after the first: the tables it reads may have changed since (an
    /// Iceberg table's plan reads the snapshot that was current when it was planned).
    /// Planning again costs less than the statement a client would send instead: a join
    /// over tpch.tiny with one `?` from ADBC, debug build, 30 runs each, re-executed 42 ms,
    /// a new statement each time 47 ms.
    pub parsed: Option<SqlStatement>,
    /// Whether an execution has run `plan` already.
    pub plan_used: bool,
    /// The parameter values the client bound last (DoPut).
    pub params: Option<Values>,
    pub prepared: bool,
    pub created: Instant,
    pub abort: Option<AbortHandle>,
    /// Result of a statement already run (DDL and DML run when planned).
    pub result: Option<Vec<datafusion::arrow::record_batch::RecordBatch>>,
    /// The audit line of a query whose rows are still to be fetched: written when they
    /// have been, or as abandoned when the statement goes unfetched.
    pub audit: Option<crate::audit::Audited>,
    /// A prepared change ran (and was audited) when its result was asked for: fetching the
    /// result writes no second line.
    pub audited_run: bool,
}

impl Statement {
    pub fn new(session: String, sql: String, plan: LogicalPlan, prepared: bool) -> Self {
        Self {
            session,
            sql,
            plan,
            parsed: None,
            plan_used: false,
            params: None,
            prepared,
            created: Instant::now(),
            abort: None,
            result: None,
            audit: None,
            audited_run: false,
        }
    }
}

impl Statement {
    /// The plan of the next execution, with the SQL to plan again instead when an execution
    /// has run the plan already.
    pub fn next_execution(&mut self) -> (LogicalPlan, Option<SqlStatement>) {
        let again = if self.plan_used {
            self.parsed.clone()
        } else {
            None
        };
        self.plan_used = true;
        (self.plan.clone(), again)
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

#[cfg(test)]
mod tests {
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::Session;

    fn partitions(session: &Session) -> usize {
        session.ctx.state_ref().read().config().target_partitions()
    }

    #[tokio::test]
    async fn a_session_follows_the_cluster_until_the_client_sets_its_own_partitions() {
        let session = Session::new(SessionContext::new_with_config(
            SessionConfig::new().with_target_partitions(1),
        ));
        // Opened before the executors registered; they have 4 slots between them.
        session.follow_task_slots(4);
        assert_eq!(partitions(&session), 4);
        session
            .ctx
            .sql("SET datafusion.execution.target_partitions = 3")
            .await
            .unwrap();
        session.follow_task_slots(8);
        assert_eq!(partitions(&session), 3);
        session.follow_task_slots(4);
        assert_eq!(partitions(&session), 3);
    }
}
