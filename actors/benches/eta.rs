//! How right the queue's wait estimates are: a simulated day of clients (a seeded generator)
//! through the queue's own rules, each waiting client's first estimate (its `session.queued`)
//! set against the wait it then had. Sessions of varied length (log-normal: median 30 s, half
//! of them between 16 and 55 s, one in a hundred over 4 minutes), four workers, arrivals at 95 % of what
//! they serve, the configured typical length (120 s) as the first guess. Prints the ratio of
//! estimate to actual wait (1 is right; 2 promised twice the wait) at p10, p50 and p90, for all
//! waits and for those past the first minute.
//!
//!     cargo bench -p omni-actors --features testing --bench eta
//!
//! It uses only the queue's public rules, so the same file runs against an earlier release
//! (scripts/etabench.sh copies it there): docs/performance.md, "Wait estimates".

use std::time::{Duration, Instant};

use omni_actors::domain::Mode;
use omni_actors::queue::{JoinOutcome, ModeSet, QueueState};

const WORKERS: usize = 4;
const CLIENTS: usize = 20_000;
const MEDIAN_S: f64 = 30.0;
const SIGMA: f64 = 0.9;
const LOAD: f64 = 0.95;
const TYPICAL_S: u64 = 120;

/// xorshift64*: the same day every run.
struct Dice(u64);

impl Dice {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        (-2.0 * self.unit().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.unit()).cos()
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let mut dice = Dice(0x9E37_79B9_7F4A_7C15);
    let typical = Duration::from_secs(TYPICAL_S);
    let mut q = QueueState::new(&[ModeSet::of(&[Mode::Audio]); WORKERS], usize::MAX, [typical; 3]);
    let t0 = Instant::now();
    let at = |s: f64| t0 + Duration::from_secs_f64(s);
    for w in 0..WORKERS {
        q.worker_idle(w, t0);
    }
    let mean_s = MEDIAN_S * (SIGMA * SIGMA / 2.0).exp();
    let gap_s = mean_s / (WORKERS as f64 * LOAD);
    // (end time, worker, length) of the sessions running; (ticket -> joined at, estimate, length).
    let mut running: Vec<(f64, usize, f64)> = Vec::new();
    let mut waiting = std::collections::HashMap::new();
    let mut ratios: Vec<(f64, f64)> = Vec::new();
    let (mut next_arrival, mut arrived) = (0.0, 0);
    loop {
        let next_end = running.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        if arrived == CLIENTS && running.is_empty() {
            break;
        }
        if arrived < CLIENTS && next_arrival <= next_end {
            let now = next_arrival;
            next_arrival += dice.exponential(gap_s);
            arrived += 1;
            let length = MEDIAN_S * (SIGMA * dice.normal()).exp();
            match q.join(Mode::Audio, at(now)) {
                JoinOutcome::Assigned { ticket, worker } => {
                    q.claim(ticket);
                    running.push((now + length, worker, length));
                }
                JoinOutcome::Waiting(info) => {
                    waiting.insert(info.ticket, (now, info.estimated_wait_s, length));
                }
                other => panic!("{other:?}"),
            }
            continue;
        }
        let now = next_end;
        let i = running.iter().position(|r| r.0 == next_end).expect("a session ends");
        let (_, worker, length) = running.swap_remove(i);
        q.session_finished(Mode::Audio, Duration::from_secs_f64(length));
        if let Some(a) = q.worker_idle(worker, at(now)) {
            q.claim(a.ticket);
            let (joined, estimate, length) = waiting.remove(&a.ticket).expect("a waiting ticket");
            let waited = now - joined;
            if waited >= 1.0 {
                ratios.push((waited, estimate / waited));
            }
            running.push((now + length, worker, length));
        }
    }
    let mut all: Vec<f64> = ratios.iter().map(|r| r.1).collect();
    let mut long: Vec<f64> = ratios.iter().filter(|r| r.0 >= 60.0).map(|r| r.1).collect();
    all.sort_by(f64::total_cmp);
    long.sort_by(f64::total_cmp);
    println!(
        "{CLIENTS} clients, {WORKERS} workers, sessions log-normal (median {MEDIAN_S} s, sigma {SIGMA}), load {LOAD}"
    );
    for (name, r) in [("waited 1 s or more", &all), ("waited a minute or more", &long)] {
        let within = r.iter().filter(|x| (0.5..=2.0).contains(*x)).count() as f64 / r.len() as f64;
        println!(
            "{name}: {} clients; estimate / actual: p10 {:.2}, p50 {:.2}, p90 {:.2}; within a factor of 2: {:.0} %",
            r.len(),
            percentile(r, 0.1),
            percentile(r, 0.5),
            percentile(r, 0.9),
            within * 100.0
        );
    }
}
