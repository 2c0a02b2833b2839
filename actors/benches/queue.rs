//! The queue's rules at 10,000 waiting tickets: joining, taking the head (every ticket
//! behind it moves up: their positions and ETAs are recomputed), and the periodic update.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use omni_actors::domain::Mode;
use omni_actors::queue::{JoinOutcome, ModeSet, QueueState};

const TICKETS: usize = 10_000;

/// One busy worker and `TICKETS` clients waiting behind it, modes mixed.
fn full_queue() -> QueueState {
    let all = ModeSet::of(&Mode::ALL);
    let mut q = QueueState::new(
        &[all],
        TICKETS + 1,
        [Duration::from_secs(60), Duration::from_secs(300), Duration::from_secs(600)],
    );
    let now = Instant::now();
    q.worker_idle(0, now);
    q.join(Mode::Video, now);
    for i in 0..TICKETS {
        let mode = Mode::ALL[i % 3];
        assert!(matches!(q.join(mode, now), JoinOutcome::Waiting(_)));
    }
    q
}

fn queue(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue at 10k");
    group.bench_function("enqueue 10000 tickets", |b| b.iter(|| black_box(full_queue().len())));
    group.bench_function("dequeue the head and update the 9999 behind it", |b| {
        b.iter_batched(
            full_queue,
            |mut q| {
                let now = Instant::now();
                let a = q.worker_idle(0, now).expect("a ticket waits");
                black_box(q.infos_from(a.index, now).len())
            },
            BatchSize::LargeInput,
        )
    });
    let q = full_queue();
    group.bench_function("periodic update of 10000 positions and ETAs", |b| {
        b.iter(|| black_box(q.infos_from(0, Instant::now()).len()))
    });
    let mut q = full_queue();
    group.bench_function("a client joins behind 10000 and leaves", |b| {
        b.iter(|| {
            let JoinOutcome::Waiting(info) = q.join(Mode::Audio, Instant::now()) else { unreachable!() };
            black_box(q.leave(info.ticket))
        })
    });
    group.finish();
}

criterion_group!(benches, queue);
criterion_main!(benches);
