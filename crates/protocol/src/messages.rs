//! What the server's two WebSocket endpoints take, parsed and checked: the browsers' signalling
//! messages (`/signal`) and the TTS senders' messages (`/codes`). Free of GStreamer and of the
//! network, so that the fuzz targets (`fuzz/`) build it as it is.
//!
//! A browser's SDP answer and ICE candidates are checked here, before webrtcbin (libgstsdp,
//! libnice) parses them: a crash there would end every session of the server, and a peer
//! need not be anyone to send them.

use std::fmt;
use std::net::IpAddr;

use serde::Deserialize;

/// A browser's message on `/signal` (JSON text).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum FromBrowser {
    /// With the join token that the application's backend signed (see `token`), when the
    /// server takes them.
    Join {
        #[serde(default)]
        token: Option<String>,
    },
    Answer {
        sdp: String,
    },
    Ice {
        candidate: String,
        #[serde(rename = "sdpMLineIndex")]
        mline_index: u32,
    },
}

/// A sender's text message on `/codes` (its binary messages are frames, see [`FrameLayout`]).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
// Variants with braces: serde lets unknown fields pass beside a unit variant's tag.
pub enum FromSender {
    /// The utterance so far is complete.
    End {},
    /// Barge-in: drop what is queued and not yet heard.
    Cancel {},
}

/// A signalling message, its SDP and ICE candidate checked (see [`check_answer_sdp`],
/// [`check_ice_candidate`]): [`read_browser_message`] and then [`FromBrowser::check`].
pub fn browser_message(text: &str) -> Result<FromBrowser, String> {
    let message = read_browser_message(text)?;
    message.check()?;
    Ok(message)
}

/// A signalling message's type and fields, its SDP and ICE candidate not yet checked: the
/// server first asks whether the message is one it takes now (an answer before the join is
/// refused as such, whatever its SDP), then checks what it carries.
pub fn read_browser_message(text: &str) -> Result<FromBrowser, String> {
    serde_json::from_str(text).map_err(|err| format!("malformed signalling message: {err}"))
}

impl FromBrowser {
    /// Whether what the message carries is taken: an answer's SDP, a candidate and its media
    /// section.
    pub fn check(&self) -> Result<(), String> {
        let checked = match self {
            FromBrowser::Join { .. } => Ok(()),
            FromBrowser::Answer { sdp } => check_answer_sdp(sdp),
            // An empty candidate is the browser's end of candidates.
            FromBrowser::Ice { candidate, .. } if candidate.is_empty() => Ok(()),
            FromBrowser::Ice {
                candidate,
                mline_index,
            } if *mline_index < MEDIA_SECTIONS => check_ice_candidate(candidate),
            FromBrowser::Ice { mline_index, .. } => Err(format!(
                "sdpMLineIndex {mline_index}: the offer has {MEDIA_SECTIONS} media section"
            )),
        };
        checked.map_err(|err| format!("malformed signalling message: {err}"))
    }
}

/// The media sections of the server's offer (the speech): an answer has as many.
pub const MEDIA_SECTIONS: u32 = 1;
/// The longest SDP answer taken: a browser's is 1-3 kB, with every candidate of a host with
/// many interfaces a few more.
pub const MAX_SDP_BYTES: usize = 32 * 1024;
/// The longest ICE candidate taken: a browser's is 100-250 bytes.
pub const MAX_CANDIDATE_BYTES: usize = 512;

