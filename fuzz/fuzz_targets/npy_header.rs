//! `npy::read_header` and `FrameFormat::to_codes` on any bytes: they never panic, and what
//! they return is consistent with the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The crate alone, without the plugin (GStreamer, libtorch) around it.
use qwencodec_npy as npy;

fuzz_target!(|bytes: &[u8]| {
    match npy::read_header(bytes) {
        Ok(npy::HeaderRead::Complete(header)) => {
            assert!(header.data_offset <= bytes.len());
            assert!(header.data_offset <= 12 + npy::MAX_HEADER_LEN);
            assert!(matches!(header.shape.len(), 2 | 3));
            let format = header.format;
            assert!(format.codebooks >= 1 && format.codebooks as u64 <= npy::MAX_CODEBOOKS);
            assert_eq!(header.data_bytes(), header.frames * format.frame_bytes() as u64);
            assert!(!header.format.dtype.to_string().is_empty());
            assert!(!header.shape_string().is_empty());
            let payload = &bytes[header.data_offset..];
            match format.to_codes(payload, 0) {
                Ok(codes) => {
                    assert_eq!(
                        codes.len(),
                        payload.len() / format.frame_bytes() * format.codebooks
                    );
                }
                Err(error) => {
                    assert!(error.value < i16::MIN as i128 || error.value > i16::MAX as i128);
                    assert!(error.codebook < format.codebooks);
                    let _ = error.to_string();
                }
            }
        }
        Ok(npy::HeaderRead::Incomplete { needed }) => {
            assert!(needed > bytes.len());
            assert!(needed <= 12 + npy::MAX_HEADER_LEN);
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
