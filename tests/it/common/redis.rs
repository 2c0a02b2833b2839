//! A Redis server (Debian's `redis-server`) on a free loopback port, for the cluster tests:
//! no persistence, its own directory, killed with the test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::WAIT;

pub(crate) struct Redis {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Redis {
    pub(crate) fn start() -> Redis {
        Redis::start_on(free_port(), tempfile::tempdir().unwrap(), &[])
    }

    /// Redis answering TLS on a port of its own too (returned), with the certificate and key
    /// in PEM files `cert` and `key` (clients are not asked for certificates).
    pub(crate) fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> (Redis, u16) {
        let tls_port = free_port();
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let extra = [
            "--tls-port".to_string(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            cert.clone(),
            "--tls-key-file".into(),
            key,
            "--tls-ca-cert-file".into(),
            cert,
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        (Redis::start_on(free_port(), tempfile::tempdir().unwrap(), &extra), tls_port)
    }

    /// A replica of `master`, its copy in sync before this returns.
    pub(crate) fn replica_of(master: &Redis) -> Redis {
        let of = ["--replicaof".to_string(), "127.0.0.1".into(), master.port.to_string()];
        let replica = Redis::start_on(free_port(), tempfile::tempdir().unwrap(), &of);
        let deadline = Instant::now() + WAIT;
        while !replica.command("INFO replication").is_some_and(|i| i.contains("master_link_status:up")) {
            assert!(Instant::now() < deadline, "the replica on port {} never synced", replica.port);
            std::thread::sleep(Duration::from_millis(20));
        }
        replica
    }

    fn start_on(port: u16, dir: tempfile::TempDir, extra: &[String]) -> Redis {
        let port_arg = port.to_string();
        let dir_arg = dir.path().to_string_lossy().to_string();
        let mut args = vec!["--port", &port_arg, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
        args.extend(extra.iter().map(String::as_str));
        args.extend(["--dir", &dir_arg]);
        let redis = Redis { child: spawn(&args), port, dir };
        let deadline = Instant::now() + WAIT;
        while !redis.ping() {
            assert!(Instant::now() < deadline, "redis-server did not answer on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// One command in Redis's inline syntax; its raw answer.
    pub(crate) fn command(&self, line: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        s.write_all(format!("{line}\r\n").as_bytes()).ok()?;
        let mut buf = [0u8; 65536];
        let n = s.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).to_string())
    }

    pub(crate) fn ping(&self) -> bool {
        self.command("PING").is_some_and(|a| a.starts_with("+PONG"))
    }

    /// Sends a signal (`STOP`, `CONT`, ...) to redis-server.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill -{name}");
    }

    /// Kills redis-server (everything in it is lost: no persistence) and starts a new one
    /// on the same port.
    pub(crate) fn restart(mut self) -> Redis {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let port = self.port;
        drop(self);
        Redis::start_on(port, dir, &[])
    }
}

/// `redis-server` with `args`, its output dropped.
fn spawn(args: &[&str]) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A Redis Sentinel (`redis-server --sentinel`) alone in watching `master` under `name`, behind
/// `password`: it declares the master down after 500 ms and promotes a replica at once (quorum 1).
pub(crate) struct Sentinel {
    server: Redis,
}

impl Sentinel {
    pub(crate) fn start(name: &str, master: &Redis, password: &str) -> Sentinel {
        let port = free_port();
        Sentinel::launch(
            port,
            &format!(
                "port {port}\nbind 127.0.0.1\nrequirepass {password}\nsentinel monitor {name} 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds {name} 500\nsentinel failover-timeout {name} 5000\n",
                master.port
            ),
        )
    }

    /// A Sentinel with configuration `conf`, once it answers on `port`.
    fn launch(port: u16, conf: &str) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, conf).unwrap();
        let server = Redis { child: spawn(&[&path.to_string_lossy(), "--sentinel"]), port, dir };
        let deadline = Instant::now() + WAIT;
        // Answered (-NOAUTH without the password): it is up.
        while server.command("PING").is_none_or(|a| a.is_empty()) {
            assert!(Instant::now() < deadline, "the Sentinel did not answer on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Sentinel { server }
    }

    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.server.port)
    }

    /// A Sentinel as [`Sentinel::start`], answering TLS on a port of its own too (returned), with
    /// the certificate `cert` and `key`, watching `master` on its TLS port `master_tls` (it reaches
    /// the master over TLS too).
    pub(crate) fn start_tls(
        name: &str,
        master_tls: u16,
        password: &str,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> (Sentinel, u16) {
        let (port, tls_port) = (free_port(), free_port());
        let (cert, key) = (cert.display(), key.display());
        let sentinel = Sentinel::launch(
            port,
            &format!(
                "port {port}\ntls-port {tls_port}\nbind 127.0.0.1\nrequirepass {password}\n\
                 tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {cert}\ntls-auth-clients no\n\
                 tls-replication yes\nsentinel monitor {name} 127.0.0.1 {master_tls} 1\n"
            ),
        );
        (sentinel, tls_port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-CONT").arg(self.child.id().to_string()).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