/// Whether `sdp` is an SDP answer as a browser writes one (RFC 8866): at most
/// [`MAX_SDP_BYTES`], printable ASCII lines of `x=value` (CRLF or LF), `v=0` first, as many
/// media sections (`m=`) as the offer has, and every `a=candidate:` a candidate as
/// [`check_ice_candidate`] takes it. What it says is webrtcbin's to judge.
pub fn check_answer_sdp(sdp: &str) -> Result<(), String> {
    if sdp.len() > MAX_SDP_BYTES {
        return Err(format!("the SDP is over {MAX_SDP_BYTES} bytes"));
    }
    let lines = sdp.strip_suffix('\n').unwrap_or(sdp).split('\n');
    let mut media = 0;
    for (number, line) in lines.enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let at = number + 1;
        let bytes = line.as_bytes();
        if bytes.len() < 2 || !bytes[0].is_ascii_lowercase() || bytes[1] != b'=' {
            return Err(format!("SDP line {at} is not x=value"));
        }
        if !bytes
            .iter()
            .all(|&byte| byte == b'\t' || (b' '..=b'~').contains(&byte))
        {
            return Err(format!("SDP line {at} holds a byte that is not printable ASCII"));
        }
        if number == 0 && line != "v=0" {
            return Err("the SDP does not start with v=0".into());
        }
        if line.starts_with("m=") {
            media += 1;
        }
        if let Some(candidate) = line.strip_prefix("a=")
            && candidate.starts_with("candidate:")
        {
            check_ice_candidate(candidate).map_err(|err| format!("SDP line {at}: {err}"))?;
        }
    }
    if media != MEDIA_SECTIONS {
        return Err(format!(
            "the SDP has {media} media sections, the offer {MEDIA_SECTIONS}"
        ));
    }
    Ok(())
}

/// Whether `candidate` is an ICE candidate attribute (RFC 8839 5.1) as browsers write one:
///
/// ```text
/// candidate:<foundation> <component> <transport> <priority> <address> <port> typ <type>
///     [raddr <address> rport <port>] *(<name> <value>)
/// ```
///
/// with a foundation of 1-32 letters, digits, `+` and `/`; a component of 1-5 digits; a
/// transport token (`udp`, `tcp`); a 32-bit priority; an address that is an IP address or a
/// host name (a browser hides its own behind an mDNS `.local` name); a port; a type of host,
/// srflx, prflx or relay; and the extensions (`generation 0`, `tcptype active`) as pairs of
/// printable words. At most [`MAX_CANDIDATE_BYTES`].
pub fn check_ice_candidate(candidate: &str) -> Result<(), String> {
    if candidate.len() > MAX_CANDIDATE_BYTES {
        return Err(format!("the ICE candidate is over {MAX_CANDIDATE_BYTES} bytes"));
    }
    let Some(attribute) = candidate.strip_prefix("candidate:") else {
        return Err("the ICE candidate does not start with candidate:".into());
    };
    let fields: Vec<&str> = attribute.split(' ').collect();
    let [
        foundation,
        component,
        transport,
        priority,
        address,
        port,
        typ,
        kind,
        extensions @ ..,
    ] = fields.as_slice()
    else {
        return Err("the ICE candidate has fewer than 8 fields".into());
    };
    let field_error = |name: &str| Err(format!("the ICE candidate's {name} is malformed"));
    if !(1..=32).contains(&foundation.len())
        || !foundation
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'+' || byte == b'/')
    {
        return field_error("foundation");
    }
    if !is_number(component, 5) || component.parse::<u32>() == Ok(0) {
        return field_error("component");
    }
    if !(1..=16).contains(&transport.len())
        || !transport
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
    {
        return field_error("transport");
    }
    if !is_number(priority, 10) || priority.parse::<u32>().is_err() {
        return field_error("priority");
    }
    if !is_connection_address(address) {
        return field_error("address");
    }
    if !is_port(port) {
        return field_error("port");
    }
    if *typ != "typ" || !matches!(*kind, "host" | "srflx" | "prflx" | "relay") {
        return field_error("type");
    }
    if extensions.len() % 2 != 0 {
        return Err("the ICE candidate's extensions are not name value pairs".into());
    }
    for pair in extensions.chunks_exact(2) {
        let (name, value) = (pair[0], pair[1]);
        let word = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_graphic());
        if !word(name) || !word(value) {
            return field_error("extension");
        }
        match name {
            "raddr" if !is_connection_address(value) => return field_error("raddr"),
            "rport" if !is_port(value) => return field_error("rport"),
            _ => (),
        }
    }
    Ok(())
}

/// 1 to `digits` decimal digits.
fn is_number(text: &str, digits: usize) -> bool {
    (1..=digits).contains(&text.len()) && text.bytes().all(|byte| byte.is_ascii_digit())
}

fn is_port(text: &str) -> bool {
    is_number(text, 5) && text.parse::<u16>().is_ok()
}

/// An IP address, or a host name of letters, digits, `-` and `.` (RFC 1035's 253 at most).
fn is_connection_address(text: &str) -> bool {
    text.parse::<IpAddr>().is_ok()
        || ((1..=253).contains(&text.len())
            && text
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'.'))
}

