//! A listener on another host than the server: Chromium in the test's namespace, the server (and
//! coturn) in a second one across a link (`network`). The page is opened by the server's
//! address on the link, the sender connects there too, and the ICE candidates are the server's
//! real interface's, not loopback's.

use serde_json::Value;

use super::network::{
    self, LISTENER_ADDRESS, SERVER_ADDRESS, ServerHost, TURN_PASSWORD, TURN_PORT, TURN_USERNAME,
};
use super::server::{self, Server};
use super::webdriver::{self, Browser};
use super::{Speech, assert_heard, connect_page, speak_and_end};

/// Frames of speech each test sends: 3.2 s.
const FRAMES: usize = 40;

/// The candidate pair the page's peer connection chose: its local and remote candidates' type
/// (`host`, `srflx`, `prflx`, `relay`), address and protocol.
fn selected_pair(browser: &Browser) -> Value {
    browser.run(
        "const stats = await speech.pc.getStats();
         const byId = {};
         stats.forEach((report) => { byId[report.id] = report; });
         let pair = null;
         stats.forEach((report) => {
           if (report.type === 'transport' && report.selectedCandidatePairId) {
             pair = byId[report.selectedCandidatePairId];
           }
         });
         if (!pair) return null;
         const describe = (candidate) => ({type: candidate.candidateType, address: candidate.address,
           protocol: candidate.protocol, relayProtocol: candidate.relayProtocol || null});
         return {local: describe(byId[pair.localCandidateId]),
                 remote: describe(byId[pair.remoteCandidateId])};",
    )
}

/// Opens the page on the server across the link, speaks `FRAMES` frames into its session and
/// asserts they were heard in full; the candidate pair the page chose.
fn hear_across_the_link(server: &Server) -> Value {
    assert!(
        webdriver::installed(),
        "chromium and chromium-driver are missing: run tools/setup.sh"
    );
    assert!(
        server.address.starts_with(SERVER_ADDRESS),
        "the server listens on {}",
        server.address
    );
    let speech = Speech::load();
    let browser = Browser::start();
    let session = connect_page(&browser, server, &speech);
    let mut sender = server.sender(&session);
    let (before, first_sent, after) = speak_and_end(&browser, &mut sender, &speech, FRAMES);
    assert_heard("across the link", &speech, &before, &after, first_sent, FRAMES);
    assert_eq!(server.status(), (1, 1), "sessions and pipelines");
    let pair = selected_pair(&browser);
    println!("the page's selected candidate pair: {pair}");
    pair
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_listener_on_another_host_hears_its_speech_directly() {
    if !server::in_own_network("remote::a_listener_on_another_host_hears_its_speech_directly") {
        return;
    }
    let host = ServerHost::start();
    // No ICE option: the server gathers on every interface but loopback, its link's here.
    let server = Server::start_on(&host, &["--chunk-frames", "1"]);
    let pair = hear_across_the_link(&server);
    assert_eq!(pair["remote"]["type"], "host", "{pair}");
    assert_eq!(pair["remote"]["address"], SERVER_ADDRESS, "{pair}");
    assert_eq!(pair["remote"]["protocol"], "udp", "{pair}");
    assert_eq!(pair["local"]["address"], LISTENER_ADDRESS, "{pair}");
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_listener_behind_a_firewall_hears_its_speech_through_turn() {
    if !server::in_own_network("remote::a_listener_behind_a_firewall_hears_its_speech_through_turn") {
        return;
    }
    let host = ServerHost::start();
    let scratch = tempfile::tempdir().unwrap();
    let _turn = host.start_turn(scratch.path());
    let credentials = scratch.path().join("turn-credentials");
    std::fs::write(&credentials, format!("{TURN_USERNAME}:{TURN_PASSWORD}\n")).unwrap();
    let turn_url = format!("turn://{SERVER_ADDRESS}:{TURN_PORT}?transport=tcp");
    let server = Server::start_on(
        &host,
        &[
            "--chunk-frames",
            "1",
            "--turn",
            &turn_url,
            "--turn-credentials",
            credentials.to_str().unwrap(),
        ],
    );
    let port: u16 = server.address.rsplit_once(':').unwrap().1.parse().unwrap();
    network::block_all_but_tcp_to(&[port, TURN_PORT]);
    let pair = hear_across_the_link(&server);
    assert_eq!(pair["local"]["type"], "relay", "{pair}");
    assert_eq!(pair["local"]["relayProtocol"], "tcp", "{pair}");
}
