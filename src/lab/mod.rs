//! The network lab: a user-space path emulator between two network namespaces, the benchmark
//! that compares HTTP/3 servers through it, and a CI smoke test. Linux only, needs root.

pub mod emu;
pub mod packet;
pub mod topology;
