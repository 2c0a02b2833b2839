//! What the node handshake costs (node protocol 10: a SPAKE2 exchange over the token, or over a
//! replica's key, then an HMAC-SHA256 proof each way): the whole of it, gateway and node, over an
//! in-memory pipe, with the token and with a replica's credential (the node derives the
//! replica's key from its name); and the SPAKE2 exchange alone (both sides' messages and keys),
//! which is what protocol 9 added to protocol 8's HMAC proofs.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use omni_backend_host::link::handshake;
use omni_backend_host::link::wire::Request;

const TOKEN: &str = "Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=";

fn handshake(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut group = c.benchmark_group("handshake");
    let credential =
        omni_backend_host::link::replica::Credential::parse(&omni_backend_host::link::replica::issue(TOKEN, "r1"))
            .expect("a credential");
    let secrets = [
        ("protocol 10, the token, both sides, in-memory pipe", handshake::Secret::Token(TOKEN)),
        (
            "protocol 10, a replica's credential, both sides, in-memory pipe",
            handshake::Secret::Replica { name: "r1", password: credential.password() },
        ),
    ];
    for (name, secret) in secrets {
        group.bench_function(name, |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
                    let node_side = async { handshake::accept(&mut node, TOKEN).await.unwrap() };
                    let gateway_side =
                        async { handshake::open(&mut gateway, secret, Request::Discover).await.unwrap() };
                    black_box(tokio::join!(node_side, gateway_side));
                })
            })
        });
    }
    group.bench_function("SPAKE2 exchange alone, both sides", |b| {
        b.iter(|| {
            let (a, a_msg) = handshake::exchange(TOKEN);
            let (n, n_msg) = handshake::exchange(TOKEN);
            black_box((a.finish(&n_msg).unwrap(), n.finish(&a_msg).unwrap()));
        })
    });
    group.finish();
}

criterion_group!(benches, handshake);
criterion_main!(benches);