pub fn sender_message(text: &str) -> Result<FromSender, String> {
    serde_json::from_str(text).map_err(|err| format!("malformed message: {err}"))
}

/// The codec frames the model takes: `codebooks` little-endian int16 codes each, every code in
/// `0..codebook_size`.
#[derive(Debug, Clone, Copy)]
pub struct FrameLayout {
    pub codebooks: usize,
    pub codebook_size: usize,
}

/// Why a binary message is not frames the model takes.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    NotWholeFrames {
        bytes: usize,
        frame_bytes: usize,
        codebooks: usize,
    },
    OutsideCodebook {
        frame: usize,
        codebook: usize,
        code: i16,
        codebook_size: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::NotWholeFrames {
                bytes,
                frame_bytes,
                codebooks,
            } => write!(
                f,
                "not whole frames: {bytes} bytes, a frame is {frame_bytes} ({codebooks} codes of 2 bytes)"
            ),
            FrameError::OutsideCodebook {
                frame,
                codebook,
                code,
                codebook_size,
            } => write!(
                f,
                "frame {frame}, codebook {codebook}: code {code} is outside 0..{codebook_size}"
            ),
        }
    }
}

impl FrameLayout {
    pub fn frame_bytes(&self) -> usize {
        2 * self.codebooks
    }

