//! `[cluster]`: several gateway replicas sharing one queue and the workers of their nodes,
//! through a store ([`redis::RedisStore`], the one engine so far). Without it (the default)
//! a gateway keeps its queue in memory and its workers to itself.

pub mod redis;
