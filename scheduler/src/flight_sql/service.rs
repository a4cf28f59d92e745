//! `BasinFlightSqlService`: Arrow Flight SQL on top of front-end sessions.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::GetTablesBuilder;
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionCancelQueryRequest, ActionCancelQueryResult, ActionClosePreparedStatementRequest,
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any, Command,
    CommandGetCatalogs, CommandGetCrossReference, CommandGetDbSchemas, CommandGetExportedKeys,
    CommandGetImportedKeys, CommandGetPrimaryKeys, CommandGetSqlInfo, CommandGetTableTypes,
    CommandGetTables, CommandGetXdbcTypeInfo, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementQuery, CommandStatementUpdate,
    DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus, FlightData,
    FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage,
    SchemaAsIpc, Ticket,
};
use std::sync::atomic::Ordering as AtomicOrdering;

use crate::audit::Audited;
use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{LogicalPlan, TableType};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream, execute_stream};
use datafusion::sql::parser::Statement as SqlStatement;
use futures::stream::{AbortHandle, AbortRegistration, Abortable, BoxStream};
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use super::SessionFactory;
use super::auth::{LoginGuard, Tokens, Users, parse_basic};
use super::jwt::{JwtValidator, Verified};
use super::metadata::{SQL_INFO, XDBC_TYPES, annotate_schema};
use super::params::{Parameters, Values, number_placeholders};
use super::state::{Registry, Session, Statement};
use crate::limits::Deadline;
use crate::streamed;

type DoGetStream = Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send>>;

/// The Flight SQL service of a Basin scheduler.
pub struct BasinFlightSqlService {
    sessions: Arc<SessionFactory>,
    registry: Arc<Registry>,
    users: Option<Arc<Users>>,
    tokens: Arc<Tokens>,
    token_ttl: Duration,
    password_checks: tokio::sync::Semaphore,
    /// Failed logins per client address.
    logins: LoginGuard,
    /// Whether the endpoint serves TLS.
    tls: bool,
    /// `[flight_sql] allow_plaintext_passwords`.
    plaintext_passwords: bool,
    /// `[flight_sql.jwt]`: bearer tokens of an identity provider.
    jwt: Option<Arc<JwtValidator>>,
    /// JWTs verified already (their signature is checked once).
    verified: Verified,
}

/// Who is calling.
struct Caller {
    key: String,
    user: String,
    /// The groups a JWT names (users-file groups otherwise).
    groups: Option<Vec<String>>,
}

impl BasinFlightSqlService {
    pub(crate) fn new(
        sessions: Arc<SessionFactory>,
        registry: Arc<Registry>,
        users: Option<Arc<Users>>,
        token_ttl: Duration,
    ) -> Self {
        Self {
            sessions,
            registry,
            users,
            tokens: Arc::new(Tokens::default()),
            token_ttl,
            password_checks: tokio::sync::Semaphore::new(2),
            logins: LoginGuard::default(),
            tls: false,
            plaintext_passwords: false,
            jwt: None,
            verified: Verified::default(),
        }
    }

    /// Accepts JWT bearer tokens checked by `jwt`.
    pub(crate) fn with_jwt(mut self, jwt: Option<Arc<JwtValidator>>) -> Self {
        self.jwt = jwt;
        self
    }

    /// Whether the endpoint serves TLS, and whether password logins may come over plain
    /// TCP from other machines anyway.
    pub(crate) fn with_transport(mut self, tls: bool, plaintext_passwords: bool) -> Self {
        self.tls = tls;
        self.plaintext_passwords = plaintext_passwords;
        self
    }

    /// Authenticates the caller and returns its session key.
    fn caller<T>(&self, request: &Request<T>) -> Result<String, Status> {
        self.caller_and_user(request).map(|c| c.key)
    }

