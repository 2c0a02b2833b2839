//! Backend faults with `isolation = "process"`: a backend that aborts, segfaults, hangs or
//! is killed takes down only its `worker-host` child; the session ends with backend_error
//! and close 1011, everyone else keeps being served, and the worker comes back. Interrupt
//! and force-listen reach a backend in another process; open failures leave that worker
//! failed with its reason while the rest of the pool serves.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

/// A worker entry with its own name, modes and isolation.
fn entry(name: &str, modes: &str, isolation: &str, options: &str) -> String {
    format!(
        "[[workers]]\nname = \"{name}\"\nmodes = {modes}\nisolation = \"{isolation}\"\n[workers.options]\n{options}\n"
    )
}

fn worker<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["workers"].as_array().unwrap().iter().find(|w| w["name"] == name).unwrap()
}

/// Waits until `check` holds for the status, or fails with the last status seen.
fn pid_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The session on the crashing worker ends with backend_error and 1011, the session on
/// the other worker streams on, and the crashed worker serves the next client.
async fn crash_isolated(option: &str, signal: &str) {
    let server =
        Server::ready(
            Setup::default()
                .workers(entry("crashy", "[\"audio\"]", "process", &format!("{option} = 2")))
                .extra(&entry("steady", "[\"video\"]", "process", "")),
        );
    assert_eq!(server.children().len(), 2, "one worker-host per process-isolated worker");
    let mut steady = active(&server, "video").await;
    steady.send(append(&loud())).await;
    answer_to(&mut steady, "input_1").await;

    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await; // step 2 crashes the backend's process
    let closed = c.until("session.closed").await;
    assert_eq!(closed["reason"], "backend_error", "{closed}");
    assert_eq!(c.closed().await, Some(1011));

    // The gateway and the other session are untouched.
    steady.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut steady, "input_2").await), ["listen"]);

    let s = server.wait_status("the crashed worker comes back", WAIT, |s| {
        worker(s, "crashy-0")["state"] == "idle" && worker(s, "crashy-0")["restarts"] == 1
    });
    let error = worker(&s, "crashy-0")["last_error"].as_str().unwrap().to_string();
    assert!(error.contains(&format!("({signal})")), "{error}");
    assert!(server.logs().contains("worker crashy-0: failed: backend process died: killed by signal"));

    let mut next = active(&server, "audio").await;
    next.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut next, "input_1").await), ["listen"]);
    next.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    next.until("session.closed").await;
    steady.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    steady.until("session.closed").await;
    server.wait_idle();
    assert_eq!(server.children().len(), 2, "the dead child was reaped and replaced");
}

#[tokio::test]
async fn a_segfaulting_backend_takes_down_only_its_process() {
    crash_isolated("segv_at_step", "SIGSEGV").await;
}

#[tokio::test]
async fn an_aborting_backend_takes_down_only_its_process() {
    crash_isolated("abort_at_step", "SIGABRT").await;
}

#[tokio::test]
async fn a_hung_backend_process_is_killed_at_the_step_timeout_and_replaced() {
    let server = Server::ready(
        Setup::default()
            .limits("step_timeout_ms = 500")
            .workers(process_workers(1, "hang_at_step = 2\nhang_ms = 600000")),
    );
    let before = server.children();
    assert_eq!(before.len(), 1);
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    assert_eq!(c.closed().await, Some(1011));
    let s = server.wait_status("the worker comes back", WAIT, |s| s["workers"][0]["state"] == "idle");
    assert!(s["workers"][0]["last_error"].as_str().unwrap().contains("step_timeout_ms"), "{s}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_exists(before[0]) {
        assert!(Instant::now() < deadline, "the hung child {} was not killed", before[0]);
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = server.children();
    assert_eq!(after.len(), 1);
    assert_ne!(after, before, "a new child hosts the worker");
    let mut next = active(&server, "audio").await;
    next.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut next, "input_1").await), ["listen"]);
}

#[tokio::test]
async fn a_backend_process_killed_while_idle_is_noticed_and_replaced() {
    let server = Server::ready(Setup::default().workers(process_workers(1, "")));
    let before = server.children();
    assert_eq!(before.len(), 1);
    assert_eq!(server.status()["workers"][0]["process_id"], before[0], "/status names the child");
    let killed = std::process::Command::new("kill").arg("-KILL").arg(before[0].to_string()).status().unwrap();
    assert!(killed.success());
    let s = server.wait_status("the worker restarts", WAIT, |s| {
        s["workers"][0]["restarts"] == 1 && s["workers"][0]["state"] == "idle"
    });
    assert!(s["workers"][0]["last_error"].as_str().unwrap().contains("killed by signal 9 (SIGKILL)"), "{s}");
    let after = server.children();
    assert_eq!(after.len(), 1);
    assert_ne!(after, before);
    assert_eq!(server.status()["workers"][0]["process_id"], after[0]);
    let mut c = active(&server, "video").await;
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
}

