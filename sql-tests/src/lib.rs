//! Basin's sqllogictest machinery: the database adapter, result formatting, the tolerant
//! validator and the multi-process test cluster. The runner is the `sqllogictests` test
//! target (`src/main.rs`).

pub mod engine;
pub mod process_cluster;
pub mod upstream;
pub mod validate;
