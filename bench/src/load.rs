//! A closed-loop load: a fixed number of clients, each sending its next
//! operation as soon as the last one is answered, for a fixed time.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use crate::BoxError;

/// `clients` tasks calling `op(task, n)` until `secs` pass (a call under
/// way at the deadline finishes): operations a second and operations
/// done. The first error of any task ends the load with that error.
pub async fn closed_loop<F, Fut>(clients: u64, secs: f64, op: F) -> Result<(f64, u64), BoxError>
where
    F: Fn(u64, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send,
{
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut done = 0;
                while Instant::now() < deadline {
                    op(task, done).await?;
                    done += 1;
                }
                Ok::<_, BoxError>(done)
            })
        })
        .collect();
    let mut done = 0;
    for task in tasks {
        done += task.await??;
    }
    Ok((done as f64 / started.elapsed().as_secs_f64(), done))
}
