//! Wake-ups between processes, so nobody polls:
//! - job controller -> operator: a datagram on `<state dir>/operator.sock` after every store
//!   change (the operator then runs a scheduling pass and writes status);
//! - operator -> job controller: SIGUSR1 to the verified pid (a launch slot was granted, a cancel
//!   was requested). Job controllers start with SIGUSR1 blocked and unblock it once their handler
//!   is installed, so an early signal is held, never fatal.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

use crate::state_dir::StateDir;

/// Sends wake-ups to the operator. Failures are ignored: when the operator is down it recounts
/// everything from the store at start.
pub struct OperatorWaker {
    socket: Option<UnixDatagram>,
    path: PathBuf,
}

impl OperatorWaker {
    /// A waker for the operator of `state_dir`.
    pub fn new(state_dir: &StateDir) -> OperatorWaker {
        let socket = UnixDatagram::unbound().ok();
        if let Some(s) = &socket {
            let _ = s.set_nonblocking(true);
        }
        OperatorWaker {
            socket,
            path: state_dir.wake_socket(),
        }
    }

    /// Tells the operator that job `job_id` changed.
    pub fn wake(&self, job_id: i64) {
        if let Some(s) = &self.socket {
            let _ = s.send_to(job_id.to_string().as_bytes(), &self.path);
        }
    }
}
