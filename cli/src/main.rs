//! `basin`: run a standalone cluster, a scheduler or an executor.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use basin_cli::cluster::{StandaloneCluster, StandaloneOptions};
use basin_cli::output::{OutputFormat, write_result};
use basin_cli::statements::run_sql;
use basin_core::{BasinConfig, BasinError, ByteSize};
use basin_executor::ExecutorOptions;
use basin_scheduler::SchedulerOptions;
use clap::{Args, Parser, Subcommand};

/// mimalloc keeps freed memory for reuse: with the system allocator, every multi-megabyte
/// Arrow/IPC buffer of a streamed result was a fresh mmap whose pages the kernel zeroed
/// (`clear_page` was a tenth of the CPU of a full-table extraction).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc's option API (linked in by the `mimalloc` crate's static library).
unsafe extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (default 1000 ms).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// Freed memory stays with the process for the next query instead of going back to the OS
/// a second later: re-faulting it cost the kernel's page clearing on every query
/// (TPC-H SF1, 22 queries on a 2-executor cluster: 6.73 s with mimalloc's 1 s delay,
/// 5.92 s without purging, same run). The peak is unchanged; memory is reused, not grown.
/// `MIMALLOC_PURGE_DELAY=<ms>` in the environment keeps mimalloc's own behaviour.
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: plain C calls with an option index of the linked mimalloc version.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

/// Library errors capture no backtrace unless `RUST_LIB_BACKTRACE` asks for one. With
/// `RUST_BACKTRACE=1` they all did: iceberg-rust builds an error for every ordinary column a
/// scan plans (asking whether it is a metadata column), and unwinding the stack for errors
/// that are then dropped took 2.3 % of the scheduler's CPU over the TPC-H queries. Panics
/// keep their backtraces (`RUST_BACKTRACE`).
fn no_backtraces_in_errors() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: the first thing `main` does, before any other thread exists.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

#[derive(Parser)]
#[command(
    name = "basin",
    version,
    about = "Basin: distributed, federated SQL engine and lakehouse"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A scheduler and N executors in one process; runs -e/-f statements or serves until Ctrl-C.
    Standalone(StandaloneArgs),
    /// The scheduler of a cluster.
    Scheduler(SchedulerArgs),
    /// An executor that joins a scheduler.
    Executor(ExecutorArgs),
    /// Interactive SQL shell over Flight SQL (or -e/-f to run statements and exit).
    Sql(SqlArgs),
    /// Prints the bcrypt hash of a password read from stdin, for a [flight_sql] users file.
    HashPassword,
}

#[derive(Args)]
struct SqlArgs {
    /// Flight SQL URL.
    #[arg(default_value = "grpc://127.0.0.1:50060", env = "BASIN_URL")]
    url: String,
    /// User name (the password is prompted for, or read from BASIN_PASSWORD).
    #[arg(long, short = 'u', env = "BASIN_USER")]
    user: Option<String>,
    #[command(flatten)]
    script: ScriptArgs,
}

/// Statements to run instead of serving or opening the shell.
#[derive(Args)]
struct ScriptArgs {
    /// SQL to run (repeatable); prints each result and exits.
    #[arg(short = 'e', long = "execute")]
    execute: Vec<String>,
    /// File of SQL statements to run; prints each result and exits.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// Result format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    format: OutputFormat,
}

impl ScriptArgs {
    fn is_empty(&self) -> bool {
        self.execute.is_empty() && self.file.is_none()
    }

    /// The scripts to run, each with where it came from (`-e` or the file name).
    fn scripts(&self) -> Result<Vec<(String, String)>, String> {
        let mut scripts: Vec<(String, String)> = self
            .execute
            .iter()
            .map(|sql| ("-e".to_string(), sql.clone()))
            .collect();
        if let Some(file) = &self.file {
            let sql = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read SQL file {}: {e}", file.display()))?;
            scripts.push((file.display().to_string(), sql));
        }
        Ok(scripts)
    }
}