    /// Authenticates the caller: its session key, its user (`anonymous` for a loopback
    /// client of a server without users) and, for a JWT, the groups it names.
    fn caller_and_user<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let bearer = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        if let Some(token) = bearer {
            if let Some(user) = self.tokens.user(token, self.token_ttl) {
                return Ok(Caller {
                    key: format!("token:{token}"),
                    user,
                    groups: None,
                });
            }
            if let Some(jwt) = &self.jwt
                && token.matches('.').count() == 2
            {
                let identity = match self.verified.get(token) {
                    Some(identity) => identity,
                    None => {
                        let identity = jwt.validate(token).map_err(|refusal| {
                            if refusal.unknown_key && jwt.refetchable() {
                                let jwt = jwt.clone();
                                tokio::spawn(async move { jwt.refetch().await });
                            }
                            Status::unauthenticated(format!(
                                "the bearer token was refused: {}",
                                refusal.why
                            ))
                        })?;
                        self.verified.put(token, identity.clone());
                        identity
                    }
                };
                use sha2::Digest;
                let key = basin_core::cluster::hex(&sha2::Sha256::digest(token.as_bytes()));
                return Ok(Caller {
                    key: format!("jwt:{key}"),
                    user: identity.user,
                    groups: Some(identity.groups),
                });
            }
            return Err(Status::unauthenticated(
                "the bearer token is unknown or expired: authenticate again",
            ));
        }
        if self.users.is_some() {
            return Err(Status::unauthenticated(
                "authentication required: connect with a user name and password",
            ));
        }
        match request.remote_addr() {
            Some(addr) if addr.ip().is_loopback() => Ok(Caller {
                key: format!("conn:{addr}"),
                user: "anonymous".to_string(),
                groups: None,
            }),
            Some(addr) => Err(Status::unauthenticated(format!(
                "anonymous clients may only connect from loopback, not {}; configure \
                 [flight_sql] users_file to allow remote clients",
                addr.ip()
            ))),
            None => Err(Status::unauthenticated(
                "cannot tell where the client connects from: anonymous access refused",
            )),
        }
    }

    async fn session<T>(&self, request: &Request<T>) -> Result<(String, Arc<Session>), Status> {
        let Caller { key, user, groups } = self.caller_and_user(request)?;
        let slots = self.sessions.task_slots().await;
        let factory = self.sessions.clone();
        let groups = groups.unwrap_or_else(|| {
            self.users
                .as_ref()
                .map(|u| u.groups(&user))
                .unwrap_or_default()
        });
        let subject = crate::access::Subject { user, groups };
        let session = self
            .registry
            .session(&key, || factory.connect(slots, subject))
            .map_err(to_status)?;
        if self.sessions.follows_task_slots() {
            session.follow_task_slots(slots);
        }
        Ok((key, session))
    }

    /// An audit line for `sql` sent by the caller of `request`, when the audit log is on.
    fn audit<T>(&self, request: &Request<T>, sql: &str) -> Option<Audited> {
        let log = self.sessions.audit_log()?;
        let user = self
            .caller_and_user(request)
            .map_or_else(|_| "unknown".to_string(), |c| c.user);
        let client = request
            .remote_addr()
            .map_or_else(|| "unknown".to_string(), |a| a.to_string());
        Some(Audited::new(log, &user, &client, sql))
    }

    /// Plans SQL text, its `?` parameters numbered; with the parsed statement it was planned
    /// from (`None` for `USE`, which runs here).
    async fn plan(
        &self,
        session: &Session,
        sql: &str,
    ) -> Result<(LogicalPlan, Option<SqlStatement>), Status> {
        if let Some(done) = crate::frontend::try_use_statement(&session.ctx, sql) {
            done.map_err(to_status)?;
            let nothing = LogicalPlan::EmptyRelation(datafusion::logical_expr::EmptyRelation {
                produce_one_row: false,
                schema: Arc::new(datafusion::common::DFSchema::empty()),
            });
            return Ok((nothing, None));
        }
        let mut statement = crate::sql::parse_one(sql).map_err(to_status)?;
        number_placeholders(&mut statement).map_err(to_status)?;
        let plan = crate::sql::plan(&session.ctx, statement.clone())
            .await
            .map_err(to_status)?;
        Ok((plan, Some(statement)))
    }

    /// The plan an execution of a prepared statement runs: `plan`, or `again` planned anew.
    async fn replan(
        &self,
        session: &Session,
        plan: LogicalPlan,
        again: Option<SqlStatement>,
    ) -> Result<LogicalPlan, Status> {
        match again {
            Some(statement) => crate::sql::plan(&session.ctx, statement)
                .await
                .map_err(to_status),
            None => Ok(plan),
        }
    }

    /// Runs DDL and DML right away (clients may never fetch their result); queries wait
    /// for `DoGet`.
    async fn run_if_not_query(
        &self,
        session: &Session,
        plan: &LogicalPlan,
        params: Option<Values>,
    ) -> Result<Option<Vec<RecordBatch>>, Status> {
        if !crate::sql::is_command(plan) {
            return Ok(None);
        }
        Ok(Some(self.collect(session, plan.clone(), params).await?))
    }

    /// Runs a statement to its end within the session's time limit; one that runs out of
    /// time has its Ballista job cancelled (an Iceberg write then commits nothing).
    async fn collect(
        &self,
        session: &Session,
        plan: LogicalPlan,
        params: Option<Values>,
    ) -> Result<Vec<RecordBatch>, Status> {
        let name = format!("statement-{}", uuid::Uuid::new_v4().simple());
        name_next_jobs(session, &name);
        let run = async {
            let stream = execute(session, plan, params).await?;
            stream.try_collect().await.map_err(to_status)
        };
        let done = match self.sessions.time_limit(&session.ctx) {
            None => run.await,
            Some(limit) => match tokio::time::timeout(limit.limit, run).await {
                Ok(done) => done,
                Err(_) => {
                    tracing::info!(job = %name, "a statement ran out of time: cancelling it");
                    self.sessions.cancel_jobs_named(&name).await;
                    Err(Status::deadline_exceeded(limit.message()))
                }
            },
        };
        // Its jobs' shuffle files are read by nobody any more (the name is this run's own).
        let sessions = self.sessions.clone();
        tokio::spawn(async move { sessions.remove_data_of_jobs_named(&name, 0).await });
        done
    }

    fn flight_info(
        schema: &Schema,
        ticket: Any,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo, Status> {
        Ok(FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| Status::internal(format!("cannot encode the result schema: {e}")))?
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket.encode_to_vec())))
            .with_descriptor(descriptor)
            .with_total_records(-1)
            .with_total_bytes(-1)
            .with_ordered(true))
    }

    /// Runs a stored statement and streams its result; its audit line (the one made when a
    /// query was sent, or a new one for each execution of a prepared statement) is written
    /// when the result ends.
    async fn run_statement<T>(
        &self,
        request: &Request<T>,
        key: &str,
        handle: &str,
    ) -> Result<Response<DoGetStream>, Status> {
        let stored = self.registry.with_statement(handle, key, |s| {
            (
                s.audit.take(),
                s.prepared && !std::mem::take(&mut s.audited_run),
                s.sql.clone(),
            )
        });
        let mut audit = match stored {
            Some((Some(audit), _, _)) => Some(audit),
            Some((None, true, sql)) => self.audit(request, &sql),
            _ => None,
        };
        let run = self.run_stored(key, handle, &mut audit).await;
        audited(&mut audit, run)
    }

    async fn run_stored(
        &self,
        key: &str,
        handle: &str,
        audit: &mut Option<Audited>,
    ) -> Result<Response<DoGetStream>, Status> {
        let (plan, again, params, prepared, done) = self
            .registry
            .with_statement(handle, key, |s| {
                // The SQL text is not logged: it may hold credentials (OPTIONS of COPY …).
                tracing::debug!(statement = %handle, chars = s.sql.len(), "running statement");
                let done = if s.prepared {
                    s.result.clone()
                } else {
                    s.result.take()
                };
                let (plan, again) = match &done {
                    None if s.prepared => s.next_execution(),
                    _ => (s.plan.clone(), None),
                };
                (plan, again, s.params.clone(), s.prepared, done)
            })
            .ok_or_else(|| Status::not_found("unknown statement handle (expired or closed?)"))?;
        if let Some(batches) = done {
            if !prepared {
                self.registry.remove_statement(handle, key);
            }
            if let Some(mut audit) = audit.take() {
                audit.objects(&plan);
                audit.rows(affected_rows(&batches).max(0) as u64);
                audit.ended(Ok(()));
            }
            let schema = annotate_schema(plan.schema());
            let stream = FlightDataEncoderBuilder::new()
                .with_schema(schema)
                .build(futures::stream::iter(batches.into_iter().map(Ok)))
                .map_err(Status::from);
            return Ok(Response::new(Box::pin(stream)));
        }
        let session = self.registry.session(key, || {
            Err(DataFusionError::Execution("the session has expired".into()))
        });
        let session = session.map_err(to_status)?;
        let plan = self.replan(&session, plan, again).await?;
        if let Some(audit) = audit.as_mut() {
            audit.objects(&plan);
        }
        // Name the Ballista job after the statement so a cancel can find and stop it, and
        // the end of its result can remove its shuffle files.
        name_next_jobs(&session, handle);
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let limit = self
            .sessions
            .time_limit(&session.ctx)
            .map(|l| (l, l.deadline()));
        let started = match limit {
            Some((limit, deadline)) => {
                match tokio::time::timeout_at(deadline, start(&session, plan, params)).await {
                    Ok(started) => started?,
                    Err(_) => {
                        self.sessions.cancel_jobs_named(handle).await;
                        if !prepared {
                            self.registry.remove_statement(handle, key);
                        }
                        return Err(Status::deadline_exceeded(limit.message()));
                    }
                }
            }
            None => start(&session, plan, params).await?,
        };
        let (abort, registration) = AbortHandle::new_pair();
        self.registry
            .with_statement(handle, key, |s| s.abort = Some(abort));
        let cleanup = Cleanup {
            registry: self.registry.clone(),
            handle: handle.to_string(),
            session: key.to_string(),
            remove: !prepared,
            jobs: Some((self.sessions.clone(), started_ms)),
        };
        let abandon = Some((self.sessions.clone(), handle.to_string()));
        let mut audit = audit.take();
        let rows = audit.as_mut().map(Audited::row_counter);
        let flight: DoGetStream = match started {
            Started::Batches(stream) => {
                let schema = stream.schema();
                let batches = Cancellable::new(stream, registration, abandon, cleanup)
                    .audited(audit)
                    .map_err(|e| FlightError::Tonic(Box::new(to_status(e))))
                    .map_ok(move |batch| {
                        if let Some(rows) = &rows {
                            rows.fetch_add(batch.num_rows() as u64, AtomicOrdering::Relaxed);
                        }
                        futures::stream::iter(split_for_flight(batch).into_iter().map(Ok))
                    })
                    .try_flatten();
                Box::pin(
                    FlightDataEncoderBuilder::new()
                        .with_schema(schema)
                        // Split above, by the rows' true size.
                        .with_max_flight_data_size(usize::MAX)
                        .build(batches)
                        .map_err(Status::from),
                )
            }
            Started::Relayed(messages) => Box::pin(
                Cancellable::new(messages, registration, abandon, cleanup)
                    .audited(audit)
                    .inspect_ok(move |message| {
                        if let Some(rows) = &rows {
                            rows.fetch_add(rows_of(message), AtomicOrdering::Relaxed);
                        }
                    })
                    .map_err(to_status),
            ),
        };
        let flight: DoGetStream = match limit {
            Some((limit, deadline)) => Box::pin(Deadline::new(
                flight,
                deadline,
                Status::deadline_exceeded(limit.message()),
            )),
            None => flight,
        };
        Ok(Response::new(flight))
    }

    async fn update_count(
        &self,
        session: &Session,
        plan: LogicalPlan,
        params: Option<Values>,
    ) -> Result<i64, Status> {
        let batches = self.collect(session, plan, params).await?;
        Ok(affected_rows(&batches))
    }

    /// `GetFlightInfo` of a metadata command: its schema and a ticket that is the command.
    async fn metadata_info(
        &self,
        command: Command,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let ticket = command.clone().into_any();
        let schema = self.schema_of(command, &request).await?;
        Ok(Response::new(Self::flight_info(
            &schema,
            ticket,
            request.into_inner(),
        )?))
    }

    fn batch_response(batch: RecordBatch) -> Response<DoGetStream> {
        let schema = batch.schema();
        let stream = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::once(async move { Ok(batch) }))
            .map_err(Status::from);
        Response::new(Box::pin(stream))
    }

    async fn handle_cancel(&self, key: &str, info: &FlightInfo) -> bool {
        let mut cancelled = false;
        for endpoint in &info.endpoint {
            let Some(ticket) = &endpoint.ticket else {
                continue;
            };
            let Ok(any) = Any::decode(ticket.ticket.as_ref()) else {
                continue;
            };
            let handle = if let Ok(Some(t)) = any.unpack::<TicketStatementQuery>() {
                String::from_utf8_lossy(&t.statement_handle).to_string()
            } else if let Ok(Some(p)) = any.unpack::<CommandPreparedStatementQuery>() {
                String::from_utf8_lossy(&p.prepared_statement_handle).to_string()
            } else {
                continue;
            };
            if self.registry.cancel(&handle, key) {
                cancelled = true;
                self.sessions.cancel_jobs_named(&handle).await;
            }
        }
        cancelled
    }
}

