//! Query time limits: `[server] query_timeout_seconds` for every query of the cluster, and
//! `SET basin.query_timeout_seconds = N` for a session's own, which may only be shorter.
//!
//! A query that runs out of time is cancelled like one its client cancels (its Ballista job,
//! the executors' streamed stages, the statements they run on source databases) and its
//! client gets an error that says which limit it hit and how to change it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionConfig;
use futures::Stream;
use tokio::time::{Instant, Sleep};

/// Basin's own session settings: `SET basin.<name> = <value>`, shown by `SHOW ALL` and
/// `SHOW basin.<name>`. (Written out rather than with DataFusion's `extensions_options!`,
/// which lists an extension's settings without their `basin.` prefix.)
#[derive(Debug, Clone, Default)]
pub struct BasinOptions {
    /// The longest a query of this session may run, in seconds (0 = the server's limit);
    /// the server's `[server] query_timeout_seconds` caps it.
    pub query_timeout_seconds: u64,
}

const QUERY_TIMEOUT: &str = "query_timeout_seconds";

impl ExtensionOptions for BasinOptions {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> datafusion::error::Result<()> {
        match key {
            QUERY_TIMEOUT => {
                self.query_timeout_seconds = value.trim().parse().map_err(|_| {
                    DataFusionError::Configuration(format!(
                        "basin.{QUERY_TIMEOUT} is a whole number of seconds (0 = the \
                         server's limit), not `{value}`"
                    ))
                })?;
                Ok(())
            }
            other => Err(DataFusionError::Configuration(format!(
                "there is no setting basin.{other}; Basin's settings: basin.{QUERY_TIMEOUT}"
            ))),
        }
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        vec![ConfigEntry {
            key: format!("{}.{QUERY_TIMEOUT}", Self::PREFIX),
            value: Some(self.query_timeout_seconds.to_string()),
            description: "The longest a query of this session may run, in seconds (0 = the \
                          server's limit); [server] query_timeout_seconds caps it.",
        }]
    }
}

impl ConfigExtension for BasinOptions {
    const PREFIX: &'static str = "basin";
}

/// A query's time limit and where it comes from, for the error that reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeLimit {
    pub limit: Duration,
    /// True when the session's `SET basin.query_timeout_seconds` set it.
    pub from_session: bool,
}

impl TimeLimit {
    /// The limit of a query of a session configured as `config` on a server whose limit is
    /// `server_seconds` (0 = none): the shorter of the two that are set.
    pub fn of(config: &SessionConfig, server_seconds: u64) -> Option<Self> {
        let session_seconds = config
            .options()
            .extensions
            .get::<BasinOptions>()
            .map_or(0, |o| o.query_timeout_seconds);
        Self::shorter(server_seconds, session_seconds)
    }

    fn shorter(server_seconds: u64, session_seconds: u64) -> Option<Self> {
        let (seconds, from_session) = match (server_seconds, session_seconds) {
            (0, 0) => return None,
            (0, s) => (s, true),
            (s, 0) => (s, false),
            (server, session) if session < server => (session, true),
            (server, _) => (server, false),
        };
        Some(Self {
            limit: Duration::from_secs(seconds),
            from_session,
        })
    }

    /// What the client reads when its query ran out of time.
    pub fn message(&self) -> String {
        let seconds = self.limit.as_secs();
        let (setting, change) = if self.from_session {
            (
                "this session's `basin.query_timeout_seconds`",
                "SET basin.query_timeout_seconds = <seconds> (0 = the server's limit) to change it",
            )
        } else {
            (
                "the server's `[server] query_timeout_seconds`",
                "raise it in basin.toml, or split the work into smaller statements",
            )
        };
        format!(
            "the query ran longer than its time limit of {seconds} s ({setting}) and was \
             cancelled; {change}"
        )
    }

    /// When a query that starts now runs out of time.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.limit
    }
}

