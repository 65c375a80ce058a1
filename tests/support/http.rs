//! A plain HTTP/1.0 GET for tests that talk to the agent's endpoint from plain
//! threads. Failures panic: the endpoint is expected to answer.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The status line and body of `GET path`, read to the end (5 s bound per read).
pub fn get_with_status(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("set a read timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send the request");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the answer");
    let status = text.lines().next().unwrap_or_default().to_owned();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The body of `GET path`.
pub fn get(addr: &str, path: &str) -> String {
    get_with_status(addr, path).1
}
