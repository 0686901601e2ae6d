//! Fuzzes the frame decoder: any bytes must give frames or errors, never a panic,
//! an abort or an unbounded allocation. Three paths: one frame through the general
//! decoder, a stream of length-prefixed frames, and an `events` body through the
//! live link's decoder (reused buffers and small-binary arena, kept across inputs).
#![no_main]

use leda_net::frame::{MAX_FRAME, decode, decode_stream, encode};
use leda_net::wire::decode_events_live;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // One frame body (type byte + msgpack).
    if let Ok(frame) = decode(data) {
        // Whatever decodes re-encodes.
        let _ = encode(&frame);
    }
    // A byte stream of length-prefixed frames.
    let _ = decode_stream(data, MAX_FRAME);
    // The bytes as an `events` body, as the live link decodes it.
    let _ = decode_events_live(data);
});