impl BasinFlightSqlService {
    /// The result schema of a Flight SQL command (for `GetSchema`).
    pub(crate) async fn schema_of(
        &self,
        command: arrow_flight::sql::Command,
        request: &Request<FlightDescriptor>,
    ) -> Result<SchemaRef, Status> {
        use arrow_flight::sql::Command as C;
        match command {
            C::CommandStatementQuery(q) => {
                let (_, session) = self.session(request).await?;
                let (plan, _) = self.plan(&session, &q.query).await?;
                Ok(annotate_schema(plan.schema()))
            }
            C::CommandPreparedStatementQuery(p) => {
                let key = self.caller(request)?;
                let handle = bad_handle(&p.prepared_statement_handle)?;
                self.registry
                    .with_statement(&handle, &key, |s| annotate_schema(s.plan.schema()))
                    .ok_or_else(|| Status::not_found("unknown prepared statement (closed?)"))
            }
            other => {
                self.caller(request)?;
                match other {
                    C::CommandGetCatalogs(q) => Ok(q.into_builder().schema()),
                    C::CommandGetDbSchemas(q) => Ok(q.into_builder().schema()),
                    C::CommandGetTables(q) => Ok(q.into_builder().schema()),
                    C::CommandGetTableTypes(q) => Ok(q.into_builder().schema()),
                    C::CommandGetSqlInfo(q) => Ok(q.into_builder(&SQL_INFO).schema()),
                    C::CommandGetXdbcTypeInfo(q) => Ok(q.into_builder(&XDBC_TYPES).schema()),
                    C::CommandGetPrimaryKeys(_) => Ok(keys_schema(false)),
                    C::CommandGetExportedKeys(_)
                    | C::CommandGetImportedKeys(_)
                    | C::CommandGetCrossReference(_) => Ok(keys_schema(true)),
                    _ => Err(Status::invalid_argument(
                        "GetSchema supports Flight SQL query and metadata commands",
                    )),
                }
            }
        }
    }
}

