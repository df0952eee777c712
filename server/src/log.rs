//! The server's log: lines on stdout, each named as the server's.

/// A line in the server's log.
macro_rules! log {
    ($($arg:tt)*) => { println!("qwencodec-server: {}", format!($($arg)*)) };
}

pub(crate) use log;
