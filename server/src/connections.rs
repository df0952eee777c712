//! The server's open connections, capped in all and per client address, so that one client
//! cannot take every thread (each connection has one); and whether the server still takes new
//! ones (it stops on SIGTERM or SIGINT).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub struct Connections {
    max: usize,
    max_per_address: usize,
    open: Mutex<Open>,
    closed: Condvar,
    stopping: AtomicBool,
}

#[derive(Default)]
struct Open {
    all: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// An admitted connection; counted until dropped.
pub struct Admitted {
    connections: Arc<Connections>,
    address: IpAddr,
}

impl Connections {
    pub fn new(max: usize, max_per_address: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            max_per_address,
            open: Mutex::default(),
            closed: Condvar::new(),
            stopping: AtomicBool::new(false),
        })
    }

    /// Counts a new connection from `address`, or says why it is refused.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Result<Admitted, String> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err("the server is shutting down".into());
        }
        let mut open = self.open.lock().unwrap();
        if open.all >= self.max {
            return Err(format!("the server has its most connections ({})", self.max));
        }
        let from_address = open.by_address.entry(address).or_default();
        if *from_address >= self.max_per_address {
            return Err(format!(
                "{address} has its most connections ({})",
                self.max_per_address
            ));
        }
        *from_address += 1;
        open.all += 1;
        Ok(Admitted {
            connections: self.clone(),
            address,
        })
    }

    /// Takes no new connection from now on.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Waits until every connection has ended, up to `patience`; the connections still open.
    pub fn wait_for_all(&self, patience: Duration) -> usize {
        let open = self.open.lock().unwrap();
        let (open, _) = self
            .closed
            .wait_timeout_while(open, patience, |open| open.all > 0)
            .unwrap();
        open.all
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.connections.open.lock().unwrap();
        open.all -= 1;
        if let Some(count) = open.by_address.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.by_address.remove(&self.address);
            }
        }
        self.connections.closed.notify_all();
    }
}