/// Removes a one-shot statement (or forgets a prepared statement's run) when its result
/// stream ends or is dropped, and the shuffle files of the Ballista jobs it ran (named after
/// the statement, ended since the stream started): nobody reads them any more.
struct Cleanup {
    registry: Arc<Registry>,
    handle: String,
    session: String,
    remove: bool,
    /// Where to remove the jobs' files, and when the statement started (ms since the epoch).
    jobs: Option<(Arc<SessionFactory>, u64)>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some((sessions, since)) = self.jobs.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let name = self.handle.clone();
            runtime.spawn(async move { sessions.remove_data_of_jobs_named(&name, since).await });
        }
        if self.remove {
            self.registry.remove_statement(&self.handle, &self.session);
        } else {
            self.registry
                .with_statement(&self.handle, &self.session, |s| s.abort = None);
        }
    }
}

/// A result stream that ends with an error (not silently) when cancelled, and that cancels
/// its Ballista job when the client goes away before the end (a closed connection, a
/// client-side cancel, a reader dropped early): the cluster and the sources it reads stop
/// working for nobody.
struct Cancellable<S> {
    inner: Abortable<S>,
    done: bool,
    /// Written when the stream ends (as abandoned if it is dropped before).
    audit: Option<Audited>,
    /// The job to cancel if the stream is dropped before it ended (all batches, an error
    /// or a cancel); `None` once it ended.
    abandon: Option<(Arc<SessionFactory>, String)>,
    _cleanup: Cleanup,
}

impl<S> Cancellable<S> {
    fn new(
        inner: S,
        registration: AbortRegistration,
        abandon: Option<(Arc<SessionFactory>, String)>,
        cleanup: Cleanup,
    ) -> Self {
        Self {
            inner: Abortable::new(inner, registration),
            done: false,
            audit: None,
            abandon,
            _cleanup: cleanup,
        }
    }

    fn audited(mut self, audit: Option<Audited>) -> Self {
        self.audit = audit;
        self
    }

    fn end(&mut self, outcome: std::result::Result<(), String>) {
        if let Some(mut audit) = self.audit.take() {
            audit.ended(outcome);
        }
    }
}

impl<S> Drop for Cancellable<S> {
    fn drop(&mut self) {
        let Some((sessions, handle)) = self.abandon.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            tracing::info!(statement = %handle, "result stream dropped before its end: cancelling the job");
            runtime.spawn(async move { sessions.cancel_jobs_named(&handle).await });
        }
    }
}

impl<S, T> Stream for Cancellable<S>
where
    S: Stream<Item = datafusion::error::Result<T>> + Unpin,
{
    type Item = datafusion::error::Result<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(None) if self.inner.is_aborted() => {
                tracing::debug!("result stream cancelled");
                self.done = true;
                self.abandon = None;
                self.end(Err("the query was cancelled".to_string()));
                Poll::Ready(Some(Err(DataFusionError::Execution(
                    "the query was cancelled".to_string(),
                ))))
            }
            Poll::Ready(None) => {
                self.abandon = None;
                self.end(Ok(()));
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                self.abandon = None;
                self.end(Err(e.message().into_owned()));
                Poll::Ready(Some(Err(e)))
            }
            other => other,
        }
    }
}

/// Sets the Ballista job name of the session's next queries.
fn name_next_jobs(session: &Session, name: &str) {
    let state = session.ctx.state_ref();
    let mut state = state.write();
    if let Err(e) = state
        .config_mut()
        .options_mut()
        .set(ballista_core::config::BALLISTA_JOB_NAME, name)
    {
        tracing::debug!(error = %e, "cannot name the Ballista job");
    }
}

/// Row data per Flight message (clients' default gRPC message limit is 4 MiB).
const FLIGHT_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

/// Splits a batch into pieces of about [`FLIGHT_MESSAGE_BYTES`] of row data. arrow-flight's
/// encoder splits by `get_buffer_memory_size`, which counts each buffer's whole allocation:
/// when a batch decoded from an executor's message keeps sharing that message's allocation
/// (aligned buffers are not copied by the IPC reader), every column counts the whole message
/// and the batch would go out as many small messages, each costing the client.
fn split_for_flight(batch: RecordBatch) -> Vec<RecordBatch> {
    let bytes: usize = batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_buffer_memory_size())
        })
        .sum();
    let rows = batch.num_rows();
    let pieces = bytes.div_ceil(FLIGHT_MESSAGE_BYTES).max(1);
    if pieces == 1 || rows <= 1 {
        return vec![batch];
    }
    let per = rows.div_ceil(pieces);
    (0..rows)
        .step_by(per)
        .map(|at| batch.slice(at, per.min(rows - at)))
        .collect()
}