    /// The number of frames in `bytes`, if they are whole frames of valid codes.
    pub fn check(&self, bytes: &[u8]) -> Result<usize, FrameError> {
        let frame_bytes = self.frame_bytes();
        if bytes.is_empty() || !bytes.len().is_multiple_of(frame_bytes) {
            return Err(FrameError::NotWholeFrames {
                bytes: bytes.len(),
                frame_bytes,
                codebooks: self.codebooks,
            });
        }
        for (at, pair) in bytes.chunks_exact(2).enumerate() {
            let code = i16::from_le_bytes([pair[0], pair[1]]);
            if code < 0 || code as usize >= self.codebook_size {
                return Err(FrameError::OutsideCodebook {
                    frame: at / self.codebooks,
                    codebook: at % self.codebooks,
                    code,
                    codebook_size: self.codebook_size,
                });
            }
        }
        Ok(bytes.len() / frame_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as Chromium writes one to the server's offer (its fingerprint shortened).
    const ANSWER: &str = "v=0\r\no=- 4215775240449105457 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n\
        a=group:BUNDLE audio0\r\na=extmap-allow-mixed\r\na=msid-semantic: WMS\r\n\
        m=audio 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=rtcp:9 IN IP4 0.0.0.0\r\n\
        a=ice-ufrag:Gm2W\r\na=ice-pwd:k1Z4CnUyl0yV3t0TrM2vCtb2\r\na=ice-options:trickle\r\n\
        a=fingerprint:sha-256 6B:8B:F0:65:5F:78:E2:51:3B:AC:6F:F3:3F:46:1B:35\r\n\
        a=setup:active\r\na=mid:audio0\r\na=recvonly\r\na=rtcp-mux\r\n\
        a=rtpmap:96 OPUS/48000/2\r\na=fmtp:96 minptime=10;useinbandfec=1\r\n";

    #[test]
    fn browsers_answers_and_candidates_are_taken() {
        check_answer_sdp(ANSWER).unwrap();
        check_answer_sdp(&ANSWER.replace("\r\n", "\n")).unwrap();
        let with_candidate = format!(
            "{ANSWER}a=candidate:1 1 UDP 2122252543 198.51.100.2 49761 typ host\r\na=end-of-candidates\r\n"
        );
        check_answer_sdp(&with_candidate).unwrap();
        for candidate in [
            // Chromium: host, mDNS-hidden host, srflx, TCP
            "candidate:842163049 1 udp 2122260223 127.0.0.1 51934 typ host generation 0 ufrag Gm2W network-id 1",
            "candidate:3019632134 1 udp 2122262783 5c1b4b1e-7a6f-4c83-9c9e-1d2a3b4c5d6e.local 56789 typ host generation 0 network-cost 999",
            "candidate:1467250027 1 udp 1686052607 203.0.113.9 41234 typ srflx raddr 10.0.0.5 rport 41234 generation 0",
            "candidate:2 1 TCP 2105524479 2001:db8::2 9 typ host tcptype active",
            // aiortc: an MD5 foundation
            "candidate:0d7a2a5e9f8b6c4d3e2f1a0b9c8d7e6f 1 udp 1694498815 198.51.100.7 5000 typ relay raddr 0.0.0.0 rport 0",
        ] {
            assert_eq!(check_ice_candidate(candidate), Ok(()), "{candidate}");
        }
        let ice = r#"{"type":"ice","candidate":"candidate:2 1 UDP 2122252543 198.51.100.2 49761 typ host","sdpMLineIndex":0}"#;
        assert!(matches!(browser_message(ice), Ok(FromBrowser::Ice { .. })));
        let end = r#"{"type":"ice","candidate":"","sdpMLineIndex":0}"#;
        assert!(matches!(browser_message(end), Ok(FromBrowser::Ice { .. })));
    }

    #[test]
    fn answers_that_are_not_sdp_as_browsers_write_it_are_refused() {
        let two_media = ANSWER.replace(
            "a=rtcp-mux\r\n",
            "a=rtcp-mux\r\nm=video 9 UDP/TLS/RTP/SAVPF 97\r\n",
        );
        let cases = [
            (String::new(), "not x=value"),
            ("hello".to_owned(), "not x=value"),
            (ANSWER.replacen("v=0", "v=1", 1), "v=0"),
            (ANSWER.replace("s=-", "S=-"), "line 3 is not x=value"),
            (ANSWER.replace("s=-", "s=\u{7}"), "printable ASCII"),
            (ANSWER.replace("s=-", "s=caf\u{e9}"), "printable ASCII"),
            (ANSWER.replace("\r\n", "\r\n\r\n"), "not x=value"),
            (
                ANSWER.replace("a=mid:audio0", "a=mid:audio0\0"),
                "printable ASCII",
            ),
            (ANSWER.replace("m=audio", "a=audio"), "0 media sections"),
            (two_media, "2 media sections"),
            (
                format!("{ANSWER}a=candidate:1 1 UDP 1 x y typ host\r\n"),
                "SDP line 21: the ICE candidate's port",
            ),
            (
                format!("{ANSWER}a={}\r\n", "x".repeat(MAX_SDP_BYTES)),
                "over 32768 bytes",
            ),
        ];
        for (sdp, reason) in cases {
            let err = check_answer_sdp(&sdp).unwrap_err();
            assert!(err.contains(reason), "{sdp:?}: {err:?}, not {reason:?}");
        }
        let answer = serde_json::json!({"type": "answer", "sdp": "v=0\r\n"}).to_string();
        let err = browser_message(&answer).unwrap_err();
        assert!(
            err.starts_with("malformed signalling message: the SDP has 0 media"),
            "{err}"
        );
    }

    #[test]
    fn candidates_off_the_grammar_are_refused_with_the_field() {
        let good = "candidate:1 1 udp 2122252543 198.51.100.2 49761 typ host";
        let cases = [
            ("", "does not start with candidate:"),
            ("a=candidate:1 1 udp 1 198.51.100.2 1 typ host", "does not start"),
            ("candidate:1 1 udp 1 198.51.100.2 1 typ", "fewer than 8 fields"),
            ("candidate: 1 udp 1 198.51.100.2 1 typ host", "foundation"),
            ("candidate:a-b 1 udp 1 198.51.100.2 1 typ host", "foundation"),
            ("candidate:1 0 udp 1 198.51.100.2 1 typ host", "component"),
            ("candidate:1 123456 udp 1 198.51.100.2 1 typ host", "component"),
            ("candidate:1 1 u\u{1}p 1 198.51.100.2 1 typ host", "transport"),
            ("candidate:1 1 udp 4294967296 198.51.100.2 1 typ host", "priority"),
            ("candidate:1 1 udp -1 198.51.100.2 1 typ host", "priority"),
            ("candidate:1 1 udp 1 198.51.100.2/24 1 typ host", "address"),
            ("candidate:1 1 udp 1 198.51.100.2 65536 typ host", "port"),
            ("candidate:1 1 udp 1 198.51.100.2 1 type host", "type"),
            ("candidate:1 1 udp 1 198.51.100.2 1 typ local", "type"),
            ("candidate:1  1 udp 1 198.51.100.2 1 typ host", "component"),
            ("candidate:1 1 udp 1 198.51.100.2 1 typ host generation", "pairs"),
            (
                "candidate:1 1 udp 1 198.51.100.2 1 typ srflx raddr x_y rport 1",
                "raddr",
            ),
            (
                "candidate:1 1 udp 1 198.51.100.2 1 typ srflx raddr 10.0.0.1 rport 70000",
                "rport",
            ),
            (
                "candidate:1 1 udp 1 198.51.100.2 1 typ host name\tvalue x",
                "extension",
            ),
        ];
        for (candidate, reason) in cases {
            let err = check_ice_candidate(candidate).unwrap_err();
            assert!(err.contains(reason), "{candidate:?}: {err:?}, not {reason:?}");
        }
        let long = format!("{good} {}", "x y ".repeat(MAX_CANDIDATE_BYTES / 4).trim_end());
        assert!(check_ice_candidate(&long).unwrap_err().contains("over 512 bytes"));
        let ice = format!(r#"{{"type":"ice","candidate":"{good}","sdpMLineIndex":1}}"#);
        let err = browser_message(&ice).unwrap_err();
        assert!(err.contains("sdpMLineIndex 1"), "{err}");
    }

    #[test]
    fn a_join_may_carry_a_token() {
        assert!(matches!(
            browser_message(r#"{"type":"join"}"#),
            Ok(FromBrowser::Join { token: None })
        ));
        let join = browser_message(r#"{"type":"join","token":"s.1.ab"}"#).unwrap();
        assert!(matches!(join, FromBrowser::Join { token: Some(token) } if token == "s.1.ab"));
        assert!(browser_message(r#"{"type":"join","token":7}"#).is_err());
        assert!(browser_message(r#"{"type":"join","secret":"x"}"#).is_err());
    }

    #[test]
    fn a_message_is_read_before_what_it_carries_is_checked() {
        // An answer with no media section: its type is read, its SDP refused only by the check.
        let answer = r#"{"type":"answer","sdp":"v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"}"#;
        let message = read_browser_message(answer).unwrap();
        assert!(matches!(message, FromBrowser::Answer { .. }));
        let err = message.check().unwrap_err();
        assert_eq!(
            err,
            "malformed signalling message: the SDP has 0 media sections, the offer 1"
        );
        assert_eq!(browser_message(answer).unwrap_err(), err);
        let ice = r#"{"type":"ice","candidate":"candidate:x","sdpMLineIndex":0}"#;
        assert!(matches!(read_browser_message(ice), Ok(FromBrowser::Ice { .. })));
        assert!(browser_message(ice).is_err());
        // What cannot be read is refused at once, as before.
        assert!(
            read_browser_message(r#"{"type":"shout"}"#)
                .unwrap_err()
                .contains("unknown variant")
        );
    }

    /// Codes as a sender writes them: little-endian int16s.
    fn bytes(codes: &[i16]) -> Vec<u8> {
        codes.iter().flat_map(|code| code.to_le_bytes()).collect()
    }

    #[test]
    fn frames_are_taken_whole_with_every_code_inside_its_codebook() {
        let layout = FrameLayout {
            codebooks: 3,
            codebook_size: 2048,
        };
        assert_eq!(layout.frame_bytes(), 6);
        assert_eq!(layout.check(&bytes(&[0, 1, 2])), Ok(1));
        // 2047 is the last code; 258 is two different bytes, read in their order.
        assert_eq!(layout.check(&bytes(&[0, 2047, 258, 5, 6, 7])), Ok(2));
        let not_whole = |bytes| FrameError::NotWholeFrames {
            bytes,
            frame_bytes: 6,
            codebooks: 3,
        };
        assert_eq!(layout.check(&[]), Err(not_whole(0)));
        assert_eq!(layout.check(&bytes(&[0, 1, 2, 3])), Err(not_whole(8)));
        assert_eq!(layout.check(&bytes(&[0, 1, 2])[..5]), Err(not_whole(5)));
        let outside = |frame, codebook, code| FrameError::OutsideCodebook {
            frame,
            codebook,
            code,
            codebook_size: 2048,
        };
        // The first code outside is named by its frame and codebook.
        assert_eq!(
            layout.check(&bytes(&[0, 1, 2, 3, 4, 2048])),
            Err(outside(1, 2, 2048))
        );
        assert_eq!(
            layout.check(&bytes(&[0, -1, 2, 3, 4, 9999])),
            Err(outside(0, 1, -1))
        );
        assert_eq!(
            layout.check(&bytes(&[7, 8, 9, 2049, 1, 2])),
            Err(outside(1, 0, 2049))
        );
        assert_eq!(
            outside(1, 2, 2048).to_string(),
            "frame 1, codebook 2: code 2048 is outside 0..2048"
        );
        assert_eq!(
            not_whole(5).to_string(),
            "not whole frames: 5 bytes, a frame is 6 (3 codes of 2 bytes)"
        );
    }

    #[test]
    fn a_sender_says_end_or_cancel_and_nothing_else() {
        assert!(matches!(
            sender_message(r#"{"type":"end"}"#),
            Ok(FromSender::End {})
        ));
        assert!(matches!(
            sender_message(r#"{"type":"cancel"}"#),
            Ok(FromSender::Cancel {})
        ));
        for text in [r#"{"type":"stop"}"#, r#"{"type":"end","now":true}"#, "end", ""] {
            let err = sender_message(text).unwrap_err();
            assert!(err.starts_with("malformed message: "), "{text:?}: {err}");
        }
    }

    /// Each length bound takes its last length and refuses one more.
    #[test]
    fn each_bound_takes_its_last_length_and_refuses_one_more() {
        let candidate = |foundation: &str, transport: &str, address: &str| {
            format!("candidate:{foundation} 12345 {transport} 4294967295 {address} 65535 typ host")
        };
        let good = candidate("1", "udp", "198.51.100.2");
        assert_eq!(check_ice_candidate(&good), Ok(()));
        // A foundation's `+` and `/` (RFC 8839's ice-char), a transport token's `-` and `_`.
        assert_eq!(check_ice_candidate(&candidate("a+b/1", "x-udp_1", "h")), Ok(()));
        let cases = [
            (
                candidate(&"f".repeat(32), "udp", "h"),
                candidate(&"f".repeat(33), "udp", "h"),
                "foundation",
            ),
            (
                candidate("1", &"t".repeat(16), "h"),
                candidate("1", &"t".repeat(17), "h"),
                "transport",
            ),
            (
                candidate("1", "udp", &"h".repeat(253)),
                candidate("1", "udp", &"h".repeat(254)),
                "address",
            ),
        ];
        for (last, over, field) in cases {
            assert_eq!(check_ice_candidate(&last), Ok(()), "{last}");
            assert!(check_ice_candidate(&over).unwrap_err().contains(field), "{over}");
        }
        // A candidate of exactly MAX_CANDIDATE_BYTES: one extension pair fills it.
        let filler = MAX_CANDIDATE_BYTES - good.len() - " n ".len();
        let longest = format!("{good} n {}", "v".repeat(filler));
        assert_eq!(longest.len(), MAX_CANDIDATE_BYTES);
        assert_eq!(check_ice_candidate(&longest), Ok(()));
        let over = format!("{longest}v");
        assert!(check_ice_candidate(&over).unwrap_err().contains("over 512 bytes"));
        // The shortest line is a type and its `=`: what an empty value means is webrtcbin's to judge.
        assert_eq!(check_answer_sdp(&ANSWER.replace("s=-", "s=")), Ok(()));
        assert!(
            check_answer_sdp(&ANSWER.replace("s=-", "s"))
                .unwrap_err()
                .contains("line 3 is not x=value")
        );
        // An answer of exactly MAX_SDP_BYTES: one attribute line fills it.
        let filler = MAX_SDP_BYTES - ANSWER.len() - "a=\r\n".len();
        let longest = format!("{ANSWER}a={}\r\n", "x".repeat(filler));
        assert_eq!(longest.len(), MAX_SDP_BYTES);
        assert_eq!(check_answer_sdp(&longest), Ok(()));
        let over = format!("{ANSWER}a={}\r\n", "x".repeat(filler + 1));
        assert!(check_answer_sdp(&over).unwrap_err().contains("over 32768 bytes"));
    }
}
