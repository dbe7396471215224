//! stompgate: a thread-per-core STOMP 1.0/1.1/1.2 gateway onto KubeMQ's five messaging
//! patterns, with an embedded array (or a remote KubeMQ array over gRPC).
//!
//! Rings (see `../shared/design.md`):
//! 1. pure protocol — [`stomp`], [`route`], [`model`];
//! 2. session — [`session`], one connection's protocol state machine;
//! 3. per-core I/O — [`runtime`], [`conn`], [`array`];
//! 4. the KubeMQ gRPC API — [`grpc`] (served) and [`egress`] (remote array client), both
//!    speaking the shared wire types of [`wire`].
pub mod array;
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
pub mod wire;