/// How a query's result leaves the scheduler.
enum Started {
    /// Batches computed here (or decoded here from the executors), encoded for the client.
    Batches(SendableRecordBatchStream),
    /// The executors' Flight messages, passed on unchanged ([`streamed::relay`]): a result
    /// the front end only merges is not decoded and encoded again on its way through.
    Relayed(BoxStream<'static, datafusion::error::Result<FlightData>>),
}

/// Plans and starts a query.
async fn start(
    session: &Session,
    plan: LogicalPlan,
    params: Option<Values>,
) -> Result<Started, Status> {
    let (schema, context, physical) = plan_physical(session, plan, params).await?;
    if let Some(messages) = streamed::relay(&physical, schema.clone(), context.clone()) {
        return Ok(Started::Relayed(messages));
    }
    let stream = execute_stream(physical, context).map_err(to_status)?;
    Ok(Started::Batches(with_schema(schema, stream)))
}

/// Runs a statement for its batches (DML, DDL).
async fn execute(
    session: &Session,
    plan: LogicalPlan,
    params: Option<Values>,
) -> Result<SendableRecordBatchStream, Status> {
    let (schema, context, physical) = plan_physical(session, plan, params).await?;
    let stream = execute_stream(physical, context).map_err(to_status)?;
    Ok(with_schema(schema, stream))
}

/// The result's schema (annotated for Flight SQL), the task context and the physical plan
/// of `plan` with the parameter values `params`.
async fn plan_physical(
    session: &Session,
    plan: LogicalPlan,
    params: Option<Values>,
) -> Result<(SchemaRef, Arc<TaskContext>, Arc<dyn ExecutionPlan>), Status> {
    let plan = bind(plan, params)?;
    let df = session
        .ctx
        .execute_logical_plan(plan)
        .await
        .map_err(to_status)?;
    let schema = annotate_schema(df.schema());
    let context = Arc::new(df.task_ctx());
    let physical = df.create_physical_plan().await.map_err(to_status)?;
    Ok((schema, context, physical))
}

/// `stream` with `schema` (the plan's, annotated for Flight SQL) on its batches.
fn with_schema(schema: SchemaRef, stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
    Box::pin(
        datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
            schema.clone(),
            stream.map(move |b| {
                b.and_then(|b| {
                    // Batches may declare nullable fields the plan's schema says are not
                    // (EXPLAIN): keep the plan's schema when the data allows it.
                    b.clone()
                        .with_schema(schema.clone())
                        .or_else(|_| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
                        .map_err(Into::into)
                })
            }),
        ),
    )
}

/// Rows affected by DML (DataFusion returns a `count` column), 0 for DDL.
fn affected_rows(batches: &[RecordBatch]) -> i64 {
    batches
        .iter()
        .filter(|b| b.num_columns() == 1 && b.schema().field(0).name() == "count")
        .filter_map(|b| b.column(0).as_any().downcast_ref::<UInt64Array>().cloned())
        .map(|a| a.iter().flatten().sum::<u64>() as i64)
        .sum()
}

/// Maps an engine error to a gRPC status: user errors are `InvalidArgument` or `NotFound`
/// with the engine's message, broken invariants `Internal`, a database source that cannot be
/// reached `Unavailable` and its time limit `DeadlineExceeded` (by the error's kind).
pub fn to_status(err: DataFusionError) -> Status {
    use basin_connectors::remote::{SourceError, SourceErrorKind};
    let message = err.to_string();
    match err.find_root() {
        DataFusionError::Internal(_) => Status::internal(message),
        // A database source's failure, by kind (known where the front end met it: catalog
        // lookups, split planning, pushed-query checks).
        DataFusionError::External(e) if e.downcast_ref::<SourceError>().is_some() => {
            match e.downcast_ref::<SourceError>().map(|e| e.kind) {
                Some(SourceErrorKind::Unavailable) => Status::unavailable(message),
                Some(SourceErrorKind::Timeout) => Status::deadline_exceeded(message),
                _ => Status::invalid_argument(message),
            }
        }
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(message),
        _ if message.contains("not found") || message.contains("doesn't exist") => {
            Status::not_found(message)
        }
        DataFusionError::Execution(m) if m.contains("cancelled") => Status::cancelled(message),
        _ => Status::invalid_argument(message),
    }
}

fn schema_ipc(schema: &Schema) -> Result<Vec<u8>, Status> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|e: datafusion::arrow::error::ArrowError| Status::internal(e.to_string()))?;
    Ok(bytes.to_vec())
}

/// `plan` with the values `params` in place of its parameters; fails unless there is one
/// value per parameter.
fn bind(plan: LogicalPlan, params: Option<Values>) -> Result<LogicalPlan, Status> {
    Parameters::of(&plan)
        .and_then(|parameters| parameters.bind(plan, params.unwrap_or_default()))
        .map_err(to_status)
}

fn keys_schema(cross: bool) -> SchemaRef {
    let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
    if cross {
        Arc::new(Schema::new(vec![
            s("pk_catalog_name", true),
            s("pk_db_schema_name", true),
            s("pk_table_name", false),
            s("pk_column_name", false),
            s("fk_catalog_name", true),
            s("fk_db_schema_name", true),
            s("fk_table_name", false),
            s("fk_column_name", false),
            Field::new("key_sequence", DataType::Int32, false),
            s("fk_key_name", true),
            s("pk_key_name", true),
            Field::new("update_rule", DataType::UInt8, false),
            Field::new("delete_rule", DataType::UInt8, false),
        ]))
    } else {
        Arc::new(Schema::new(vec![
            s("catalog_name", true),
            s("db_schema_name", true),
            s("table_name", false),
            s("column_name", false),
            s("key_name", true),
            Field::new("key_sequence", DataType::Int32, false),
        ]))
    }
}

fn table_type_name(t: TableType) -> &'static str {
    match t {
        TableType::Base => "TABLE",
        TableType::View => "VIEW",
        TableType::Temporary => "LOCAL TEMPORARY",
    }
}

fn bad_handle(bytes: &[u8]) -> Result<String, Status> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| Status::invalid_argument("malformed statement handle"))
}

