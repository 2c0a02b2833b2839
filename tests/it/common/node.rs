//! A node (`omni-gateway node`) on a free loopback port, for the tests of workers on other
//! machines. Its log is printed when the test using it fails.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::WAIT;

/// The token of every test node.
pub(crate) const NODE_TOKEN: &str = "Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=";

pub(crate) struct Node {
    child: Child,
    pub addr: SocketAddr,
    logs: Arc<Mutex<String>>,
    dir: tempfile::TempDir,
}

impl Node {
    /// A node serving `workers` (`[[workers]]` entries) with `[node]` lines `node` added to
    /// its bind and token; `bind` is a free port unless `node` names one.
    pub(crate) fn start(workers: &str, node: &str) -> Node {
        Node::start_in(tempfile::tempdir().unwrap(), workers, node)
    }

    pub(crate) fn start_in(dir: tempfile::TempDir, workers: &str, node: &str) -> Node {
        Node::launch(dir, workers, node, None)
    }

    /// [`Node::start`] under an open-file limit (soft, hard), as a service manager sets one.
    pub(crate) fn start_with_open_files(workers: &str, node: &str, soft: u64, hard: u64) -> Node {
        Node::launch(tempfile::tempdir().unwrap(), workers, node, Some((soft, hard)))
    }

    fn launch(dir: tempfile::TempDir, workers: &str, node: &str, open_files: Option<(u64, u64)>) -> Node {
        use std::os::unix::process::CommandExt;
        let bind = if node.contains("bind") { String::new() } else { "bind = \"127.0.0.1:0\"\n".to_string() };
        let token = if node.contains("token") { String::new() } else { format!("token = \"{NODE_TOKEN}\"\n") };
        let config = format!("[node]\n{bind}{token}{node}\n{workers}\n");
        let path = dir.path().join("node.toml");
        std::fs::write(&path, config).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_omni-gateway"));
        command.arg("--config").arg(&path).arg("node").env("RUST_LOG", "debug");
        if let Some((soft, hard)) = open_files {
            // SAFETY: between fork and exec, only setrlimit (async-signal-safe) runs.
            unsafe {
                command.pre_exec(move || rlimit::setrlimit(rlimit::Resource::NOFILE, soft, hard));
            }
        }
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start omni-gateway node");
        let logs = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("omni-gateway node listening on ") {
                    let _ = tx.send(addr.trim().parse::<SocketAddr>().unwrap());
                }
            }
        });
        let addr = match rx.recv_timeout(WAIT) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("the node did not start:\n{}", logs.lock().unwrap());
            }
        };
        Node { child, addr, logs, dir }
    }

    /// The `[[nodes]]` entry of a gateway that uses this node, named `name`.
    pub(crate) fn entry(&self, name: &str, extra: &str) -> String {
        format!("[[nodes]]\nname = \"{name}\"\naddress = \"{}\"\ntoken = \"{NODE_TOKEN}\"\n{extra}\n", self.addr)
    }

    pub(crate) fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`KILL`, `STOP`, `CONT`, `TERM`) to the node.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill -{name}");
    }

    /// Kills the node and waits for it; its directory is kept for a restart.
    pub(crate) fn kill(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }

    /// Waits until the node's log contains `needle`.
    pub(crate) fn wait_log(&self, needle: &str, within: Duration) {
        self.wait_log_count(needle, 1, within);
    }

    /// Waits until the node's log says `needle` `count` times.
    pub(crate) fn wait_log_count(&self, needle: &str, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.logs().matches(needle).count() < count {
            assert!(Instant::now() < deadline, "the node's log never said {needle:?} {count} times:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-CONT").arg(self.child.id().to_string()).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- node log ----\n{}", self.logs());
        }
    }
}
