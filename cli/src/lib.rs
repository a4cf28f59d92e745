//! The `basin` command: a standalone cluster in one process, or the scheduler and executor
//! processes of a real cluster; and the library pieces tests reuse (an in-process
//! [`cluster::StandaloneCluster`], statement running and result printing).
//!
//! ```text
//!  basin standalone ─► scheduler + N executors in one process (loopback gRPC/Flight)
//!  basin scheduler  ─► scheduler process      basin executor ─► executor process
//! ```

pub mod cluster;
pub mod output;
pub mod shell;
pub mod statements;
