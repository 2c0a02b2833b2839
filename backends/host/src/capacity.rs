//! What this host allows, against what a configuration asks of it: a worker with a thread of
//! its own costs memory mappings (each thread has a stack, a signal stack and a guard page
//! for each) and a task. Past `vm.max_map_count` the process aborts while opening workers
//! and past the tasks its cgroup allows (systemd's `TasksMax`) a thread cannot start, so
//! both are checked before anything opens, by the server, the node and `check-config` alike.
//! Workers whose calls are quick (unpaced reference workers: their BackendActor runs them) cost
//! neither.

use std::path::Path;

use crate::workers::WorkerSpec;

/// Threads a worker with threads of its own runs in this process, at most: its backend's and the
/// one that makes its any-thread calls (a MiniCPM-o worker has only the first; a node's worker
/// has one).
pub const THREADS_PER_WORKER: usize = 2;
/// Memory mappings per thread, measured (1,000 paced reference workers: 8,020 more mappings).
pub const MAPPINGS_PER_THREAD: usize = 4;
/// Mappings for everything else: the binary and its libraries, malloc's arenas, large buffers.
pub const HEADROOM: usize = 2_000;
/// Tasks for everything else: the runtime's threads and the helpers'.
pub const TASK_HEADROOM: usize = 64;

/// What the workers need of the host, and what it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNeeds {
    /// Workers with threads of their own.
    pub own_threads: usize,
    pub mappings: usize,
    pub tasks: usize,
}

impl HostNeeds {
    pub fn of(workers: &[WorkerSpec], inline: bool) -> HostNeeds {
        let own_threads = workers.iter().filter(|w| !(inline && crate::runs_inline(w))).count();
        let threads = own_threads * THREADS_PER_WORKER;
        HostNeeds { own_threads, mappings: threads * MAPPINGS_PER_THREAD + HEADROOM, tasks: threads + TASK_HEADROOM }
    }

    /// Refuses what the limits cannot hold, saying which limit and how to raise it.
    pub fn check(&self, max_map_count: Option<usize>, max_tasks: Option<usize>) -> Result<(), HostLimit> {
        if let Some(max) = max_map_count
            && self.mappings > max
        {
            return Err(HostLimit::Mappings { workers: self.own_threads, mappings: self.mappings, max });
        }
        if let Some(max) = max_tasks
            && self.tasks > max
        {
            return Err(HostLimit::Tasks { workers: self.own_threads, tasks: self.tasks, max });
        }
        Ok(())
    }
}

/// A limit of this host the workers would pass, and how to raise it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostLimit {
    /// More memory mappings than `vm.max_map_count`.
    #[error(
        "workers: {workers} workers with threads of their own need about {mappings} memory mappings ({per_worker} per \
         worker: {THREADS_PER_WORKER} threads, each with a stack, a signal stack and their guard pages), and this host \
         allows vm.max_map_count = {max}. Raise it (sysctl -w vm.max_map_count={raise}) or run fewer workers \
         (unpaced reference workers need none: they have no thread)",
        per_worker = THREADS_PER_WORKER * MAPPINGS_PER_THREAD,
        raise = mappings.next_power_of_two()
    )]
    Mappings { workers: usize, mappings: usize, max: usize },
    /// More threads than the process's cgroup allows.
    #[error(
        "workers: {workers} workers with threads of their own need about {tasks} threads, and this process may run \
         {max} (its cgroup's pids.max: TasksMax= in a systemd unit, pids_limit in compose). Raise it or run fewer \
         workers"
    )]
    Tasks { workers: usize, tasks: usize, max: usize },
}

/// The configured workers against this host's limits. `inline`: quick workers run on their
/// BackendActor's arbiter (a gateway); a node gives every worker its threads.
pub fn check(workers: &[WorkerSpec], inline: bool) -> Result<(), HostLimit> {
    HostNeeds::of(workers, inline).check(max_map_count(), max_tasks())
}

fn read_number(path: &Path) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn max_map_count() -> Option<usize> {
    read_number(Path::new("/proc/sys/vm/max_map_count"))
}

/// The tasks this process's cgroup (v2) may run, when it is limited.
fn max_tasks() -> Option<usize> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    read_number(&Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')).join("pids.max"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(own_threads: usize) -> HostNeeds {
        let threads = own_threads * THREADS_PER_WORKER;
        HostNeeds { own_threads, mappings: threads * MAPPINGS_PER_THREAD + HEADROOM, tasks: threads + TASK_HEADROOM }
    }

    #[test]
    fn workers_past_the_mapping_limit_are_refused_with_the_limit_named() {
        assert_eq!(needs(7_000).check(Some(65_530), None), Ok(()));
        let e = needs(10_000).check(Some(65_530), None).unwrap_err().to_string();
        assert!(e.contains("10000 workers") && e.contains("82000 memory mappings"), "{e}");
        assert!(e.contains("vm.max_map_count = 65530") && e.contains("sysctl -w vm.max_map_count=131072"), "{e}");
    }

    #[test]
    fn workers_past_the_cgroup_task_limit_are_refused() {
        assert_eq!(needs(1_000).check(None, Some(15_000)), Ok(()));
        let e = needs(7_000).check(None, Some(14_000)).unwrap_err().to_string();
        assert!(e.contains("14064 threads") && e.contains("pids.max"), "{e}");
        // A small cgroup holds a gateway whose workers have no thread of their own.
        assert_eq!(needs(0).check(None, Some(100)), Ok(()));
    }

    #[test]
    fn limits_the_host_does_not_say_are_not_checked() {
        assert_eq!(needs(1_000_000).check(None, None), Ok(()));
    }
}