#[tonic::async_trait]
impl FlightSqlService for BasinFlightSqlService {
    type FlightService = BasinFlightSqlService;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<
        Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>,
        Status,
    > {
        let basic = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_basic);
        let user = match (&self.users, basic) {
            (Some(users), Some((user, password))) => {
                let client = request.remote_addr().map(|a| a.ip());
                if let Some(ip) = client {
                    if !self.tls && !self.plaintext_passwords && !ip.is_loopback() {
                        return Err(Status::unauthenticated(format!(
                            "password logins over plain TCP are refused from {ip}: the server \
                             needs TLS ([flight_sql] tls_cert and tls_key), or an administrator \
                             sets [flight_sql] allow_plaintext_passwords = true"
                        )));
                    }
                    if let Err(wait) = self.logins.attempt(ip) {
                        return Err(Status::unavailable(format!(
                            "too many failed logins from {ip}: try again in {} s",
                            wait.as_secs().max(1)
                        )));
                    }
                }
                // bcrypt is deliberately slow: keep it off the async workers, and let only a
                // few checks run at once so a flood of logins cannot take every core.
                let _permit = self
                    .password_checks
                    .acquire()
                    .await
                    .map_err(|_| Status::unavailable("the server is shutting down"))?;
                let users = users.clone();
                let u = user.clone();
                let ok = tokio::task::spawn_blocking(move || users.verify(&u, &password))
                    .await
                    .unwrap_or(false);
                if !ok {
                    return Err(Status::unauthenticated("wrong user name or password"));
                }
                if let Some(ip) = client {
                    self.logins.succeeded(ip);
                }
                user
            }
            (Some(_), None) => {
                return Err(Status::unauthenticated(
                    "authentication required: send a user name and password (HTTP Basic)",
                ));
            }
            (None, _) => {
                self.caller(&request)?;
                "anonymous".to_string()
            }
        };
        let token = self.tokens.issue(&user);
        let response = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().into(),
        };
        let stream: Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>> =
            Box::pin(futures::stream::once(async move { Ok(response) }));
        let mut resp = Response::new(stream);
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::internal("cannot encode the token"))?;
        resp.metadata_mut().insert("authorization", value);
        Ok(resp)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let (key, session) = self.session(&request).await?;
        let mut audit = self.audit(&request, &query.query);
        let planned = async {
            let (plan, _) = self.plan(&session, &query.query).await?;
            // A statement with parameters needs values: prepare it and bind them.
            let plan = bind(plan, None)?;
            if let Some(audit) = &mut audit {
                audit.objects(&plan);
            }
            let result = self.run_if_not_query(&session, &plan, None).await?;
            Ok::<_, Status>((plan, result))
        }
        .await;
        let (plan, result) = audited(&mut audit, planned)?;
        // A change has run: its line is written now; a query's when its rows are read.
        let audit = match (&result, audit) {
            (Some(batches), Some(mut audit)) => {
                audit.rows(affected_rows(batches).max(0) as u64);
                audit.ended(Ok(()));
                None
            }
            (_, audit) => audit,
        };
        let schema = annotate_schema(plan.schema());
        let mut statement = Statement::new(key, query.query, plan, false);
        statement.result = result;
        statement.audit = audit;
        let handle = self.registry.put_statement(statement);
        let ticket = TicketStatementQuery {
            statement_handle: handle.into_bytes().into(),
        };
        let info = Self::flight_info(&schema, ticket.as_any(), request.into_inner())?;
        Ok(Response::new(info))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let (key, session) = self.session(&request).await?;
        let handle = bad_handle(&cmd.prepared_statement_handle)?;
        let (plan, params) = self
            .registry
            .with_statement(&handle, &key, |s| (s.plan.clone(), s.params.clone()))
            .ok_or_else(|| Status::not_found("unknown prepared statement (closed?)"))?;
        // The result's types with the values bound (`SELECT ?` is what its value is); a
        // wrong number of values fails here, before anything runs.
        let schema = annotate_schema(bind(plan.clone(), params.clone())?.schema());
        if crate::sql::is_command(&plan) {
            // A change runs now (its client may never fetch the count): audited now.
            let sql = self
                .registry
                .with_statement(&handle, &key, |s| s.sql.clone())
                .unwrap_or_default();
            let mut audit = self.audit(&request, &sql);
            let done = async {
                let (plan, again) = self
                    .registry
                    .with_statement(&handle, &key, Statement::next_execution)
                    .ok_or_else(|| Status::not_found("unknown prepared statement (closed?)"))?;
                let plan = self.replan(&session, plan, again).await?;
                if let Some(audit) = &mut audit {
                    audit.objects(&plan);
                }
                self.collect(&session, plan, params).await
            }
            .await;
            if let (Ok(batches), Some(audit)) = (&done, &mut audit) {
                audit.rows(affected_rows(batches).max(0) as u64);
            }
            let result = audited(&mut audit, done)?;
            self.registry.with_statement(&handle, &key, |s| {
                s.result = Some(result);
                // Its line is written; fetching the count writes no second one.
                s.audited_run = true;
            });
        }
        let info = Self::flight_info(&schema, cmd.as_any(), request.into_inner())?;
        Ok(Response::new(info))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetCatalogs(query), request)
            .await
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetDbSchemas(query), request)
            .await
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetTables(query), request)
            .await
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetTableTypes(query), request)
            .await
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetSqlInfo(query), request)
            .await
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetPrimaryKeys(query), request)
            .await
    }

    async fn get_flight_info_exported_keys(
        &self,
        query: CommandGetExportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetExportedKeys(query), request)
            .await
    }

    async fn get_flight_info_imported_keys(
        &self,
        query: CommandGetImportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetImportedKeys(query), request)
            .await
    }

    async fn get_flight_info_cross_reference(
        &self,
        query: CommandGetCrossReference,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetCrossReference(query), request)
            .await
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(Command::CommandGetXdbcTypeInfo(query), request)
            .await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let key = self.caller(&request)?;
        let handle = bad_handle(&ticket.statement_handle)?;
        self.run_statement(&request, &key, &handle).await
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let key = self.caller(&request)?;
        let handle = bad_handle(&query.prepared_statement_handle)?;
        self.run_statement(&request, &key, &handle).await
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let (_, session) = self.session(&request).await?;
        let mut builder = query.into_builder();
        let mut names = session.ctx.catalog_names();
        names.sort();
        for name in names {
            builder.append(name);
        }
        let batch = builder
            .build()
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Self::batch_response(batch))
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let (_, session) = self.session(&request).await?;
        let mut builder = query.into_builder();
        let mut catalogs = session.ctx.catalog_names();
        catalogs.sort();
        for catalog in catalogs {
            if let Some(provider) = session.ctx.catalog(&catalog) {
                let mut schemas = provider.schema_names();
                schemas.sort();
                for schema in schemas {
                    builder.append(&catalog, schema);
                }
            }
        }
        let batch = builder
            .build()
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Self::batch_response(batch))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let (_, session) = self.session(&request).await?;
        let catalog_filter = query.catalog.clone();
        let mut builder: GetTablesBuilder = query.into_builder();
        let mut catalogs = session.ctx.catalog_names();
        catalogs.sort();
        for catalog in catalogs {
            if catalog_filter.as_ref().is_some_and(|c| c != &catalog) {
                continue;
            }
            let Some(catalog_provider) = session.ctx.catalog(&catalog) else {
                continue;
            };
            let mut schemas = catalog_provider.schema_names();
            schemas.sort();
            for schema in schemas {
                let Some(schema_provider) = catalog_provider.schema(&schema) else {
                    continue;
                };
                let mut tables = schema_provider.table_names();
                tables.sort();
                for table in tables {
                    let Ok(Some(provider)) = schema_provider.table(&table).await else {
                        continue;
                    };
                    builder
                        .append(
                            &catalog,
                            &schema,
                            &table,
                            table_type_name(provider.table_type()),
                            // The column types results have.
                            &basin_connectors::views::plain_schema(&provider.schema()),
                        )
                        .map_err(|e| Status::internal(e.to_string()))?;
                }
            }
        }
        let batch = builder
            .build()
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Self::batch_response(batch))
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.caller(&request)?;
        let mut builder = query.into_builder();
        for t in ["LOCAL TEMPORARY", "TABLE", "VIEW"] {
            builder.append(t);
        }
        let batch = builder
            .build()
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Self::batch_response(batch))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.caller(&request)?;
        let batch = query
            .into_builder(&SQL_INFO)
            .build()
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Self::batch_response(batch))
    }

    async fn do_get_primary_keys(
        &self,
        _query: CommandGetPrimaryKeys,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.caller(&request)?;
        Ok(Self::batch_response(RecordBatch::new_empty(keys_schema(
            false,
        ))))
    }

    async fn do_get_exported_keys(
        &self,
        _query: CommandGetExportedKeys,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.caller(&request)?;
        Ok(Self::batch_response(RecordBatch::new_empty(keys_schema(
            true,
        ))))
    }

    async fn do_get_imported_keys(
        &self,
        _query: CommandGetImportedKeys,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.caller(&request)?;
        Ok(Self::batch_response(RecordBatch::new_empty(keys_schema(
            true,
        ))))
    }

    async fn do_get_cross_reference(
        &self,
        _query: CommandGetCrossReference,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.caller(&request)?;
        Ok(Self::batch_response(RecordBatch::new_empty(keys_schema(
            true,
        ))))
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.caller(&request)?;
        let batch = query
            .into_builder(&XDBC_TYPES)
            .build()
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Self::batch_response(batch))
    }

    async fn do_put_statement_update(
        &self,
        ticket: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let (_, session) = self.session(&request).await?;
        let mut audit = self.audit(&request, &ticket.query);
        let done = async {
            let (plan, _) = self.plan(&session, &ticket.query).await?;
            if let Some(audit) = &mut audit {
                audit.objects(&plan);
            }
            self.update_count(&session, plan, None).await
        }
        .await;
        if let (Ok(count), Some(audit)) = (&done, &mut audit) {
            audit.rows((*count).max(0) as u64);
        }
        audited(&mut audit, done)
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let key = self.caller(&request)?;
        let handle = bad_handle(&query.prepared_statement_handle)?;
        let mut rows = read_parameters(request.into_inner()).await?;
        if rows.len() > 1 {
            return Err(Status::invalid_argument(format!(
                "a query runs with one row of parameter values, but {} rows were bound: \
                 execute it once per row",
                rows.len()
            )));
        }
        let params = rows.pop();
        self.registry
            .with_statement(&handle, &key, |s| s.params = params)
            .ok_or_else(|| Status::not_found("unknown prepared statement (closed?)"))?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle.into_bytes().into()),
        })
    }

    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let (key, session) = self.session(&request).await?;
        let handle = bad_handle(&query.prepared_statement_handle)?;
        let sql = self
            .registry
            .with_statement(&handle, &key, |s| s.sql.clone())
            .unwrap_or_default();
        let mut audit = self.audit(&request, &sql);
        let rows = read_parameters(request.into_inner()).await?;
        let done = async {
            let (plan, again) = self
                .registry
                .with_statement(&handle, &key, Statement::next_execution)
                .ok_or_else(|| Status::not_found("unknown prepared statement (closed?)"))?;
            let plan = self.replan(&session, plan, again).await?;
            if let Some(audit) = &mut audit {
                audit.objects(&plan);
            }
            if rows.is_empty() {
                return self.update_count(&session, plan, None).await;
            }
            // executemany: run once per parameter row.
            let mut total = 0;
            for params in rows {
                total += self
                    .update_count(&session, plan.clone(), Some(params))
                    .await?;
            }
            Ok(total)
        }
        .await;
        if let (Ok(count), Some(audit)) = (&done, &mut audit) {
            audit.rows((*count).max(0) as u64);
        }
        audited(&mut audit, done)
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let (key, session) = self.session(&request).await?;
        // A statement refused while it is prepared (unknown or forbidden table, bad SQL) is
        // audited like one refused when sent whole; a prepared one is audited when it runs.
        let (plan, parsed) = match self.plan(&session, &query.query).await {
            Ok(planned) => planned,
            Err(refused) => {
                let mut audit = self.audit(&request, &query.query);
                return audited(&mut audit, Err(refused));
            }
        };
        let dataset_schema = schema_ipc(&annotate_schema(plan.schema()))?;
        let parameters = Parameters::of(&plan).map_err(to_status)?;
        let parameter_schema = schema_ipc(&parameters.schema())?;
        let mut statement = Statement::new(key, query.query, plan, true);
        statement.parsed = parsed;
        let handle = self.registry.put_statement(statement);
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into_bytes().into(),
            dataset_schema: dataset_schema.into(),
            parameter_schema: parameter_schema.into(),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let key = self.caller(&request)?;
        let handle = bad_handle(&query.prepared_statement_handle)?;
        self.registry.remove_statement(&handle, &key);
        Ok(())
    }

    async fn do_action_cancel_query(
        &self,
        query: ActionCancelQueryRequest,
        request: Request<Action>,
    ) -> Result<ActionCancelQueryResult, Status> {
        let key = self.caller(&request)?;
        let info = FlightInfo::decode(query.info.as_ref())
            .map_err(|e| Status::invalid_argument(format!("malformed FlightInfo: {e}")))?;
        let cancelled = self.handle_cancel(&key, &info).await;
        Ok(ActionCancelQueryResult {
            result: if cancelled { 1 } else { 3 },
        })
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        if request.get_ref().r#type == "CancelFlightInfo" {
            let key = self.caller(&request)?;
            let req = CancelFlightInfoRequest::decode(request.get_ref().body.as_ref())
                .map_err(|e| Status::invalid_argument(format!("malformed request: {e}")))?;
            let cancelled = match &req.info {
                Some(info) => self.handle_cancel(&key, info).await,
                None => false,
            };
            let result = CancelFlightInfoResult {
                status: if cancelled {
                    CancelStatus::Cancelled as i32
                } else {
                    CancelStatus::NotCancellable as i32
                },
            };
            let body = arrow_flight::Result {
                body: result.encode_to_vec().into(),
            };
            let stream: BoxStream<'static, Result<arrow_flight::Result, Status>> =
                Box::pin(futures::stream::once(async move { Ok(body) }));
            return Ok(Response::new(stream));
        }
        Err(Status::unimplemented(format!(
            "action {} is not supported",
            request.get_ref().r#type
        )))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// Every row of the parameter batches a client sent with DoPut, its values by position.
