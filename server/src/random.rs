//! Random identifiers and keys: session ids, the codes token, Janus transactions, SRTP keys.

use std::io::Read;

/// `bytes` random bytes, from the kernel's random source.
pub fn random_bytes(bytes: usize) -> Result<Vec<u8>, String> {
    let mut random = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut random))
        .map_err(|err| format!("cannot read /dev/urandom: {err}"))?;
    Ok(random)
}

/// `bytes` random bytes in hex.
pub fn random_hex(bytes: usize) -> Result<String, String> {
    Ok(random_bytes(bytes)?
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_identifier_is_its_bytes_in_hex_and_another_each_time() {
        let first = random_hex(16).unwrap();
        assert_eq!(first.len(), 32, "{first}");
        assert!(
            first
                .bytes()
                .all(|byte| byte.is_ascii_hexdigit() && !byte.is_ascii_uppercase()),
            "{first}"
        );
        // 128 random bits: equal twice only if the source is not random.
        assert_ne!(random_hex(16).unwrap(), first);
        assert_eq!(random_hex(0).unwrap(), "");
    }
}