#[derive(Args)]
struct CommonArgs {
    /// Configuration file (default: embedded defaults, built-in tpch catalog).
    #[arg(long, short = 'c', env = "BASIN_CONFIG")]
    config: Option<PathBuf>,
    /// Address to bind (overrides [server] bind_host).
    #[arg(long, env = "BASIN_BIND_HOST")]
    bind_host: Option<String>,
    /// Data directory (overrides [server] data_dir).
    #[arg(long, env = "BASIN_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Args)]
struct StandaloneArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Number of executors.
    #[arg(long, default_value_t = 2)]
    executors: usize,
    /// Task slots per executor (default: number of cores).
    #[arg(long)]
    task_slots: Option<usize>,
    /// Memory each executor's queries may hold, e.g. 4GiB (overrides [executor] memory_limit;
    /// default: 60 % of the machine's memory divided among the executors).
    #[arg(long, env = "BASIN_EXECUTOR_MEMORY_LIMIT")]
    memory_limit: Option<ByteSize>,
    /// Scheduler gRPC port (0 = any free port).
    #[arg(long, default_value_t = 0)]
    scheduler_port: u16,
    /// Flight SQL port when serving (overrides [flight_sql] port, default 50060).
    #[arg(long, env = "BASIN_FLIGHT_SQL_PORT")]
    flight_sql_port: Option<u16>,
    #[command(flatten)]
    script: ScriptArgs,
    /// Open the SQL shell on this cluster instead of only serving clients.
    #[arg(long)]
    shell: bool,
}

#[derive(Args)]
struct SchedulerArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// gRPC port (overrides [server] scheduler_port, default 50050).
    #[arg(long, env = "BASIN_SCHEDULER_PORT")]
    port: Option<u16>,
    /// Host name executors and clients use to reach this scheduler (default: the bind host).
    #[arg(long)]
    external_host: Option<String>,
    /// Flight SQL port (overrides [flight_sql] port, default 50060).
    #[arg(long, env = "BASIN_FLIGHT_SQL_PORT")]
    flight_sql_port: Option<u16>,
}

#[derive(Args)]
struct ExecutorArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The scheduler to join, HOST:PORT.
    #[arg(long, env = "BASIN_SCHEDULER", default_value = "127.0.0.1:50050")]
    scheduler: String,
    /// Arrow Flight port for shuffle data (0 = any free port).
    #[arg(long, default_value_t = 0)]
    flight_port: u16,
    /// gRPC port for task launches (0 = any free port).
    #[arg(long, default_value_t = 0)]
    grpc_port: u16,
    /// Host name other nodes use to reach this executor (default: the bind host).
    #[arg(long)]
    external_host: Option<String>,
    /// Concurrent tasks (default: number of cores).
    #[arg(long)]
    task_slots: Option<usize>,
    /// Memory this executor's queries may hold, e.g. 4GiB (overrides [executor] memory_limit;
    /// default: 60 % of the machine's memory).
    #[arg(long, env = "BASIN_EXECUTOR_MEMORY_LIMIT")]
    memory_limit: Option<ByteSize>,
    /// Directory for shuffle and spill files.
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    no_backtraces_in_errors();
    keep_freed_memory();
    let cli = Cli::parse();
    // Servers log at info; commands that print results or prompt log only errors.
    let quiet = match &cli.command {
        Command::Standalone(a) => !a.script.is_empty() || a.shell,
        Command::Sql(_) | Command::HashPassword => true,
        Command::Scheduler(_) | Command::Executor(_) => false,
    };
    // Quiet runs print Basin's own errors. Ballista logs an executor-registration race
    // (its executor registers before its gRPC server listens; Basin retries it) and task
    // failures (which reach the user as the query's error) at ERROR: not for the terminal.
    if let Err(e) = init_logging(if quiet {
        "error,ballista_executor::executor_server=off,ballista_scheduler::scheduler_server::grpc=off"
    } else {
        "info"
    }) {
        return fail(&e);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(16 * 1024 * 1024)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Standalone(args) => standalone(args).await,
            Command::Scheduler(args) => scheduler(args).await,
            Command::Executor(args) => executor(args).await,
            Command::Sql(args) => sql_shell(args).await,
            Command::HashPassword => hash_password(),
        }
    });
    // Executors and servers may still hold tasks; do not wait for them.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(&message),
    }
}

