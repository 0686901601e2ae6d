//! Fuzzes the frame decoder: any bytes must give frames or errors, never a panic,
//! an abort or an unbounded allocation.
#![no_main]

use leda_net::frame::{MAX_FRAME, decode, decode_stream, encode};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // One frame body (type byte + msgpack).
    if let Ok(frame) = decode(data) {
        // Whatever decodes re-encodes.
        let _ = encode(&frame);
    }
    // A byte stream of length-prefixed frames.
    let _ = decode_stream(data, MAX_FRAME);
});
