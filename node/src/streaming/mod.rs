//! Streaming sessions: `kubectl exec`, `attach` and `port-forward` as the kubelet serves them.
//!
//! A WebSocket client ([`channel`]: the `v5.channel.k8s.io` and `v4.channel.k8s.io` channel
//! protocols, `SPDY/3.1+portforward.k8s.io` (SPDY tunnelled in WebSocket binary messages),
//! and the older `v4.channel.k8s.io` port-forward channels) is bridged ([`bridge`]) to
//! containerd's streaming server, which speaks SPDY ([`spdy`], [`runtime`]). The trick:
//! containerd's WebSocket protocols have no way to half-close stdin, SPDY's FIN does, so
//! `[255, 0]` on the WebSocket becomes a FIN on the runtime's stdin stream and `cat` sees EOF.
//! A SPDY client is passed through to the runtime unchanged ([`proxy`]). Every session is
//! closed once idle for `--streaming-connection-idle-timeout` ([`idle`]).

pub mod bridge;
pub mod channel;
pub mod idle;
pub mod proxy;
pub mod runtime;
pub mod spdy;
