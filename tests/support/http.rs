//! A plain HTTP/1.0 GET for tests that talk to the agent's endpoint from plain
//! threads. Failures panic: the endpoint is expected to answer.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The status line and body of `GET path`, read to the end (5 s bound per read).
pub fn get_with_status(addr: &str, path: &str) -> (String, String) {
    try_get_with_status(addr, path, Duration::from_secs(5)).expect("GET")
}

/// [`get_with_status`] with a bound of its own, for a server that may not
/// listen yet: an error instead of a panic.
pub fn try_get_with_status(
    addr: &str,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(String, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text.lines().next().unwrap_or_default().to_owned();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The body of `GET path`.
pub fn get(addr: &str, path: &str) -> String {
    get_with_status(addr, path).1
}
