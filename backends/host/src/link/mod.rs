//! The link between a gateway (or a replica of a cluster) and a node: what they say to each
//! other ([`wire`]), how each proves to the other that it holds the node's token before
//! anything else is said ([`handshake`]), the identity each replica proves ([`replica`]), how a
//! node signs the grants a replica may dial ([`grant`]), and the links a replica keeps open to
//! its nodes, on which they push the grants of its tickets ([`standby`]). Both roles use it: the gateway's side of a worker link
//! is [`crate::remote`], the node's is the server's node role.

pub mod config;
pub(crate) mod dial;
pub mod grant;
pub mod handshake;
mod mac;
pub mod replica;
pub mod standby;
pub mod wire;

/// Why a link to a node could not be opened or answered.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("ca {path}: {why}")]
    Ca { path: std::path::PathBuf, why: String },
    #[error("server_name '{name}': {why}")]
    ServerName { name: String, why: String },
    #[error("TLS: {0}")]
    Tls(std::io::Error),
    #[error("cannot send the handshake: {0}")]
    Handshake(std::io::Error),
    #[error("refused: {0}")]
    Refused(String),
    /// The node answered something else than the handshake or the request asks for.
    #[error("unexpected answer {0}")]
    Unexpected(&'static str),
    #[error("closed without an answer")]
    Closed,
    #[error("unreadable answer: {0}")]
    Unreadable(std::io::Error),
    #[error("no answer within {0} s")]
    Timeout(u64),
    /// What answered could not prove it holds the token: a node with another token, or not
    /// the node (an address a store was made to name, another host on the node's address).
    #[error(
        "what answered could not prove it holds the token: the node has another token, or it is not the node \
         (it was sent only the hello)"
    )]
    NotTheNode,
    /// None of the addresses the node's name resolves to is in `[cluster] node_networks`.
    #[error("{0} is outside [cluster] node_networks: not dialled")]
    OutsideNetworks(String),
}

impl LinkError {
    /// The reason a link failed to open, as the metrics count it.
    pub fn reason(&self) -> &'static str {
        match self {
            LinkError::OutsideNetworks(_) => "outside_networks",
            LinkError::NotTheNode => "not_the_node",
            LinkError::Refused(_) | LinkError::Unexpected(_) => "refused",
            _ => "unreachable",
        }
    }
}
