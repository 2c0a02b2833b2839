use super::{TpHandle, Transports};
use crate::{Result, StunError};
use std::io;
use std::net::SocketAddr;
use stun::{IncomingMessage, StunEndpointUser};
use stun_types::attributes::{MappedAddress, Software, XorMappedAddress};
use stun_types::{Class, MessageBuilder, Method, TransactionId};

pub(crate) struct StunUser;

#[async_trait::async_trait]
impl StunEndpointUser for StunUser {
    type Transport = TpHandle;

    async fn send_to(
        &self,
        bytes: &[u8],
        target: SocketAddr,
        transport: &Self::Transport,
    ) -> io::Result<()> {
        match &transport.transport {
            super::Transport::Udp(udp_transport) => udp_transport.send_to(bytes, target).await,
            super::Transport::Connection(..) => {
                Err(io::Error::other("Unsupported transport for STUN"))
            }
        }
    }

    async fn receive(&self, _message: IncomingMessage<Self::Transport>) {
        // we ignore messages outside of transactions
    }
}

impl stun::TransportInfo for TpHandle {
    fn reliable(&self) -> bool {
        self.is_reliable()
    }
}

impl Transports {
    pub(crate) async fn discover_public_address(
        &self,
        stun_server: SocketAddr,
        transport: &TpHandle,
    ) -> Result<SocketAddr, StunError> {
        match &transport.transport {
            super::Transport::Udp(..) => {}
            super::Transport::Connection(connection) => return Ok(connection.bound()),
        }

        let tsx_id = TransactionId::random();

        let mut msg = MessageBuilder::new(Class::Request, Method::Binding, tsx_id);
        msg.padding_in_value_len(true);
        msg.add_attr(Software::new("ezk"));
        let bytes = msg.finish();

        let request = stun::Request {
            bytes: &bytes,
            tsx_id,
            transport,
        };

        let mut response = self
            .stun
            .send_request(request, stun_server)
            .await?
            .ok_or(StunError::RequestTimedOut)?;

        // TODO fix these errors
        if let Some(addr) = response.attribute::<XorMappedAddress>() {
            addr.map(|addr| addr.0)
                .map_err(StunError::MalformedResponse)
        } else if let Some(addr) = response.attribute::<MappedAddress>() {
            addr.map(|addr| addr.0)
                .map_err(StunError::MalformedResponse)
        } else {
            Err(StunError::InvalidResponse)
        }
    }
}