/// Logs go to stderr at `BASIN_LOG` (else `default`). With `BASIN_LOG_FILE`, they are also
/// appended to that file at `BASIN_LOG` (else info): a quiet `-e` run keeps its progress there.
fn init_logging(default: &str) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer, fmt};
    let level = |default: &str| {
        EnvFilter::try_from_env("BASIN_LOG").unwrap_or_else(|_| EnvFilter::new(default))
    };
    let file = match std::env::var_os("BASIN_LOG_FILE") {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| {
                    format!(
                        "cannot open the log file {} (BASIN_LOG_FILE): {e}",
                        PathBuf::from(&path).display()
                    )
                })?;
            Some(
                fmt::layer()
                    .with_writer(std::sync::Mutex::new(file))
                    .with_ansi(false)
                    .with_filter(level("info")),
            )
        }
        None => None,
    };
    let _ = tracing_subscriber::registry()
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .with_filter(level(default)),
        )
        .with(file)
        .try_init();
    Ok(())
}

fn fail(message: &str) -> ExitCode {
    let one_line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    eprintln!("error: {one_line}");
    ExitCode::FAILURE
}

fn load_config(common: &CommonArgs) -> Result<Arc<BasinConfig>, String> {
    let mut config = match &common.config {
        Some(path) => BasinConfig::from_file(path).map_err(|e| e.to_string())?,
        None => BasinConfig::embedded(),
    };
    if let Some(host) = &common.bind_host {
        config.server.bind_host = host.clone();
    }
    if let Some(dir) = &common.data_dir {
        config.server.data_dir = dir.clone();
    }
    Ok(Arc::new(config))
}

