//! stompgate: a thread-per-core STOMP 1.0/1.1/1.2 gateway onto KubeMQ's five messaging
//! patterns, with an embedded array (or a remote KubeMQ array over gRPC).
//!
//! Rings (ARCHITECTURE.md has the map and the path of one SEND and one MESSAGE):
//! 1. pure protocol — [`stomp`], [`route`], [`model`];
//! 2. session — [`session`], one connection's protocol state machine (frames → actions);
//! 3. the array interface — [`mesh`] (operations and messages), [`delivery`] (slow subscribers),
//!    [`engine`] (one core: `Core::submit`, embedded or remote backend), [`array`] (the embedded
//!    shard), [`egress`] (the remote-array client), [`wire`] (KubeMQ protobuf types);
//! 4. I/O — [`conn`] (a STOMP connection), [`runtime`] (executors, accept), [`grpc`] (the KubeMQ
//!    gRPC API).
pub mod amqp;
pub mod array;
pub mod auth;
pub mod config;
pub mod conn;
pub mod delivery;
pub mod egress;
pub mod engine;
pub mod grpc;
pub mod mesh;
pub mod model;
pub mod route;
pub mod runtime;
pub mod session;
pub mod stomp;
pub mod telemetry;
pub mod tls;
pub mod wire;
pub mod ws;
