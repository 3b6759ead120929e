//! SMB2 acceleration for wsx.
//!
//! This crate will hold SMB 2.0.2/2.1 wire parsing (headers, CREATE, QUERY_INFO, READ, CLOSE) in
//! the `Packet`/`Repr` style, and the read-ahead engine that, when a client opens a file, predicts
//! the requests that follow so that the far gateway can issue them early and the near gateway can
//! answer locally. It performs no I/O. Nothing is implemented yet; see the project's issue tracker.
