//! What the server takes from anyone, parsed and checked without GStreamer or the network: the
//! browsers' and TTS senders' messages ([`messages`]) and the browsers' join tokens ([`token`]).
//! A crate of its own so that the fuzz targets (`fuzz/`) build it as the server does.

pub mod messages;
pub mod token;
