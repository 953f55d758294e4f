//! Streaming sessions: `kubectl exec`, `attach` and `port-forward` as the kubelet serves them.
//!
//! The client side arrives as a WebSocket ([`channel`]: the `v5.channel.k8s.io` and
//! `v4.channel.k8s.io` channel protocols, and `SPDY/3.1+portforward.k8s.io`, SPDY tunnelled in
//! WebSocket binary messages); the runtime side is containerd's streaming server, which
//! speaks SPDY ([`spdy`], [`runtime`]). The kubelet bridges the two ([`bridge`]). The trick:
//! containerd's WebSocket protocols have no way to half-close stdin, SPDY's FIN does, so
//! `[255, 0]` on the WebSocket becomes a FIN on the runtime's stdin stream and `cat` sees EOF.

pub mod bridge;
pub mod channel;
pub mod runtime;
pub mod spdy;
