//! Random identifiers: session ids, the codes token, Janus transactions.

use std::io::Read;

/// `bytes` random bytes in hex, from the kernel's random source.
pub fn random_hex(bytes: usize) -> Result<String, String> {
    let mut random = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut random))
        .map_err(|err| format!("cannot read /dev/urandom: {err}"))?;
    Ok(random.iter().map(|byte| format!("{byte:02x}")).collect())
}
