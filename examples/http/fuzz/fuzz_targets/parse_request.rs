//! Fuzzes request parsing: any bytes must give a request, "need more" or an error
//! status, never a panic; parsed paths go through percent-decoding.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    leda_http::request::fuzz_parse(data);
});