async fn read_parameters(stream: PeekableFlightDataStream) -> Result<Vec<Values>, Status> {
    let mut batches =
        FlightRecordBatchStream::new_from_flight_data(stream.map_err(FlightError::from));
    let mut rows = vec![];
    while let Some(batch) = batches.next().await {
        let batch = batch.map_err(|e| Status::invalid_argument(format!("bad parameters: {e}")))?;
        for row in 0..batch.num_rows() {
            let values = batch
                .columns()
                .iter()
                .map(|c: &ArrayRef| ScalarValue::try_from_array(c, row))
                .collect::<Result<Vec<_>, _>>()
                .map_err(to_status)?;
            rows.push(values);
        }
    }
    Ok(rows)
}

/// Records how a statement ended on its audit line (if it has one).
fn audited<T>(audit: &mut Option<Audited>, result: Result<T, Status>) -> Result<T, Status> {
    if let Some(audit) = audit {
        audit.ended(
            result
                .as_ref()
                .map(|_| ())
                .map_err(|s| s.message().to_string()),
        );
    }
    result
}

/// The rows of a Flight message (0 for a schema or dictionary message).
fn rows_of(message: &arrow_flight::FlightData) -> u64 {
    datafusion::arrow::ipc::root_as_message(&message.data_header)
        .ok()
        .and_then(|m| m.header_as_record_batch())
        .map_or(0, |b| b.length().max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sources_failures_map_to_statuses_by_kind() {
        use basin_connectors::remote::{SourceError, SourceErrorKind};
        let source = |kind| {
            DataFusionError::Context(
                "planning".into(),
                Box::new(DataFusionError::External(Box::new(SourceError {
                    kind,
                    message: "postgres source `pg`: cannot connect: refused".into(),
                }))),
            )
        };
        assert_eq!(
            to_status(source(SourceErrorKind::Unavailable)).code(),
            tonic::Code::Unavailable
        );
        assert_eq!(
            to_status(source(SourceErrorKind::Timeout)).code(),
            tonic::Code::DeadlineExceeded
        );
        let failed = to_status(source(SourceErrorKind::Failed));
        assert_eq!(failed.code(), tonic::Code::InvalidArgument);
        assert!(
            failed.message().contains("source `pg`"),
            "{}",
            failed.message()
        );
    }
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::ipc::reader::StreamReader;
    use datafusion::arrow::ipc::writer::StreamWriter;

    /// A batch as the scheduler gets it from an executor: decoded from one IPC message, all
    /// columns sharing the message's allocation.
    fn decoded(rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("{i:020}")),
                )),
            ],
        )
        .unwrap();
        let mut bytes = vec![];
        let mut writer = StreamWriter::try_new(&mut bytes, &schema).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
        drop(writer);
        StreamReader::try_new(std::io::Cursor::new(bytes), None)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
    }

    #[test]
    fn batches_split_by_their_rows_size_not_by_shared_allocations() {
        // 100k rows: 0.8 MB of ids and 2.4 MB of text (with offsets): two messages.
        let batch = decoded(100_000);
        let pieces = split_for_flight(batch.clone());
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces.iter().map(|b| b.num_rows()).sum::<usize>(), 100_000);
        assert_eq!(
            pieces[1]
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0),
            50_000
        );
        // What arrow-flight's own split would have counted.
        let allocations: usize = batch
            .columns()
            .iter()
            .map(|c| c.get_buffer_memory_size())
            .sum();
        assert!(allocations > 2 * 3_200_000, "{allocations}");
        // Small and empty batches travel whole.
        assert_eq!(split_for_flight(decoded(1_000)).len(), 1);
        assert_eq!(split_for_flight(decoded(0)).len(), 1);
    }
}
