//! The array interface's vocabulary: the one closed set of messages cores exchange
//! ([`msg::CoreMsg`]) with the ids they carry, and [`handle::ArrayHandle`], the way in for
//! threads outside the cores (the gRPC server, the egress threads, tests), with
//! [`confirm::Confirmer`], how those threads await the cores' `Done`s. Data only: nothing here
//! runs a task or owns a socket.
pub mod confirm;
pub mod handle;
pub mod msg;
pub mod op;
pub mod topology;