async fn standalone(args: StandaloneArgs) -> Result<(), String> {
    let mut config = Arc::unwrap_or_clone(load_config(&args.common)?);
    if let Some(slots) = args.task_slots {
        config.server.executor_task_slots = slots;
    }
    if let Some(limit) = args.memory_limit {
        config.executor.memory_limit = Some(limit);
    }
    let config = Arc::new(config);
    let scripts = args.script.scripts()?;
    let cluster = StandaloneCluster::start(
        config,
        StandaloneOptions {
            executors: args.executors,
            scheduler_port: args.scheduler_port,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    if scripts.is_empty() {
        let port = args
            .flight_sql_port
            .unwrap_or(cluster.config().flight_sql.port);
        let flight = basin_scheduler::flight_sql::serve(
            cluster.config().clone(),
            cluster.scheduler().url(),
            cluster.scheduler().cluster_view(),
            port,
        )
        .await
        .map_err(|e| e.to_string())?;
        if args.shell {
            let url = format!("grpc://{}", flight.addr);
            let mut conn = basin_cli::shell::Connection::connect(&url, None, None).await?;
            return basin_cli::shell::interactive(&mut conn, args.script.format, &url).await;
        }
        eprintln!(
            "Basin standalone: Flight SQL on {} (jdbc:arrow-flight-sql://{}/?useEncryption=false), \
             scheduler at {}, {} executors ({} task slots). Press Ctrl-C to stop.",
            flight.addr,
            flight.addr,
            cluster.scheduler().addr,
            args.executors,
            cluster.task_slots()
        );
        return wait_for_shutdown().await;
    }
    let ctx = cluster.connect().map_err(|e| e.to_string())?;
    let run = async {
        for (origin, sql) in scripts {
            run_sql(&ctx, &sql, &mut |result| {
                let mut out = std::io::stdout().lock();
                write_result(&mut out, &result, args.script.format)?;
                out.flush()
                    .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
            })
            .await
            .map_err(|e| {
                if origin == "-e" {
                    e.to_string()
                } else {
                    format!("{origin}: {e}")
                }
            })?;
        }
        Ok(())
    };
    // The in-process executors (Ballista) take Ctrl-C and SIGTERM for themselves and stop:
    // without this the statement would then wait for them forever.
    tokio::select! {
        done = run => done,
        stop = wait_for_shutdown() => stop.and(Err(
            "interrupted (Ctrl-C or SIGTERM): the running statement was stopped; a write \
             either committed before it or left the table unchanged"
                .to_string(),
        )),
    }
}

async fn scheduler(args: SchedulerArgs) -> Result<(), String> {
    let config = load_config(&args.common)?;
    let mut options = SchedulerOptions::from_config(&config);
    if let Some(port) = args.port {
        options.port = port;
    }
    if let Some(host) = args.external_host {
        options.external_host = host;
    }
    let handle = basin_scheduler::start(config.clone(), options)
        .await
        .map_err(|e| e.to_string())?;
    let port = args.flight_sql_port.unwrap_or(config.flight_sql.port);
    let flight =
        basin_scheduler::flight_sql::serve(config, handle.url(), handle.cluster_view(), port)
            .await
            .map_err(|e| e.to_string())?;
    eprintln!(
        "Basin scheduler listening on {} (Flight SQL on {}). Press Ctrl-C to stop.",
        handle.addr, flight.addr
    );
    wait_for_shutdown().await
}

async fn executor(args: ExecutorArgs) -> Result<(), String> {
    let config = load_config(&args.common)?;
    let (host, port) = args
        .scheduler
        .rsplit_once(':')
        .and_then(|(h, p)| p.parse::<u16>().ok().map(|p| (h.to_string(), p)))
        .ok_or_else(|| {
            format!(
                "--scheduler must be HOST:PORT, e.g. 127.0.0.1:50050 (got `{}`)",
                args.scheduler
            )
        })?;
    let mut options = ExecutorOptions::new(&config, &host, port);
    options.flight_port = args.flight_port;
    options.grpc_port = args.grpc_port;
    if let Some(h) = args.external_host {
        options.external_host = h;
    }
    if let Some(slots) = args.task_slots {
        options.task_slots = slots;
    }
    if let Some(limit) = args.memory_limit {
        options.memory_limit = limit.0;
    }
    options.work_dir = args.work_dir;
    basin_executor::run(config, options)
        .await
        .map_err(|e: BasinError| e.to_string())
}

async fn sql_shell(args: SqlArgs) -> Result<(), String> {
    use basin_cli::shell;
    let password = match (&args.user, std::env::var("BASIN_PASSWORD")) {
        (None, _) => None,
        (Some(_), Ok(p)) => Some(p),
        (Some(user), Err(_)) => Some(
            rpassword::prompt_password(format!("Password for {user}: "))
                .map_err(|e| format!("cannot read the password: {e}"))?,
        ),
    };
    let mut conn =
        shell::Connection::connect(&args.url, args.user.as_deref(), password.as_deref()).await?;
    let format = args.script.format;
    if args.script.is_empty() {
        return shell::interactive(&mut conn, format, &args.url).await;
    }
    for (origin, sql) in args.script.scripts()? {
        shell::run_script(&mut conn, &sql, format)
            .await
            .map_err(|e| {
                if origin == "-e" {
                    e
                } else {
                    format!("{origin}: {e}")
                }
            })?;
    }
    Ok(())
}

fn hash_password() -> Result<(), String> {
    let mut password = String::new();
    std::io::stdin()
        .read_line(&mut password)
        .map_err(|e| format!("cannot read the password from stdin: {e}"))?;
    let password = password.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err("the password is empty".to_string());
    }
    let hash = basin_scheduler::flight_sql::hash_password(password).map_err(|e| e.to_string())?;
    println!("{hash}");
    Ok(())
}

async fn wait_for_shutdown() -> Result<(), String> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term =
            signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        Ok(())
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .map_err(|e| format!("cannot wait for Ctrl-C: {e}"))
}

#[cfg(test)]
mod tests {
    unsafe extern "C" {
        fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
    }

    #[test]
    fn the_purge_delay_index_names_that_option_of_the_linked_mimalloc() {
        // mimalloc 3's purge delay defaults to 1000 ms, which no neighbouring option has.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // SAFETY: a plain C call.
            assert_eq!(unsafe { mi_option_get(super::MI_OPTION_PURGE_DELAY) }, 1000);
        }
    }
}