/// A result stream that ends with an error at `deadline`: the inner stream is dropped first,
/// which cancels whatever still produces it (its own `Drop`s do that), then the client gets
/// `error`.
pub struct Deadline<S, E> {
    inner: Option<S>,
    sleep: Pin<Box<Sleep>>,
    error: Option<E>,
}

impl<S, E> Deadline<S, E> {
    pub fn new(inner: S, deadline: Instant, error: E) -> Self {
        Self {
            inner: Some(inner),
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            error: Some(error),
        }
    }
}

impl<S, T, E> Stream for Deadline<S, E>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    E: Unpin,
{
    type Item = Result<T, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.inner.is_none() {
            return Poll::Ready(None);
        }
        // The clock first: a stream that always has its next batch ready must still stop.
        if this.sleep.as_mut().poll(cx).is_ready() {
            tracing::info!("a query ran out of time: cancelling it");
            this.inner = None;
            return Poll::Ready(this.error.take().map(Err));
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let item = futures::ready!(Pin::new(inner).poll_next(cx));
        if item.is_none() {
            this.inner = None;
        }
        Poll::Ready(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn the_shorter_limit_that_is_set_applies() {
        assert_eq!(TimeLimit::shorter(0, 0), None);
        let limit = |s| Duration::from_secs(s);
        let got = |server, session| {
            let t = TimeLimit::shorter(server, session).unwrap();
            (t.limit, t.from_session)
        };
        assert_eq!(got(60, 0), (limit(60), false));
        assert_eq!(got(0, 5), (limit(5), true));
        assert_eq!(got(60, 5), (limit(5), true));
        // A session cannot raise the server's limit.
        assert_eq!(got(60, 600), (limit(60), false));
    }

    #[test]
    fn a_session_setting_is_read_from_the_session() {
        let mut config = SessionConfig::new().with_option_extension(BasinOptions::default());
        assert_eq!(TimeLimit::of(&config, 0), None);
        config
            .options_mut()
            .set("basin.query_timeout_seconds", "7")
            .unwrap();
        let limit = TimeLimit::of(&config, 30).unwrap();
        assert_eq!(limit.limit, Duration::from_secs(7));
        assert!(limit.message().contains("SET basin.query_timeout_seconds"));
        let bad = config
            .options_mut()
            .set("basin.query_timeout_seconds", "soon")
            .unwrap_err();
        assert!(bad.to_string().contains("whole number of seconds"), "{bad}");
        let unknown = config.options_mut().set("basin.bogus", "1").unwrap_err();
        assert!(
            unknown.to_string().contains("basin.query_timeout_seconds"),
            "{unknown}"
        );
        let listed: Vec<_> = config
            .options()
            .entries()
            .into_iter()
            .filter(|e| e.key.starts_with("basin."))
            .map(|e| (e.key, e.value))
            .collect();
        assert_eq!(
            listed,
            [(
                "basin.query_timeout_seconds".to_string(),
                Some("7".to_string())
            )]
        );
    }

    #[tokio::test]
    async fn a_stream_past_its_deadline_is_dropped_and_ends_with_the_error() {
        struct Dropped(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let guard = Dropped(dropped.clone());
        let rows = futures::stream::iter([Ok::<u32, String>(1), Ok(2)])
            .chain(futures::stream::pending())
            .inspect(move |_| {
                let _holds = &guard;
            });
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut stream = Deadline::new(Box::pin(rows), deadline, "too slow".to_string());
        assert_eq!(stream.next().await, Some(Ok(1)));
        assert_eq!(stream.next().await, Some(Ok(2)));
        assert_eq!(stream.next().await, Some(Err("too slow".to_string())));
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(stream.next().await, None);

        // A stream that ends in time ends as it is.
        let rows = futures::stream::iter([Ok::<u32, String>(1)]);
        let mut stream = Deadline::new(
            rows,
            Instant::now() + Duration::from_secs(60),
            "late".to_string(),
        );
        assert_eq!(stream.next().await, Some(Ok(1)));
        assert_eq!(stream.next().await, None);
    }
}
