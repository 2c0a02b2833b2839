//! omni-gateway: the server around the actor system of `omni-actors`.
//!
//! # Layout
//!
//! The transports (`omni-transports`), the dialects (`omni-dialects`) and the backend host
//! (`omni-backend-host`) are crates of their own over the actors; this crate composes them.
//!
//! - [`config`]: `config.toml` into typed sections, each checking itself (the sections of the
//!   other crates are theirs, re-exported here).
//! - [`check`]: `omni-gateway check-config`.
//! - [`auth`]: API keys, the admin key, and the client secrets minted for browsers.
//! - [`admission`]: a caller authenticated and admitted (its address's and its key's caps), and
//!   how its session starts, for every transport.
//! - [`roles`]: what the binary runs as: a single gateway, a replica of a cluster, or a
//!   [`roles::node`] serving its workers to gateways. Each starts the same actors.
//! - [`http`]: the HTTP server of a gateway or replica: the realtime and telephony routes, the
//!   operator routes and the pages, graceful shutdown.
//! - [`listen`]: the listening sockets and TLS.
//! - [`store`]: the store replicas and nodes share (Redis).
//! - [`observe`]: the subscribers of session and worker events (recorder, usage, webhooks) and
//!   the recordings on disk.
//! - `signals`: SIGTERM, SIGINT and SIGHUP, registered before a server says it listens.

pub mod admission;
pub mod auth;
pub mod check;
pub mod config;
pub mod http;
pub mod listen;
pub mod observe;
pub mod roles;
mod signals;
pub mod store;
