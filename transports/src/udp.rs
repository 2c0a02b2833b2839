//! A call's UDP socket as a stream its edge actor adds to its context (WebRTC and SIP calls).

/// What a UDP socket receives, as a stream of datagrams (at most `max` bytes each) and their
/// senders: a call's edge adds it to its context.
pub fn datagrams(
    socket: std::sync::Arc<tokio::net::UdpSocket>,
    max: usize,
) -> impl futures_util::Stream<Item = std::io::Result<(Vec<u8>, std::net::SocketAddr)>> {
    futures_util::stream::unfold(socket, move |socket| async move {
        let mut buf = vec![0u8; max];
        let got = socket.recv_from(&mut buf).await.map(|(n, from)| {
            buf.truncate(n);
            (buf, from)
        });
        Some((got, socket))
    })
}
