//! The link between a gateway (or a replica of a cluster) and a node: what they say to each
//! other ([`wire`]), and the links a replica keeps open to its nodes, on which they push the
//! grants of its tickets ([`standby`]). Both roles use it: the gateway's side of a worker link
//! is [`crate::backend::remote`], the node's is [`crate::roles::node`].

pub mod standby;
pub mod wire;
