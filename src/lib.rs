//! omni-gateway: the server around the actor system of `omni-actors`.
//!
//! `config` loads `config.toml`; `backend` drives backends through the C ABI.

pub mod audio;
pub mod auth;
pub mod backend;
pub mod cluster;
pub mod config;
pub mod dialect;
pub mod node;
pub mod recordings;
pub mod routes;
pub mod server;
pub mod socket;
pub mod subscribers;
pub mod tools;
pub mod webhooks;