#[tokio::test]
async fn force_listen_interrupts_a_step_in_another_process() {
    // Speaking steps take 30 s, longer than this test waits for any event: the listens
    // arrive only because the interrupt and the force-listen crossed the pipe at once.
    let server = Server::ready(
        Setup::default().limits("step_timeout_ms = 120000").workers(process_workers(1, "token_ms = 30000")),
    );
    let mut c = active(&server, "video").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&quiet())).await; // starts speaking (in flight for 30 s)
    c.send(append(&quiet())).await; // pending behind it
    c.send(append_with(&quiet(), json!({"force_listen": true}))).await;
    let events = answer_to(&mut c, "input_4").await;
    let answered: Vec<&str> = events.iter().map(|e| e["input_id"].as_str().unwrap()).collect();
    assert_eq!(answered, ["input_2", "input_3", "input_4"]);
    assert_eq!(kinds(&events), ["listen", "listen", "listen"], "speech after force_listen: {events:?}");
    c.send(append(&quiet())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_5").await), ["listen"], "speech is over");
}

#[tokio::test]
async fn chat_turns_and_a_mid_answer_disconnect_across_the_process_boundary() {
    let server = Server::ready(Setup::default().workers(process_workers(1, "token_ms = 200")));
    let mut c = active(&server, "chat").await;
    c.send(json!({"type": "input.append", "input": {
        "messages": [{"role": "user", "content": "Reply with exactly: one two"}], "streaming": true}}))
        .await;
    let done = c.until("response.done").await;
    assert_eq!(done["text"], "one two");
    // A 40 s answer (200 words, 200 ms each), cut short by the client going away: only a cut
    // that reached the answer (an interrupt across the pipe during a piece, or the worker's
    // own stop between two pieces) frees the worker within wait_idle's 20 s.
    let words: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
    c.send(json!({"type": "input.append", "input": {
        "messages": [{"role": "user", "content": format!("Reply with exactly: {}", words.join(" "))}],
        "streaming": true}}))
        .await;
    c.expect("response.output.delta").await;
    drop(c);
    server.wait_idle();
    let s = server.status();
    assert_eq!(s["workers"][0]["restarts"], 0, "an interrupted answer is not a failure: {s}");
}

#[tokio::test]
async fn open_failures_leave_that_worker_failed_with_its_reason_and_the_rest_serve() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("garbage.so"), b"this is not a shared library").unwrap();
    let libm = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("libm on this machine");
    let library = |name: &str, path: &str| {
        format!("[[workers]]\nname = \"{name}\"\nbackend = \"library\"\nlibrary = \"{path}\"\n")
    };
    let setup = Setup::default()
        .workers(workers(1, ""))
        .extra(&library("garbage", "garbage.so"))
        .extra(&library("nosymbol", libm))
        .extra(&library("wrongabi", env!("OMNI_REFERENCE_LIB_WRONG_ABI")))
        .extra(&library("badoption", env!("OMNI_REFERENCE_LIB")))
        .extra("[workers.options]\nno_such_option = 1\n");
    let server = Server::start_in(setup, dir);
    let s = server.wait_status("the broken workers fail", WAIT, |s| {
        s["workers"].as_array().unwrap().iter().filter(|w| w["state"] == "failed").count() == 4
    });
    let reason = |name: &str| worker(&s, name)["failure"].as_str().unwrap_or_default().to_string();
    assert!(reason("garbage-0").contains("garbage.so: cannot load the library"), "{s}");
    assert!(reason("nosymbol-0").contains("missing symbol omni_backend_abi_version"), "{s}");
    assert!(reason("wrongabi-0").contains("built for backend ABI version 2"), "{s}");
    assert!(reason("badoption-0").contains("unknown option 'no_such_option'"), "{s}");
    assert!(server.logs().contains("worker wrongabi-0:"), "the log names the worker");
    assert_eq!(worker(&s, "sim-0")["state"], "idle");

    // The healthy worker serves.
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
}
