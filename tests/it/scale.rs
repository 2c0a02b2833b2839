//! What one gateway holds: unpaced reference workers (the load tests' and the soak's) have no
//! thread (their BackendActors run them) instead of two each; a paced one still has its own.

use crate::common::*;
use serde_json::json;

fn threads(server: &Server) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", server.pid())).unwrap().count()
}

#[tokio::test]
async fn a_thousand_unpaced_reference_workers_open_on_a_few_threads_and_serve() {
    let server = Server::ready(Setup::default().workers(workers(1000, "")));
    let cores = std::thread::available_parallelism().unwrap().get();
    let n = threads(&server);
    // The runtime's threads (main, HTTP workers, accept loop, signal and log helpers): nothing
    // per worker.
    assert!(n < 16 + 2 * cores, "{n} threads for 1,000 workers");
    // They serve: the reference backend hears a tone, then answers the silence after it.
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
    c.send(append(&quiet())).await;
    let speech = answer_to(&mut c, "input_2").await;
    assert_eq!(kinds(&speech), ["text", "audio"]);
    assert_eq!(pcm_of(&speech[1]["audio"]).len(), 24000);
    c.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    // A paced worker waits in its calls: it has threads of its own (its backend's and its
    // any-thread calls').
    let paced = Server::ready(Setup::default().workers(workers(10, "step_ms = 1")));
    assert!(threads(&paced) >= n + 20, "{} threads for 10 paced workers, {n} for 1,000 unpaced", threads(&paced));
}
